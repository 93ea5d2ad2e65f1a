package fscap

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/quiverstorage/quiver/internal/testfs"
)

// TestSolid checks each state a 1 MiB range can be in on XFS and btrfs: a
// hole, partly written, preallocated, written, shared with a reflink copy,
// and written again whole after the copy.
func TestSolid(t *testing.T) {
	for _, fc := range []testfs.FS{testfs.OnXFS, testfs.OnBtrfs} {
		t.Run(fc.Name, func(t *testing.T) {
			dir := fc.Dir(t)
			f, err := os.OpenFile(filepath.Join(dir, "a.img"), os.O_RDWR|os.O_CREATE, 0o644)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			const mib = 1 << 20
			if err := f.Truncate(8 * mib); err != nil {
				t.Fatal(err)
			}
			chunk := func(i int64) (int64, int64) { return i * mib, mib }
			write := func(off, n int64) {
				t.Helper()
				if _, err := f.WriteAt(make([]byte, n), off); err != nil {
					t.Fatal(err)
				}
				if err := f.Sync(); err != nil {
					t.Fatal(err)
				}
			}
			write(1*mib+4096, 4096) // chunk 1: partly written
			if err := unix.Fallocate(int(f.Fd()), 0, 2*mib, mib); err != nil {
				t.Fatal(err)
			} // chunk 2: preallocated, unwritten
			write(3*mib, mib) // chunk 3: written whole
			write(4*mib, mib) // chunk 4: written, then shared by a reflink
			g, err := os.Create(filepath.Join(dir, "b.img"))
			if err != nil {
				t.Fatal(err)
			}
			defer g.Close()
			if err := Reflink(g, f); err != nil {
				t.Fatal(err)
			}
			write(5*mib, mib) // chunk 5: written whole after the copy: owned again
			want := map[int64]bool{0: false, 1: false, 2: false, 3: false, 4: false, 5: true}
			for i := int64(0); i <= 5; i++ {
				off, n := chunk(i)
				got, err := Solid(f, off, n)
				if err != nil {
					t.Fatal(err)
				}
				if got != want[i] {
					t.Errorf("chunk %d: Solid = %v, want %v", i, got, want[i])
				}
			}
			// The copy shares chunk 3 with the original.
			if got, _ := Solid(g, 3*mib, mib); got {
				t.Error("the reflink copy's chunk 3 reads as solid: it is shared")
			}
		})
	}
	t.Run("tmpfs", func(t *testing.T) {
		f, err := os.Create(filepath.Join(testfs.OnTmpfs.Dir(t), "a.img"))
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		if _, err := Solid(f, 0, 4096); !errors.Is(err, ErrNotSupported) {
			t.Fatalf("Solid on tmpfs: %v, want ErrNotSupported", err)
		}
	})
}

// TestSameBlocks checks, on XFS and btrfs, that a reflink copy shares the
// blocks of what it copied and stops sharing exactly those it writes, and
// that holes and preallocations share nothing.
func TestSameBlocks(t *testing.T) {
	for _, fc := range []testfs.FS{testfs.OnXFS, testfs.OnBtrfs} {
		t.Run(fc.Name, func(t *testing.T) {
			dir := fc.Dir(t)
			const mib = 1 << 20
			f, err := os.OpenFile(filepath.Join(dir, "a.img"), os.O_RDWR|os.O_CREATE, 0o644)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			if err := f.Truncate(4 * mib); err != nil {
				t.Fatal(err)
			}
			if _, err := f.WriteAt(bytes.Repeat([]byte{1}, 2*mib), 0); err != nil {
				t.Fatal(err)
			} // [0, 2 MiB) data, [2, 3) preallocated, [3, 4) a hole
			if err := unix.Fallocate(int(f.Fd()), 0, 2*mib, mib); err != nil {
				t.Fatal(err)
			}
			if err := f.Sync(); err != nil {
				t.Fatal(err)
			}
			g, err := os.OpenFile(filepath.Join(dir, "b.img"), os.O_RDWR|os.O_CREATE, 0o644)
			if err != nil {
				t.Fatal(err)
			}
			defer g.Close()
			if err := Reflink(g, f); err != nil {
				t.Fatal(err)
			}
			// The copy overwrites one block, and writes back.
			if _, err := g.WriteAt(bytes.Repeat([]byte{2}, 4096), mib+8192); err != nil {
				t.Fatal(err)
			}
			if err := g.Sync(); err != nil {
				t.Fatal(err)
			}
			for _, c := range []struct {
				name   string
				off, n int64
				want   bool
			}{
				{"a copied block", 4096, 4096, true},
				{"a copied MiB", 0, mib, true},
				{"the block the copy wrote", mib + 8192, 4096, false},
				{"a range holding it", mib, mib, false},
				{"the blocks around it", mib, 8192, true},
				{"unaligned, beside it", mib + 12288 + 100, 300, true},
				{"preallocated", 2*mib + 4096, 4096, false},
				{"data and preallocation", 2*mib - 4096, 8192, false},
				{"a hole", 3 * mib, 4096, false},
			} {
				for _, swap := range []bool{false, true} {
					x, y := f, g
					if swap {
						x, y = g, f
					}
					got, err := SameBlocks(x, y, c.off, c.n)
					if err != nil {
						t.Fatal(err)
					}
					if got != c.want {
						t.Errorf("%s (swapped %v): SameBlocks = %v, want %v", c.name, swap, got, c.want)
					}
				}
			}
			// A file compared with itself shares all its data.
			if got, _ := SameBlocks(f, f, 0, 2*mib); !got {
				t.Error("a file's data does not read as its own")
			}
		})
	}
	t.Run("tmpfs", func(t *testing.T) {
		f, err := os.Create(filepath.Join(testfs.OnTmpfs.Dir(t), "a.img"))
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		if _, err := SameBlocks(f, f, 0, 4096); !errors.Is(err, ErrNotSupported) {
			t.Fatalf("SameBlocks on tmpfs: %v, want ErrNotSupported", err)
		}
	})
}

