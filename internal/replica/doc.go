// Package replica is the synchronous write path of a replicated volume
// (docs/cluster.md, "Synchronous write path"): Disk wraps the primary's own
// disk handle and sends every WRITE, TRIM, WRITE_ZEROES and FLUSH to each
// in-sync copy as well, over NBD to the copy node's server (client.go), and
// answers only when the local disk and every in-sync copy answered. A copy
// that fails leaves the in-sync set only through the caller's OutOfSync,
// which must record it (an etcd transaction at the primary's term) before
// the request can be acknowledged; from then on the disk marks every granule
// it changes (Dirty) for a later resync.
//
// It imports pool for the disk interface only; it knows nothing of etcd or
// of the NBD server.
//
// Imports from quiver: pool.
package replica
