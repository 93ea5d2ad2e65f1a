package testfs

import "testing"

// FS is a filesystem for a test to run on: Dir makes it (mounts it, for
// all but OnTempDir) and returns a directory on it.
type FS struct {
	Name string
	Dir  func(t testing.TB) string
}

// The filesystems the filesystem-dependent tests run on, in sizes that
// hold their files.
var (
	OnTempDir = FS{"tempdir", func(t testing.TB) string { return t.TempDir() }}
	OnExt4    = FS{"ext4", func(t testing.TB) string { return MountExt4(t, 256<<20) }}
	OnXFS     = FS{"xfs", func(t testing.TB) string { return MountXFS(t, 4<<30) }}
	OnBtrfs   = FS{"btrfs", func(t testing.TB) string { return MountBtrfs(t, 4<<30) }}
	OnTmpfs   = FS{"tmpfs", func(t testing.TB) string { return MountTmpfs(t, 256<<20) }}
)
