// Package crash holds quiver's crash-safety acceptance test: it runs the real
// `quiver server` binary over one pool directory, SIGKILLs it at hundreds of
// points during a mix of create, snapshot, clone, rollback and delete calls,
// and after every restart checks through the API and the files that every
// acknowledged operation is fully present, that nothing half-made is visible
// and that leftover files were reclaimed.
//
// The test keeps a model of the pool, changed only by operations the server
// acknowledged. An operation the kill interrupted may or may not have
// happened, volume by volume: after the restart each volume must be in its
// model state or in the state that operation gives it, and what is found
// becomes the model. Two workers own disjoint volumes, so their operations
// commute. Between a kill and the restart the test writes stamps into disk
// images no interrupted operation touched, as VMs would write data, so that
// snapshots, clones and rollbacks are checked for carrying the right data,
// whole, and recovery for keeping it. Kills come at random times, at a random
// point of an operation of a chosen kind, as soon as the pool directory
// shows a chosen state (a rollback record, work in staging, a temporary
// file), and during start-up recovery. TestKilledFirstStart kills the very
// first start of fresh pools.
//
// Run it with `go test ./test/crash/`; with -race the server is built with
// the race detector too. Knobs:
//
//	QUIVER_CRASH_CYCLES  kill/restart cycles (default 200, 20 with -short);
//	                     also the flag -crash.cycles
//	QUIVER_CRASH_SEED    seed of the random workload, to reproduce a run
//	                     (kill timing still varies)
//	QUIVER_CRASH_FS      pool filesystem: empty for the test's temporary
//	                     directory, or xfs, btrfs, ext4, tmpfs (needs root)
//
// The package is test-only. It uses only what an operator has: the binary,
// the HTTP API (internal/client and the wire types of internal/api) and the
// files of the pool directory; it must not call into internal/pool or
// internal/server.
package crash
