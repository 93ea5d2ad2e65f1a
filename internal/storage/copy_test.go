package storage

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/quiverstorage/quiver/internal/fscap"
	"github.com/quiverstorage/quiver/internal/testfs"
)

func TestCopySparse(t *testing.T) {
	for _, fs := range []testfs.FS{testfs.OnTempDir, testfs.OnExt4, testfs.OnXFS, testfs.OnBtrfs, testfs.OnTmpfs} {
		for _, method := range []struct {
			name   string
			useCFR bool
		}{{"copy_file_range", true}, {"read_write", false}} {
			t.Run(fs.Name+"/"+method.name, func(t *testing.T) {
				dir := fs.Dir(t)
				srcPath := testfs.MakeSparse(t, dir, "src")
				dstPath := filepath.Join(dir, "dst")
				src, dst := openPair(t, srcPath, dstPath)
				// Old content must not survive in dst's holes.
				if _, err := dst.WriteAt(testfs.Content(0, 4<<20), 0); err != nil {
					t.Fatal(err)
				}

				var calls []int64
				err := copySparse(context.Background(), dst, src, func(n int64) { calls = append(calls, n) }, method.useCFR)
				if err != nil {
					t.Fatalf("copySparse: %v", err)
				}
				if err := dst.Sync(); err != nil {
					t.Fatal(err)
				}

				testfs.AssertSameFile(t, dstPath, srcPath)
				srcMap, dstMap := testfs.SeekMap(t, srcPath), testfs.SeekMap(t, dstPath)
				if !testfs.Within(dstMap, srcMap) {
					t.Errorf("holes not preserved: dst data runs %v, src %v", dstMap, srcMap)
				}
				wantData := testfs.SumRuns(srcMap)
				if !method.useCFR {
					wantData -= testfs.ZeroLen // the pread/pwrite path leaves zero blocks as holes
				}
				if got := testfs.SumRuns(dstMap); got != wantData {
					t.Errorf("dst has %d data bytes, want %d (runs %v)", got, wantData, dstMap)
				}
				alloc, err := fscap.Allocated(dstPath)
				if err != nil {
					t.Fatal(err)
				}
				if slack := int64(1 << 20); alloc < wantData-slack || alloc > wantData+slack {
					t.Errorf("dst allocates %d bytes for %d data bytes", alloc, wantData)
				}

				var sum int64
				for _, n := range calls {
					if n <= 0 || n > maxChunk {
						t.Errorf("progress(%d): want 0 < n <= %d", n, maxChunk)
					}
					sum += n
				}
				if sum != testfs.SumRuns(srcMap) {
					t.Errorf("progress adds up to %d, want the %d data bytes of src", sum, testfs.SumRuns(srcMap))
				}
				if wantCalls := 1 + 3 + 1; len(calls) != wantCalls {
					t.Errorf("progress called %d times, want %d (one per chunk of at most 8 MiB)", len(calls), wantCalls)
				}
			})
		}
	}
}

func TestCopySparseEmpty(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "src"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	src, dst := openPair(t, filepath.Join(dir, "src"), filepath.Join(dir, "dst"))
	called := false
	if err := CopySparse(context.Background(), dst, src, func(int64) { called = true }); err != nil {
		t.Fatal(err)
	}
	if fi, err := dst.Stat(); err != nil || fi.Size() != 0 {
		t.Errorf("dst stat = %v, %v; want size 0", fi, err)
	}
	if called {
		t.Error("progress called for an empty file")
	}
}

// openPair opens srcPath read-only and creates dstPath, both through an OS
// FS rooted at their directory.
func openPair(t testing.TB, srcPath, dstPath string) (src, dst File) {
	t.Helper()
	fsys, err := OpenOS(filepath.Dir(srcPath))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { fsys.Close() })
	if src, err = fsys.OpenFile(filepath.Base(srcPath), os.O_RDONLY, 0); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { src.Close() })
	if dst, err = fsys.OpenFile(filepath.Base(dstPath), os.O_RDWR|os.O_CREATE|os.O_TRUNC, 0o600); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { dst.Close() })
	return src, dst
}

// TestDataBytes: the walk over data runs finds the sparse layout's runs on
// every filesystem that reports holes.
func TestDataBytes(t *testing.T) {
	for _, fsc := range []testfs.FS{testfs.OnExt4, testfs.OnXFS, testfs.OnBtrfs, testfs.OnTmpfs} {
		t.Run(fsc.Name, func(t *testing.T) {
			dir := fsc.Dir(t)
			path := testfs.MakeSparse(t, dir, "src")
			src, _ := openPair(t, path, filepath.Join(dir, "unused"))
			data, err := DataBytes(src)
			if err != nil {
				t.Fatalf("DataBytes: %v", err)
			}
			if want := testfs.SumRuns(testfs.SparseRuns); data != want {
				t.Errorf("DataBytes = %d, want %d", data, want)
			}
			var runs []testfs.Run
			if err := DataRuns(src, 0, testfs.SparseSize, func(s, e int64) error {
				runs = append(runs, testfs.Run{Off: s, Len: e - s})
				return nil
			}); err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(runs, testfs.SparseRuns) {
				t.Errorf("DataRuns = %v, want %v", runs, testfs.SparseRuns)
			}
		})
	}
}
