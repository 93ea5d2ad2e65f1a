// Package nbd is quiver's NBD server: the data path through which QEMU,
// libnbd clients and the Linux kernel read and write the disks of a volume
// over TCP or a unix socket. It follows the NBD protocol specification
// (NetworkBlockDevice/nbd, doc/proto.md): fixed newstyle negotiation,
// structured replies, the base:allocation metadata context, and many
// requests in flight per connection with replies in any order. Clients may
// upgrade to TLS with NBD_OPT_STARTTLS, or must (Config.RequireTLS); a TLS
// connection is served through its tls.Conn (tls.go), a plain one from a
// blocking socket with raw sendmsg (socket.go).
//
// Each request is validated in full, then executed, then answered (the
// shape of nbdkit's server/protocol.c): the reader validates it once as it
// reads it (validate), and one function executes and answers it (exec,
// commands.go), whichever goroutine runs it; schedule.go decides only
// where that is (the reader, the write executor or a worker). A disk served
// elsewhere that starts requests (pool.Starter) has its READs and WRITEs
// started by the reader and answered where they end (started.go). All I/O goes
// through pool.Disk handles, and so through the volume's I/O gate. Domain errors are mapped
// to NBD error numbers in one table (errors.go).
//
// What clients can hold is bounded (docs/security.md): connections in
// total, per peer and in negotiation (server.go, with internal/connlimit),
// and READ and WRITE bytes in flight per connection, per peer and per
// server, enforced by making the reader stop reading (memory.go).
//
// nbd imports pool (the domain), metrics (which wraps each disk handle to
// count and throttle its requests) and connlimit, and nothing above them.
//
// Imports from quiver: connlimit, metrics, pool.
package nbd
