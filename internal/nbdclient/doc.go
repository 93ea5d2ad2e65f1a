// Package nbdclient is the client side of the NBD protocol
// (NetworkBlockDevice/nbd doc/proto.md) that one quiver node speaks to
// another: a primary to its copies (replica) and any node to the primary of
// the moment (forward). It does fixed newstyle negotiation with NBD_OPT_GO
// and simple replies only (no structured replies are asked for, so a READ's
// data follows its reply header). Many requests may be in flight at once,
// from many goroutines; a reader goroutine matches replies to requests.
//
// Every request is bounded in time: a server that does not answer within
// the timeout is taken for gone, the connection is closed and every request
// on it fails with ErrLost. Callers map its errors (ErrLost, ErrHandshake,
// ErrRefused, Errno) to their own once, at their boundary.
//
// Imports from quiver: nothing.
package nbdclient
