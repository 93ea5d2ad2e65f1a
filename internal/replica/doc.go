// Package replica is the synchronous write path of a replicated volume
// (docs/cluster.md, "Synchronous write path" and "Degraded mode, ..."): a
// Set per disk on the primary sends every WRITE, TRIM, WRITE_ZEROES and
// FLUSH of the disk's handles (Disk) to each in-sync copy as well, over NBD
// to the copy node's server (client.go), and answers only when the local
// disk and every in-sync copy answered. A copy that fails leaves the
// in-sync set only through the caller's OutOfSync, which must record it
// (an etcd transaction at the primary's term) before the request can be
// acknowledged; from then on, until it is back in sync, every change is
// marked, before it is applied, in the copy's write-ahead dirty Bitmap (a
// file of the pool), during its resync too. Resync copies the dirty
// granules to a returning copy while I/O goes on and Rejoin puts it back in
// sync; Freeze holds the disk's I/O for a snapshot on every copy at one
// cut.
//
// It imports pool for the disk interface, storage and durable for the
// bitmap files; it knows nothing of etcd or of the NBD server.
//
// Imports from quiver: pool, storage, durable, nbdclient.
package replica
