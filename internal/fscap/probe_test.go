package fscap

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/quiverstorage/quiver/internal/testfs"
)

func TestProbe(t *testing.T) {
	tests := []struct {
		fs   testfs.FS
		want Caps
	}{
		{testfs.OnExt4, Caps{Filesystem: "ext4", CopyFileRange: true, SeekHole: true}},
		{testfs.OnXFS, Caps{Filesystem: "xfs", Reflink: true, CopyFileRange: true, SeekHole: true, ExtentSizeHint: true}},
		{testfs.OnBtrfs, Caps{Filesystem: "btrfs", Reflink: true, CopyFileRange: true, SeekHole: true, BtrfsSubvolumes: true}},
		{testfs.OnTmpfs, Caps{Filesystem: "tmpfs", CopyFileRange: true, SeekHole: true}},
	}
	for _, tc := range tests {
		t.Run(tc.fs.Name, func(t *testing.T) {
			dir := tc.fs.Dir(t)
			got, err := Probe(dir)
			if err != nil {
				t.Fatalf("Probe: %v", err)
			}
			if got != tc.want {
				t.Errorf("Probe = %+v\nwant    %+v", got, tc.want)
			}
			assertNoProbeFiles(t, dir)
		})
	}
}

// TestProbeTempDir probes whatever holds the test's temporary directory, so
// it only checks what must hold everywhere.
func TestProbeTempDir(t *testing.T) {
	dir := t.TempDir()
	caps, err := Probe(dir)
	if err != nil {
		t.Fatalf("Probe: %v", err)
	}
	t.Logf("%s: %+v", dir, caps)
	if caps.Filesystem == "" {
		t.Error("Filesystem is empty")
	}
	if caps.BtrfsSubvolumes != (caps.Filesystem == "btrfs") {
		t.Errorf("BtrfsSubvolumes = %v on %s", caps.BtrfsSubvolumes, caps.Filesystem)
	}
	assertNoProbeFiles(t, dir)
}

func TestProbeErrors(t *testing.T) {
	tmp := t.TempDir()
	file := filepath.Join(tmp, "file")
	if err := os.WriteFile(file, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	for _, dir := range []string{filepath.Join(tmp, "missing"), file} {
		t.Run(filepath.Base(dir), func(t *testing.T) {
			if caps, err := Probe(dir); err == nil {
				t.Errorf("Probe(%s) = %+v, want an error", dir, caps)
			}
		})
	}
	assertNoProbeFiles(t, tmp)
}

func TestFilesystemName(t *testing.T) {
	tests := []struct {
		magic int64
		want  string
	}{
		{0x58465342, "xfs"},
		{0x9123683e, "btrfs"},
		{-0x6edc97c2, "btrfs"}, // the same magic where statfs's f_type is a signed 32-bit field
		{0xef53, "ext4"},
		{0x01021994, "tmpfs"},
		{0x6969, "nfs"},
		{0x2fc12fc1, "unknown(0x2fc12fc1)"},
	}
	for _, tc := range tests {
		if got := filesystemName(tc.magic); got != tc.want {
			t.Errorf("filesystemName(%#x) = %q, want %q", tc.magic, got, tc.want)
		}
	}
}

func assertNoProbeFiles(t *testing.T, dir string) {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), ".probe-") {
			t.Errorf("probe file %s left in %s", e.Name(), dir)
		}
	}
}

// A copy that fails for lack of space fails the probe; one that fails
// otherwise reports the feature missing. A full filesystem says nothing
// about reflink, and a pool told "no reflink" on a full XFS would run
// without its unshare guard.
func TestProbeCopyFullIsAnError(t *testing.T) {
	p := prober{dir: t.TempDir()}
	defer p.cleanup()
	src, err := p.create("src")
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		err     error
		wantErr bool
	}{
		{fmt.Errorf("reflink: %w", unix.ENOSPC), true},
		{&os.PathError{Op: "truncate", Path: "x", Err: unix.EDQUOT}, true},
		{fmt.Errorf("reflink: %w", unix.EOPNOTSUPP), false},
		{fmt.Errorf("reflink: %w", unix.EXDEV), false},
	} {
		ok, err := p.probeCopy(src, nil, func(dst, src *os.File) error { return tc.err })
		if ok || (err != nil) != tc.wantErr {
			t.Errorf("copy failing with %v: probeCopy = %v, %v; want false and an error: %v", tc.err, ok, err, tc.wantErr)
		}
	}
}
