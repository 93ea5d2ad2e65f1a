// Package csi is quiver's Container Storage Interface plugin: the identity,
// controller, snapshot metadata and node services that let Kubernetes (or any CSI orchestrator)
// provision quiver volumes as PersistentVolumes, one PVC per VM; and the
// csi-addons identity and replication services, through which a DR
// orchestrator (Ramen) drives quiver's DR relationships (docs/dr.md).
//
// A CSI volume is one quiver volume holding every disk of a VM. The
// controller service talks to a quiver server through internal/client only,
// so the same plugin serves the hosting cluster and tenant clusters that reach
// quiver over the network. The node service publishes a volume either as a
// directory of disk images (Filesystem mode, a bind mount of the volume's
// directory on a node that sees the pool) or as a real block device (Block
// mode: the primary disk over NBD through nbdfuse and a loop device).
//
// Errors are domain sentinels (errors.go) wrapped with the operation; they
// meet gRPC status codes in exactly one place, toStatus, applied by the
// server's interceptors to every RPC, unary and streaming.
//
// It may import internal/api, internal/client, internal/quantity and
// internal/durable; it must not import the pool, the API server or the NBD
// server: everything it knows of a volume it learns through the API. Only
// internal/cli imports it.
//
// Imports from quiver: api, blockdev, client, csiaddons/identity, csiaddons/replication, durable, endpoint, quantity, tlscert.
package csi
