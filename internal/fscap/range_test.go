package fscap

import (
	"bytes"
	"errors"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/quiverstorage/quiver/internal/testfs"
)

func TestReflinkRange(t *testing.T) {
	for _, tc := range reflinkCases {
		t.Run(tc.name, func(t *testing.T) {
			srcDir, dstDir := tc.dirs(t)
			// A size off the block size: the last range ends at an
			// unaligned end of file, which FICLONERANGE allows.
			const size = 4<<20 + 512
			want := randomBytes(1, size)
			src := createWith(t, filepath.Join(srcDir, "src"), want)
			dst := createWith(t, filepath.Join(dstDir, "dst"), nil)

			err := ReflinkRange(dst, src, 0, 0)
			if !errors.Is(err, tc.wantErr) {
				t.Fatalf("ReflinkRange of the whole file: err = %v, want %v", err, tc.wantErr)
			}
			if err != nil {
				if fi, err := dst.Stat(); err != nil || fi.Size() != 0 {
					t.Errorf("dst after a failed reflink: %v, %v; want it empty", fi, err)
				}
				return
			}
			assertContent(t, dst, want)

			// Change src in four places and clone three of them again.
			old := bytes.Clone(want)
			writeAt(t, src, want, randomBytes(2, 64<<10), 64<<10)
			punch(t, src, want, 1<<20, 128<<10)
			writeAt(t, src, want, randomBytes(3, 4096), 2<<20) // not cloned again
			writeAt(t, src, want, randomBytes(4, 512), 4<<20)
			for _, r := range []testfs.Run{{Off: 64 << 10, Len: 64 << 10}, {Off: 1 << 20, Len: 128 << 10}, {Off: 4 << 20, Len: 512}} {
				if err := ReflinkRange(dst, src, r.Off, r.Len); err != nil {
					t.Fatalf("ReflinkRange [%d, +%d): %v", r.Off, r.Len, err)
				}
			}
			expect := bytes.Clone(want)
			copy(expect[2<<20:2<<20+4096], old[2<<20:]) // only what was cloned again changed
			assertContent(t, dst, expect)
			if data, err := unix.Seek(int(dst.Fd()), 1<<20, unix.SEEK_DATA); err != nil || data < 1<<20+128<<10 {
				t.Errorf("SEEK_DATA from the re-cloned hole = %d, %v; want the hole to stay a hole", data, err)
			}

			// A misaligned range fails and leaves dst alone.
			err = ReflinkRange(dst, src, 512, 4096)
			if !errors.Is(err, ErrNotSupported) {
				t.Errorf("ReflinkRange at offset 512: err = %v, want ErrNotSupported", err)
			}
			assertContent(t, dst, expect)

			// Length 0 clones up to the end of src.
			if err := ReflinkRange(dst, src, 2<<20, 0); err != nil {
				t.Fatalf("ReflinkRange to EOF: %v", err)
			}
			assertContent(t, dst, want)
		})
	}
}

func TestReflinkRangeBadArgs(t *testing.T) {
	dir := t.TempDir()
	src := createWith(t, filepath.Join(dir, "src"), nil)
	dst := createWith(t, filepath.Join(dir, "dst"), nil)
	for _, r := range []testfs.Run{{Off: -4096, Len: 4096}, {Off: 0, Len: -1}} {
		if err := ReflinkRange(dst, src, r.Off, r.Len); err == nil {
			t.Errorf("ReflinkRange [%d, +%d) succeeded, want an error", r.Off, r.Len)
		}
	}
}

func randomBytes(seed uint64, n int) []byte {
	b := make([]byte, n)
	r := rand.NewChaCha8([32]byte{byte(seed)})
	_, _ = r.Read(b)
	return b
}

// createWith creates path holding b, fsynced, opened read-write; t.Cleanup
// closes it.
func createWith(t *testing.T, path string, b []byte) *os.File {
	t.Helper()
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	if _, err := f.WriteAt(b, 0); err != nil {
		t.Fatal(err)
	}
	if err := f.Sync(); err != nil {
		t.Fatal(err)
	}
	return f
}

// writeAt writes b to f at off and to the model of f's content.
func writeAt(t *testing.T, f *os.File, model, b []byte, off int64) {
	t.Helper()
	if _, err := f.WriteAt(b, off); err != nil {
		t.Fatal(err)
	}
	copy(model[off:], b)
}

// punch punches a hole in f and in the model of f's content.
func punch(t *testing.T, f *os.File, model []byte, off, n int64) {
	t.Helper()
	if err := unix.Fallocate(int(f.Fd()), unix.FALLOC_FL_PUNCH_HOLE|unix.FALLOC_FL_KEEP_SIZE, off, n); err != nil {
		t.Fatal(err)
	}
	clear(model[off : off+n])
}

func assertContent(t *testing.T, f *os.File, want []byte) {
	t.Helper()
	got := make([]byte, len(want)+1)
	n, err := f.ReadAt(got, 0)
	if n != len(want) {
		t.Fatalf("%s holds %d bytes (%v), want %d", f.Name(), n, err, len(want))
	}
	if i := firstDiff(got[:n], want); i >= 0 {
		t.Fatalf("%s differs from the expected content at byte %d", f.Name(), i)
	}
}

func firstDiff(a, b []byte) int {
	for i := range a {
		if a[i] != b[i] {
			return i
		}
	}
	return -1
}
