// Package replicated is the replicated volume on a cluster node
// (docs/cluster.md): the primary's side (every read-write disk handle writes
// through its disk's replication Set; lease fencing; resync and rebuild of
// the copies out of sync; changes at the cut: snapshots, rollback, disk
// changes, clones, each under an intent; the hand-over of a drain) and the
// copy's side (replication sessions of its primary; the operations the
// primary sends it through etcd, as the pool as the cluster sees it, Store).
// Any other node's clients are forwarded to the primary of the moment.
//
// It is domain code: it knows the cluster's state (cluster), the pool, the
// replication protocol (replica) and the NBD export interface it serves
// (nbd.Exports), never the HTTP API or the process's wiring (server).
//
// Imports from quiver: api, cluster, forward, job, nbd, pool, replica.
package replicated
