// Package shutdown crashes the pool's filesystem over and over with XFS's
// forced shutdown and checks the storage layer after each crash, on the
// host's kernel and inside a guest on Debian's kernel (the one
// test/powercut's pool runs on). probe (./probe) runs internal/pool
// directly with the power cut test's workload: small disks, stamped 4 KiB
// writes (some through RWF_NOWAIT, some with FUA), trims and zeroes,
// flushes, writebacks without a flush, snapshots, rollbacks, clones of
// snapshots and of live volumes, deletes, and the clone race (a live clone,
// the clone's writes written back, the source's writes flushed, a crash at
// once: the clone leak of docs/durability.md). At a random time, a
// third of the time a random time into a pool operation and a third of the
// time while a flush runs, it shuts XFS down without flushing its log
// (XFS_IOC_GOINGDOWN: what the log holds in memory is lost, what reached
// the device stays, as when a kernel dies), unmounts, mounts again (log
// recovery) and opens the pool. Then every volume and snapshot of a
// completed operation must be there, the one in flight whole or absent,
// and every block of every image, read with O_DIRECT from the device, must
// hold its last durable write or a later one written to that very block.
// Between crashes it checks every image exactly every few steps, so a
// write that lands in another volume's image (the leak the power cut test
// saw, docs/durability.md) is caught while the power is on.
//
// A crash costs a remount, not a boot: about 5 a second on the host and 1
// a second under TCG, against one per 20 to 40 s for a power cut. It found
// that XFS's fsync could return success when a shutdown landed during it
// (storage.confirmSynced), and with the clone race it finds the clone leak
// when the pool's guard against it (internal/pool/unshare.go) is off.
//
// Knobs: QUIVER_SHUTDOWN_SECONDS (how long each probe runs; default 40 on
// the host, 60 in the guest), QUIVER_SHUTDOWN_SEED and QUIVER_SHUTDOWN_KEEP
// (a directory where a failed guest run leaves its pool disk), and
// testguest's QUIVER_GUEST_KERNEL (another Debian kernel for the guest,
// such as linux-image-6.12.118+deb12-cloud-amd64). It needs root, XFS,
// losetup and mount (the host test), qemu-system-x86_64, mkfs.xfs and the
// guest kernel's packages (the guest test); without them it skips, except
// when CI is set: there it fails.
package shutdown
