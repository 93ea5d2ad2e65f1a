// Package migration is the end-to-end live-migration test of quiver (issue
// 4): a real Linux guest under QEMU writes to both disks of one quiver
// volume over NBD while QEMU migrates it to another QEMU, and the disks read
// back afterwards must hold every write of both sides, intact and in order.
//
// Run it with
//
//	go test -v -run Migration ./test/migration/
//
// It needs qemu-system-x86_64 (Debian: qemu-system-x86), qemu-img and
// qemu-io (qemu-utils), busybox-static, apt-get and dpkg with a current
// package index (apt-get update), and Go; the initramfs writer's own test
// needs cpio. Without them the tests skip, except when CI is set: there
// they fail.
//
// # The guest
//
// The guest is built by internal/testguest, which test/powercut shares.
// The kernel is Debian's: the package linux-image-amd64 depends on (the
// current kernel) is fetched with `apt-get download` and unpacked with
// `dpkg -x`, nothing installed. Its config must build in the initramfs,
// devtmpfs and the serial console; the modules for virtio-blk over
// virtio-pci and their dependencies are found from each module's .modinfo
// (Debian's package ships no modules.dep) and loaded dependencies first.
// vmlinuz and those modules are cached under $QUIVER_TEST_CACHE, else
// $XDG_CACHE_HOME/quiver-test (~/.cache/quiver-test), so later runs skip the
// download.
//
// The initramfs is a newc cpio archive written by testguest: busybox-static
// with a symlink per applet, /dev/console, the modules, the guest writer
// (./guestwriter, built with CGO_ENABLED=0) and an /init script that loads
// the modules and runs the writer. The writer opens /dev/vda and /dev/vdb
// with O_DIRECT|O_SYNC and writes record i (package record: sequence number,
// disk number, filler, CRC-32C) at offset i*4096 of vda, then of vdb, for
// i = 0, 1, 2, ..., printing its progress to the serial console.
//
// # The tests
//
// Each test starts `quiver server` (built with the race detector when the
// tests run with -race) on a temporary pool, NBD on a unix socket with
// --nbd-require-token, and creates volume "vm" with disks vda and vdb of
// 64 MiB. Every NBD client presents an attachment token in the export name
// (<volume>/<disk>/<token>): the source QEMU that of an rw attachment for
// node "src", each destination one of its own, and the final read-back an
// ro attachment. QEMU runs under TCG (nested KVM cannot boot Linux on CI's
// machines) with 128 MiB of RAM, each disk a virtio-blk-pci device on
// QEMU's NBD client, QMP on a unix socket (internal/testguest's small client)
// and the console in a file.
//
// TestLiveMigration boots the source, lets the guest write, attaches the
// destination node and starts its QEMU with -incoming defer (it connects to
// both disks at once, and must not become the writer by doing so), then
// migrates through QMP (migrate, query-migrate until completed), logging
// QMP's total time and downtime. Once the destination has written, the
// volume's writer epoch must have grown by one, the destination's
// attachment be the writer and the source's be fenced: qemu-io writes
// through the source's token, over a record and over a never-written slot,
// must fail with EPERM while the source QEMU still has its connections
// open. The source quits (its last FLUSH must succeed), is detached (its
// token then opens nothing), and the guest writes on the destination for a
// few seconds before the destination is stopped and quit. Both disks are
// read back over NBD (qemu-img convert) and must hold records 0..n-1 and
// nothing after, where n is the sum of the writes the two QEMUs report
// (query-blockstats), and both sides must have written; the slots qemu-io
// tried to overwrite are thereby found unchanged.
//
// TestMigrationCancelled starts a bandwidth-limited migration of the
// writing guest and cancels it (migrate_cancel) while it is active, then
// another whose destination QEMU is killed. Each destination connects with
// its own attachment and never becomes the writer. After each, the source
// must go on writing as the writer of the same epoch: VM running, no
// io-status error, no failed request, no I/O error on the guest console;
// its disks must hold every record it wrote.
//
// The destination starts paused (-S): once the migration has completed,
// compareRAM saves the guest RAM of the stopped source and of the paused
// destination (QMP pmemsave) and they must be equal, page for page, before
// the destination runs. The guest has 128 MiB and 8 KiB of RAM: QEMU 7.2
// under TCG loses guest stores when it migrates a RAM block whose size is a
// multiple of 256 KiB, and the destination guest then crashed now and then
// (docs/live-migration.md, "Guest crashes after migration"). The test runs
// once; a crash, a difference in RAM or anything else fails it.
//
// TestMigrationPingPong, skipped unless QUIVER_MIGRATION_PINGPONG=N is set,
// boots one guest and migrates it N times in all to fresh QEMUs, against
// the NBD server QUIVER_MIGRATION_BACKEND names (quiver with attachment
// tokens, quiver-tokenless, nbdkit-file, nbdkit-memory, qemu-nbd), watches
// each destination's console for a kernel crash and its disks for writes,
// optionally compares the RAM of both sides (QUIVER_MIGRATION_MEMCHECK=1)
// and records QEMU trace events (QUIVER_MIGRATION_TRACE, with
// QUIVER_MIGRATION_KEEP), and checks the records at the end of each boot.
// QUIVER_MIGRATION_MEM, QUIVER_MIGRATION_MACHINE and
// QUIVER_MIGRATION_TCG_THREAD change QEMU's -m, -machine and TCG threading
// to reproduce other setups.
//
// On failure the tests log the tail of each guest console, QEMU's stderr,
// the QMP events and quiver's log. Every process is started by the test,
// ended by its PID, and dies with the test binary (Pdeathsig).
//
// The package is test-only: it reaches the server through internal/client
// and NBD and must not import the server side.
package migration
