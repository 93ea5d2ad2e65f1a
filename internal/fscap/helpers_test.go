package fscap

import (
	"testing"

	"github.com/quiverstorage/quiver/internal/testfs"
)

// reflinkCase is a pair of filesystems to clone between, and what cloning
// must answer there.
type reflinkCase struct {
	name    string
	srcFS   testfs.FS
	dstFS   testfs.FS // zero: same directory as src
	wantErr error
}

var reflinkCases = []reflinkCase{
	{name: "xfs", srcFS: testfs.OnXFS},
	{name: "btrfs", srcFS: testfs.OnBtrfs},
	{name: "ext4", srcFS: testfs.OnExt4, wantErr: ErrNotSupported},
	{name: "tmpfs", srcFS: testfs.OnTmpfs, wantErr: ErrNotSupported},
	{name: "xfs to another filesystem", srcFS: testfs.OnXFS, dstFS: testfs.OnBtrfs, wantErr: ErrNotSupported},
}

// dirs returns the source and destination directories of the case.
func (tc reflinkCase) dirs(t testing.TB) (string, string) {
	src := tc.srcFS.Dir(t)
	if tc.dstFS.Dir == nil {
		return src, src
	}
	return src, tc.dstFS.Dir(t)
}

// mustProbe probes dir or fails the test.
func mustProbe(t testing.TB, dir string) Caps {
	t.Helper()
	caps, err := Probe(dir)
	if err != nil {
		t.Fatal(err)
	}
	return caps
}
