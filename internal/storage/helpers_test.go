package storage

import (
	"testing"

	"github.com/quiverstorage/quiver/internal/fscap"
	"github.com/quiverstorage/quiver/internal/testfs"
)

// A filesystem to run a test on.
type fsCase struct {
	name string
	dir  func(t testing.TB) string
}

var (
	onTempDir = fsCase{"tempdir", func(t testing.TB) string { return t.TempDir() }}
	onExt4    = fsCase{"ext4", func(t testing.TB) string { return testfs.MountExt4(t, 256<<20) }}
	onXFS     = fsCase{"xfs", func(t testing.TB) string { return testfs.MountXFS(t, 4<<30) }}
	onBtrfs   = fsCase{"btrfs", func(t testing.TB) string { return testfs.MountBtrfs(t, 4<<30) }}
	onTmpfs   = fsCase{"tmpfs", func(t testing.TB) string { return testfs.MountTmpfs(t, 256<<20) }}
)

// reflinkCase is a pair of filesystems to clone between, and what cloning
// must answer there.
type reflinkCase struct {
	name    string
	srcFS   fsCase
	dstFS   fsCase // zero: same directory as src
	wantErr error
}

var reflinkCases = []reflinkCase{
	{name: "xfs", srcFS: onXFS},
	{name: "btrfs", srcFS: onBtrfs},
	{name: "ext4", srcFS: onExt4, wantErr: ErrNotSupported},
	{name: "tmpfs", srcFS: onTmpfs, wantErr: ErrNotSupported},
	{name: "xfs to another filesystem", srcFS: onXFS, dstFS: onBtrfs, wantErr: ErrNotSupported},
}

// dirs returns the source and destination directories of the case.
func (tc reflinkCase) dirs(t testing.TB) (string, string) {
	src := tc.srcFS.dir(t)
	if tc.dstFS.dir == nil {
		return src, src
	}
	return src, tc.dstFS.dir(t)
}

// The sparse files of these tests, shared with the other filesystem tests
// (internal/testfs).
type run = testfs.Run

const blockSize = testfs.BlockSize

var (
	content        = testfs.Content
	fillContent    = testfs.FillContent
	writeRuns      = testfs.WriteRuns
	seekMap        = testfs.SeekMap
	sumRuns        = testfs.SumRuns
	within         = testfs.Within
	hashFile       = testfs.HashFile
	assertSameFile = testfs.AssertSameFile
	makeSparse     = testfs.MakeSparse
	sparseRuns     = testfs.SparseRuns
)

const (
	sparseSize = testfs.SparseSize
	zeroOff    = testfs.ZeroOff
	zeroLen    = testfs.ZeroLen
)

// mustProbe probes dir or fails the test.
func mustProbe(t testing.TB, dir string) Caps {
	t.Helper()
	caps, err := fscap.Probe(dir)
	if err != nil {
		t.Fatal(err)
	}
	return caps
}
