// Package endpoint is the compute node's NBD endpoint (`quiver endpoint`):
// one long-lived process per compute node that serves the disks of the
// volumes published on the node, each volume on a unix socket of its own
// (<root>/volumes/<volume>/nbd.sock, its exports named by disk), and sends
// every request directly to the volume's primary of the moment with a
// forward.Disk. It finds the primary through the storage nodes' API (GET
// /v1/volumes/{volume}/primary: a compute node has no etcd access), asks
// again whenever a connection breaks and every PollInterval, and sends an
// unanswered request again to the new primary: WRITE, TRIM, WRITE_ZEROES and
// FLUSH are idempotent under the volume's single writer.
//
// The endpoint presents the attachment token the CSI driver got for this
// node (the publication's), so the single-writer rule and the fencing of a
// live migration's old side hold exactly as for any NBD client. The socket
// carries no secret: whoever can connect to it acts for that attachment,
// as whoever can open a Filesystem-mode PVC's disk.img can write it. The
// volume's directory is 0755 and the socket 0666 (QEMU runs as an
// unprivileged user in virt-launcher); the endpoint's root is 0700, so on
// the node only root reaches them, and in a pod only the PVC's mount does.
//
// What is durable when: the endpoint keeps nothing. A request is answered
// only once the primary answered it, with the primary's guarantees (a write
// is on every in-sync copy; durable after a FLUSH or with FUA). A
// publication (the volume, its export, its token and disks) is written
// atomically to <root>/state/<volume>.json before it is answered, so an
// endpoint that restarts serves the same sockets again at once: QEMU with
// reconnect-delay rides through the restart.
//
// The endpoint also does the device agent's job (blockdev.Agent, served on
// the same control socket): the nbdfuse processes and loop devices of
// Block-mode volumes are its children, connected to its own sockets, and
// outlive the CSI node plugin.
//
// Imports from quiver: api, blockdev, client, durable, forward, nbd, pool.
package endpoint
