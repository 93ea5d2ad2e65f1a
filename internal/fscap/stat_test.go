package fscap

import (
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/quiverstorage/quiver/internal/testfs"
)

func TestAllocatedExtents(t *testing.T) {
	tests := []struct {
		fs             testfs.FS
		extentsWantErr error
	}{
		{fs: testfs.OnExt4},
		{fs: testfs.OnXFS},
		{fs: testfs.OnBtrfs},
		{fs: testfs.OnTmpfs, extentsWantErr: ErrNotSupported},
	}
	for _, tc := range tests {
		t.Run(tc.fs.Name, func(t *testing.T) {
			dir := tc.fs.Dir(t)
			path := testfs.MakeSparse(t, dir, "src")
			f, err := os.Open(path)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()

			data := testfs.SumRuns(testfs.SparseRuns) // storage.TestDataBytes checks the walk

			alloc, err := Allocated(path)
			if err != nil {
				t.Fatalf("Allocated: %v", err)
			}
			if alloc < data || alloc > data+1<<20 {
				t.Errorf("Allocated = %d, want about the %d data bytes", alloc, data)
			}

			n, err := Extents(f)
			if !errors.Is(err, tc.extentsWantErr) {
				t.Fatalf("Extents: err = %v, want %v", err, tc.extentsWantErr)
			}
			if err == nil && n < len(testfs.SparseRuns) {
				t.Errorf("Extents = %d, want at least one per data run (%d)", n, len(testfs.SparseRuns))
			}

			total, free, err := Usage(dir)
			if err != nil {
				t.Fatalf("Usage: %v", err)
			}
			if total <= 0 || free <= 0 || free > total {
				t.Errorf("Usage = %d, %d; want 0 < free <= total", total, free)
			}
		})
	}
}

func TestExtentsEmptyFile(t *testing.T) {
	f, err := os.Create(filepath.Join(t.TempDir(), "empty"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := f.Truncate(1 << 30); err != nil {
		t.Fatal(err)
	}
	if n, err := Extents(f); err != nil || n != 0 {
		t.Errorf("Extents of a hole-only file = %d, %v; want 0, nil", n, err)
	}
}

func TestStatErrors(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "missing")
	if _, err := Allocated(missing); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("Allocated(missing): err = %v, want os.ErrNotExist", err)
	}
	if _, _, err := Usage(missing); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("Usage(missing): err = %v, want os.ErrNotExist", err)
	}
}

func TestSetExtentSizeHint(t *testing.T) {
	const hint = 1 << 20
	tests := []struct {
		name     string
		fs       testfs.FS
		hasData  bool
		bytes    uint32
		wantErr  error // nil: success
		anyError bool  // an error other than the sentinels
	}{
		{name: "xfs", fs: testfs.OnXFS, bytes: hint},
		{name: "xfs clear", fs: testfs.OnXFS, bytes: 0},
		{name: "xfs file with data", fs: testfs.OnXFS, hasData: true, bytes: hint, wantErr: ErrHasData},
		{name: "xfs not a block multiple", fs: testfs.OnXFS, bytes: 1000, anyError: true},
		{name: "ext4", fs: testfs.OnExt4, bytes: hint, wantErr: ErrNotSupported},
		{name: "btrfs", fs: testfs.OnBtrfs, bytes: hint, wantErr: ErrNotSupported},
		{name: "tmpfs", fs: testfs.OnTmpfs, bytes: hint, wantErr: ErrNotSupported},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f, err := os.Create(filepath.Join(tc.fs.Dir(t), "disk"))
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			if err := f.Truncate(64 << 20); err != nil { // size alone allocates nothing
				t.Fatal(err)
			}
			if tc.hasData {
				if _, err := f.WriteAt(testfs.Content(0, testfs.BlockSize), 0); err != nil {
					t.Fatal(err)
				}
			}

			err = SetExtentSizeHint(f, tc.bytes)
			switch {
			case tc.anyError:
				if err == nil || errors.Is(err, ErrNotSupported) || errors.Is(err, ErrHasData) {
					t.Fatalf("err = %v, want a plain error", err)
				}
				return
			case !errors.Is(err, tc.wantErr):
				t.Fatalf("err = %v, want %v", err, tc.wantErr)
			case err != nil:
				return
			}
			attr, err := getFsxattr(f)
			if err != nil {
				t.Fatal(err)
			}
			if set := attr.Xflags&fsXflagExtsize != 0; set != (tc.bytes != 0) || attr.Extsize != tc.bytes {
				t.Errorf("after setting %d: FS_XFLAG_EXTSIZE=%v extsize=%d", tc.bytes, set, attr.Extsize)
			}
		})
	}
}