// TestDifferences: two reflinked copies differ where one wrote (a block,
// a hole filled) and where either is preallocated, not where both share
// blocks or both are holes; also against a file that shares nothing.
func TestDifferences(t *testing.T) {
	for _, fc := range []testfs.FS{testfs.OnXFS, testfs.OnBtrfs} {
		t.Run(fc.Name, func(t *testing.T) {
			dir := fc.Dir(t)
			const mib = 1 << 20
			open := func(name string) *os.File {
				f, err := os.OpenFile(filepath.Join(dir, name), os.O_RDWR|os.O_CREATE, 0o644)
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { _ = f.Close() })
				return f
			}
			f := open("a.img")
			if err := f.Truncate(6 * mib); err != nil {
				t.Fatal(err)
			}
			// [0, 2 MiB) data, [2, 3) preallocated, [3, 6) a hole.
			if _, err := f.WriteAt(bytes.Repeat([]byte{1}, 2*mib), 0); err != nil {
				t.Fatal(err)
			}
			if err := unix.Fallocate(int(f.Fd()), 0, 2*mib, mib); err != nil {
				t.Fatal(err)
			}
			if err := f.Sync(); err != nil {
				t.Fatal(err)
			}
			g := open("b.img")
			if err := Reflink(g, f); err != nil {
				t.Fatal(err)
			}
			// The copy writes one block and fills one hole block.
			for _, off := range []int64{mib + 8192, 4*mib + 4096} {
				if _, err := g.WriteAt(bytes.Repeat([]byte{2}, 4096), off); err != nil {
					t.Fatal(err)
				}
			}
			if err := g.Sync(); err != nil {
				t.Fatal(err)
			}
			got, err := Differences(g, f, 6*mib)
			if err != nil {
				t.Fatal(err)
			}
			covers := func(off, n int64) bool {
				for _, r := range got {
					if r[0] <= off && off+n <= r[0]+r[1] {
						return true
					}
				}
				return false
			}
			touches := func(off, n int64) bool {
				for _, r := range got {
					if r[0] < off+n && off < r[0]+r[1] {
						return true
					}
				}
				return false
			}
			switch {
			case !covers(mib+8192, 4096):
				t.Errorf("the written block is not among %v", got)
			case !covers(4*mib+4096, 4096):
				t.Errorf("the filled hole is not among %v", got)
			case !covers(2*mib, mib):
				t.Errorf("the preallocation is not among %v", got)
			case touches(0, mib) || touches(mib+12288, mib-12288):
				t.Errorf("shared blocks are among %v", got)
			case touches(3*mib, mib) || touches(5*mib, mib):
				t.Errorf("holes of both are among %v", got)
			}
			sh, err := SharedBlocks(g, f, 6*mib)
			if err != nil {
				t.Fatal(err)
			}
			inShared := func(off, n int64) bool {
				for _, r := range sh {
					if r[0] <= off && off+n <= r[0]+r[1] {
						return true
					}
				}
				return false
			}
			for _, r := range sh {
				for _, c := range []int64{mib + 8192, 2 * mib, 3 * mib, 4*mib + 4096} {
					if r[0] <= c && c < r[0]+r[1] {
						t.Errorf("shared blocks %v hold %d, a block written, preallocated or a hole", sh, c)
					}
				}
			}
			if !inShared(0, mib+8192) || !inShared(mib+12288, mib-12288) {
				t.Errorf("shared blocks %v miss the copied data", sh)
			}
			h := open("c.img")
			if _, err := h.WriteAt(bytes.Repeat([]byte{1}, 2*mib), 0); err != nil {
				t.Fatal(err)
			}
			if err := h.Sync(); err != nil {
				t.Fatal(err)
			}
			got, err = Differences(h, f, 6*mib)
			if err != nil {
				t.Fatal(err)
			}
			if !covers(0, 3*mib) || touches(3*mib, 3*mib) {
				t.Errorf("a file sharing nothing: %v, want [0, 3 MiB)", got)
			}
		})
	}
}
