// Package cluster makes a storage node a member of a quiver cluster whose
// state lives in etcd (docs/cluster.md): it starts an embedded etcd member or
// connects to external ones, checks the cluster's name and token and the
// node's identity before the node serves, keeps the node's record alive with
// an etcd lease, places volumes on distinct nodes and makes the copies this
// node is given in its own pool (through Store, which the server implements
// over the pool).
//
// Node is the shared core (the etcd client, the config, the session and its
// lease, the keys, the logger) and the membership: Join, Close, the alive/
// and members/ keys, the drained/ marks. Each other family of etcd keys is a
// small type holding the node, which its callers name: Node.Volumes (the
// volumes/ records, with the tenants' use and snapshot charges written in
// the same Txn), Node.Primaries (primary/<volume>: election, primacy,
// hand-over, the attachments a primary publishes), Node.Copies
// (copies/<volume>/<node>: copy states, and this node's own copies) and
// Node.Ops (ops/, opresults/ and intents/).
//
// Every change to cluster state is one etcd transaction; leases come from
// the etcd client's concurrency package. There is no consensus of quiver's
// own, and etcd never sees a data byte.
//
// It imports the wire types (the volume spec it records), durable (the
// node's identity file), tlscert (its etcd client's TLS) and the etcd client
// and server; the transports
// (apiserver) and the server wiring import it, and the domain below (pool)
// never does.
//
// Imports from quiver: api, durable, storage, tlscert.
package cluster
