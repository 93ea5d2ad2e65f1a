// Package enospc is the full-pool acceptance test of quiver (issue 12): a
// QEMU guest whose quiver disk's pool fills up pauses, and resumes once
// space is freed, on XFS and on ext4; and a server restarted on a full
// pool serves it.
//
// TestGuestPausesOnFullPool mounts a small filesystem (testfs: XFS and
// ext4 subtests), runs `quiver server` on a pool there with NBD on a unix
// socket, and creates volume "vm" with a 64 MiB disk and volume "filler"
// whose disk is allocated (fallocate) until about 8 MiB stay free. A guest
// (internal/testguest, under TCG) has vm/vda as a virtio-blk-pci device on
// QEMU's NBD client with werror=enospc,rerror=report; its /init writes 24
// MiB with O_DIRECT from 512 KiB on (so on XFS each write straddles two of
// quiver's 1 MiB chunks and runs the chunk rewrite), MiB i filled with the
// byte i+1, syncs and prints a marker. The test watches QMP: a BLOCK_IO_ERROR with nospace=true and
// action "stop", then STOP, run state io-error and the disk's io-status
// nospace; the server must still answer and have logged the ENOSPC at
// warn. It deletes the filler through the API, waits until the
// filesystem shows the space (XFS frees a deleted file's blocks in the
// background) and sends cont; the guest must finish without seeing an error
// or another BLOCK_IO_ERROR, and after QEMU quits qemu-io reads
// every MiB back through quiver's NBD with its pattern.
//
// TestServerRestartsOnFullPool fills a small XFS to the last block (no file
// can be made) under a pool whose disk holds 8 MiB written over NBD, and
// restarts the server: it must start (its capability probe cannot run: the
// pool opens with caps.json), serve the disk to qemu-io, take an overwrite
// of written data and refuse a write into unallocated space with ENOSPC.
//
// Run it with `go test ./test/enospc/` (as root: loop mounts). It needs
// mkfs.xfs, mkfs.ext4, qemu-system-x86_64, qemu-io, busybox-static, and
// apt-get and dpkg for Debian's kernel (cached as for test/migration);
// without them it skips, or fails when CI is set.
//
// The package is test-only: it reaches the server through internal/client
// and NBD and must not import the server side.
package enospc
