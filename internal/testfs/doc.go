// Package testfs gives tests real filesystems: it formats a sparse image file
// in the test's temporary directory as XFS, btrfs or ext4, attaches it to a
// loop device, mounts it and undoes all of that in t.Cleanup. MountTmpfs
// does the same for a tmpfs, which needs no image. Tests of code
// whose behaviour depends on the filesystem (reflink, holes, extent hints)
// run against each of them instead of whatever holds /tmp: FS (OnXFS,
// OnBtrfs, ...) names each, in the sizes those tests use.
//
// Mounting needs root and the mkfs tools. When they are missing the test is
// skipped, except when the environment variable CI is set: there it fails,
// so CI can never pass by skipping. RequireTool and SkipOrFail apply the same
// rule to other prerequisites.
//
// ShutdownXFS crashes a mounted XFS without a reboot (XFS_IOC_GOINGDOWN,
// the log not flushed), for crash tests that mount it again with Remount,
// which also ends copies of the mount in other mount namespaces;
// MountSource names the device and filesystem type mounted somewhere.
//
// TreeSum digests a directory tree (the check that nothing under it
// changed) and ReadOnlyTree takes its write bits until the test ends.
//
// testfs is for tests only (it imports testing) and must not import other
// quiver packages.
//
// Imports from quiver: nothing.
package testfs
