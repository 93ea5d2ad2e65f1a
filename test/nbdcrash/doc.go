// Package nbdcrash holds the acceptance tests of quiver's NBD data path
// against real clients and a real `quiver server` process:
//
//   - TestKillDuringWrites SIGKILLs the server again and again while qemu-io
//     and libnbd clients write with periodic FLUSH and with FUA, restarts it
//     and checks through NBD that every write the server acknowledged before
//     a completed FLUSH, and every acknowledged FUA write, is on disk.
//   - TestSnapshotsUnderNBDLoad takes whole-VM snapshots through the API
//     while libnbd clients write stamped blocks to three disks of one volume,
//     and proves with internal/consistency that each snapshot is a
//     consistent cut of the writes.
//
// Run them with `go test ./test/nbdcrash/`. Knobs:
//
//	QUIVER_NBDCRASH_CYCLES  kill/restart cycles of TestKillDuringWrites
//	                        (default 50, 10 with -short)
//	QUIVER_NBDCRASH_SEED    seed of the random workload, to reproduce a run
//
// Prerequisites: qemu-io (qemu-utils) and python3 with the libnbd module
// (python3-libnbd), which runs testdata/nbdpeer.py. A test that lacks one
// skips, or fails when CI is set.
//
// The package is test-only. It talks to the server as its users do (the
// HTTP API through internal/client, the disks through NBD clients) and must
// not import the server side (internal/server, internal/pool, internal/nbd).
package nbdcrash
