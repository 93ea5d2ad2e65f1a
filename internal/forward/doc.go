// Package forward is a disk handle that follows a replicated volume's
// primary: every request goes over NBD to the node that is the volume's
// primary now, and a request whose connection breaks (the primary died, was
// cut off, or stopped acknowledging when its lease ran short) is sent again
// on a new connection to the primary of the moment, until it is answered.
// This is how any cluster node serves any volume (docs/cluster.md,
// "Clients and failover").
//
// A Disk given a feed of the volume's primary changes (Options.Moves)
// leaves a primary as soon as another is named: the requests in flight on
// the old one are sent again to the new one at once, without waiting for
// their try to time out. A refusal of the export by the primary (a wrong
// token, an unknown disk) is final and is passed on as it came
// (nbd.Refused), so that a client gets the same refusal from every node.
//
// Reads and writes can also be started without waiting (pool.Starter): an
// NBD server then starts each on its reader, and the connection's reply
// reader answers it; one whose connection breaks goes on from a goroutine
// of its own exactly as above.
//
// WRITE, TRIM, WRITE_ZEROES and FLUSH are idempotent under the volume's
// single writer, so sending one again is safe: what the old primary
// acknowledged is on the new one, and what it did not acknowledge is written
// again.
//
// It imports pool (the Disk interface and its errors), nbd (ErrAbandon,
// and DomainError: the way back from an NBD error value, so that one table
// maps both ways) and nbdclient (the NBD client); it must not import the
// cluster or the server.
//
// Imports from quiver: nbd, nbdclient, pool.
package forward
