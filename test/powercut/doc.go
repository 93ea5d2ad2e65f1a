// Package powercut proves that what quiver acknowledges survives a power
// cut of the whole machine, page cache and disk cache included (issue 12,
// item 4). Every other crash test kills the server with SIGKILL, which
// leaves the page cache alive; here the kernel dies too.
//
// Run it with
//
//	go test -v -run PowerCut ./test/powercut/
//
// Knobs: QUIVER_POWERCUT_CUTS (power cuts in all, default 100),
// QUIVER_POWERCUT_LANES (guests at once, each with its own pool, default 2),
// QUIVER_POWERCUT_WINDOW (the longest workload before a cut, in ms, default
// 2000), QUIVER_POWERCUT_OPS (percent of the workload's steps that are
// pool operations rather than write bursts, default 30),
// QUIVER_POWERCUT_SEED (reproduces a run's workloads; the timing of the
// cuts is the machine's), QUIVER_POWERCUT_FSCK=1 (checks the pool disk's
// XFS on the host after every cut: log recovery on a copy, then
// xfs_repair -n) and QUIVER_POWERCUT_KEEP (a directory where a failed lane
// leaves its pool disk). It needs qemu-system-x86_64, mkfs.xfs,
// busybox-static, apt-get and dpkg with a current package index, and Go;
// without them it skips, except when CI is set: there it fails.
//
// # The machine
//
// quiver runs inside a Linux guest under QEMU (TCG), built by
// internal/testguest: Debian's cloud kernel with virtio-pci, virtio-blk,
// virtio-net and xfs, and an initramfs of busybox, a static quiver
// (CGO_ENABLED=0) and an /init that brings up the network (QEMU's user
// networking, the API and NBD ports forwarded from loopback ports of the
// host), mounts the pool disk's XFS at /mnt/disk and runs `quiver server
// --pool /mnt/disk/pool --key-file /mnt/disk/keys.json --listen
// 0.0.0.0:7480 --nbd-listen 0.0.0.0:10809 --token-file ...`: the key file
// of the encrypted volumes' KEKs lives on the pool disk, outside the pool
// (the server refuses it inside), and lives through the cuts as the pool
// does. Beyond loopback NBD needs attachment tokens, so every
// export the test opens is <volume>/<disk>/<token>. The guest writes dirty
// pages back within 0.1 s, so the disk's cache, not only the guest's
// page cache, holds unflushed data at the cut.
//
// The pool disk is an XFS image made by mkfs.xfs on the host, served to
// QEMU over NBD (a unix socket) by quiver's own NBD server (internal/nbd)
// with a test disk behind it, cacheDisk: a disk with a volatile write
// cache. Writes land in the cache; FLUSH writes the cache to the medium (a
// file on the host); a FUA write goes to the medium before its reply; a
// power cut drops the cache, after writing a random subset of its 4 KiB
// blocks to the medium (none, all, or each with a random probability), as
// a drive may have destaged some of them. QEMU gives the guest a
// virtio-blk disk with a write cache (write-cache=on, 4 KiB blocks), so the
// guest kernel sends FLUSH for every fsync; /init prints the disk's
// write_cache mode. TestCacheDiskLosesWhatWasNotFlushed proves the cache's
// rules through NBD.
//
// # The test
//
// TestPowerCut runs lanes in parallel, each a sequence of cycles on its own
// pool disk: boot, check, work, cut. The host's client (a small NBD client
// of the test's own, one request at a time, and internal/client for the
// API) writes stamped 4 KiB blocks to the volumes' disks, one in sixteen
// with FUA, a third of the bursts followed by a FLUSH, and runs volume create and
// delete (detaching first), snapshot create and delete (and a snapshot
// after a write burst to a volume without one and after one other burst
// in 24, the older of two deleted first, as a backup schedule takes
// checkpoints), clones of snapshots and of live volumes, disk add and
// attach, recording what was
// acknowledged (model_test.go). Half of the volumes it creates are
// encrypted (their clones too), with disks of 1 MiB, four steps of a deep
// rekey (plain volumes' disks are of 256 KiB); two pool operations in
// eleven start a deep rekey of an encrypted volume (its snapshots deleted
// first, which a deep rekey requires) at 512 KiB/s to 4 MiB/s, so that it
// often runs at the cut while write bursts go to it, or start again one
// that a cut interrupted (three in four of those start again as the next
// workload starts); one in eleven is a shallow rekey (rekey_test.go).
// While a deep rekey may be in progress quiver refuses snapshots, clones
// and disk changes of the volume with 409 Busy, and the workload takes that
// as an operation that did not happen. After a random time the power is cut: the
// disk's cache is dropped, then QEMU is killed with SIGKILL and reaped (in
// that order: quiver's NBD server flushes an export whose client leaves
// with unflushed writes, so QEMU's death would save the cache). The next
// boot mounts the XFS (log recovery), starts quiver (the pool must
// open) and checks: every volume, disk, snapshot and attachment of a
// completed operation is there and whole; the operation in flight may be
// there or not, but whole if it is; every block of a live disk holds its
// last durable write or a later one; every snapshot and clone holds
// exactly what its source held when it was taken; every snapshot is a
// change-tracking checkpoint, and the delta from it to the live disks (and
// to each other snapshot of the volume) must cover every block that differs
// between the two, as read back after the boot (delta_test.go). A rekey
// changes no content: an encrypted volume found in a deep rekey after the
// boot (one the workload started) has blocks under the old data key and
// blocks under the new one, and reading every block back as the model says
// is "every block readable with the right key" (issue 35, acceptance 3).
// The lanes count the cuts that landed in a deep rekey; a run of at least
// 20 cuts with none fails, as it no longer covers them. Each
// acknowledged FLUSH after plain writes must have sent a FLUSH to the pool
// disk.
//
// The package is test-only. It talks to quiver as its users do (the API
// and NBD over the guest's network) and imports internal/nbd only for the
// server that plays the pool's disk.
package powercut
