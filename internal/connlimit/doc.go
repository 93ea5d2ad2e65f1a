// Package connlimit bounds the connections a server holds, in total and per
// peer, and keeps an accept loop alive when the process runs out of file
// descriptors (it backs off instead of returning). The API server wraps its
// listener in a Listener; the NBD server calls a Limiter from its own accept
// loop.
//
// It imports only the standard library and x/sys; the transports (nbd,
// apiserver wiring in server) import it.
//
// Imports from quiver: nothing.
package connlimit
