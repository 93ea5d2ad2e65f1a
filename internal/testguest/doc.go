// Package testguest builds small Linux guests for tests that boot a real
// kernel under QEMU (test/migration, test/powercut, test/enospc and
// others): Debian's kernel with just the modules a test names, and an
// initramfs of busybox-static, those modules, the test's own files and its
// /init.
//
// The kernel is Debian's: the package linux-image-amd64 depends on (the
// current kernel) is fetched with `apt-get download` and unpacked with
// `dpkg -x`, nothing installed. The modules a test asks for and their
// dependencies are found from each module's .modinfo (Debian's package
// ships no modules.dep) and listed dependencies first. vmlinuz and those
// modules are cached under $QUIVER_TEST_CACHE, else
// $XDG_CACHE_HOME/quiver-test (~/.cache/quiver-test), one directory per
// kernel package and module set, so later runs skip the download.
// QUIVER_GUEST_KERNEL names another kernel package to boot instead (for a
// run on a newer kernel, such as Debian 12's linux-image-6.12.*-amd64).
//
// The initramfs is a newc cpio archive written here (CPIOWriter).
// A missing prerequisite (apt-get, dpkg, a package index, busybox-static)
// is reported wrapped in ErrMissing, so that a test can skip locally and
// fail under CI (testfs.SkipOrFail).
//
// Build takes more files for the initramfs (GoProgram builds a Go program
// of this module for the guest, such as test/migration's guest writer),
// QEMUArgs are the QEMU arguments every test guest boots with (Machine
// changes its machine, accelerator, CPU, memory or kernel parameters and
// adds a QMP socket), VM is the running QEMU (reaped, killed with the test
// binary, its console waited on, ended through QMP: Quit checks that it
// ends well, Shutdown ends it whatever its state), and QMP is a small
// client of QEMU's machine protocol on a unix socket, with the queries of
// run state and disks the tests read (Status, IOStatus, BlockStats). Context and ShortDir are a guest test's context (ended before
// the test binary's -timeout) and its directory for unix sockets.
//
// testguest is for tests only and imports no other quiver package.
//
// Imports from quiver: nothing.
package testguest
