package testfs

import (
	"encoding/binary"
	"hash/maphash"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"

	"golang.org/x/sys/unix"
)

// Run is a byte range [Off, Off+Len) of a file.
type Run struct{ Off, Len int64 }

// BlockSize is the unit of Content: every 4 KiB block is stamped with its
// offset.
const BlockSize = 4096

// chunk is the size of the content pattern and of WriteRuns' buffer.
const chunk = 8 << 20

var (
	patternOnce sync.Once
	pattern     []byte
)

// Content returns the bytes test files hold at [off, off+n): a fixed random
// pattern, indexed by absolute offset, with the offset of each 4 KiB block
// stamped into it, so no two blocks are alike and a block read from the
// wrong place is caught. off and n must be multiples of 4 KiB.
func Content(off, n int64) []byte {
	b := make([]byte, n)
	FillContent(b, off)
	return b
}

// FillContent fills b with Content(off, len(b)) without allocating.
func FillContent(b []byte, off int64) {
	patternOnce.Do(func() {
		pattern = make([]byte, chunk)
		r := rand.NewChaCha8([32]byte{'q', 'u', 'i', 'v', 'e', 'r'})
		r.Read(pattern)
	})
	for i := 0; i < len(b); i += BlockSize {
		p := (off + int64(i)) % int64(len(pattern))
		copy(b[i:i+BlockSize], pattern[p:p+BlockSize])
		binary.LittleEndian.PutUint64(b[i:], uint64(off+int64(i))|1<<63)
	}
}

// WriteRuns creates path with the given size and writes Content to each
// data run, leaving holes elsewhere, then fsyncs it.
func WriteRuns(t testing.TB, path string, size int64, runs []Run) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := f.Truncate(size); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, chunk)
	for _, r := range runs {
		for off := r.Off; off < r.Off+r.Len; off += chunk {
			b := buf[:min(chunk, r.Off+r.Len-off)]
			FillContent(b, off)
			if _, err := f.WriteAt(b, off); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := f.Sync(); err != nil {
		t.Fatal(err)
	}
}

// SeekMap lists path's data runs with lseek directly: an oracle that
// shares no code with what it checks.
func SeekMap(t testing.TB, path string) []Run {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		t.Fatal(err)
	}
	var runs []Run
	fd := int(f.Fd())
	for off := int64(0); off < fi.Size(); {
		start, err := unix.Seek(fd, off, unix.SEEK_DATA)
		if err == unix.ENXIO {
			break
		}
		if err != nil {
			t.Fatalf("SEEK_DATA %s at %d: %v", path, off, err)
		}
		end, err := unix.Seek(fd, start, unix.SEEK_HOLE)
		if err != nil {
			t.Fatalf("SEEK_HOLE %s at %d: %v", path, start, err)
		}
		runs = append(runs, Run{start, end - start})
		off = end
	}
	return runs
}

// SumRuns is the bytes the runs cover.
func SumRuns(runs []Run) int64 {
	var n int64
	for _, r := range runs {
		n += r.Len
	}
	return n
}

// Within reports whether every run of inner lies inside a run of outer: the
// holes of outer are still holes in inner.
func Within(inner, outer []Run) bool {
	for _, in := range inner {
		ok := false
		for _, out := range outer {
			if in.Off >= out.Off && in.Off+in.Len <= out.Off+out.Len {
				ok = true
				break
			}
		}
		if !ok {
			return false
		}
	}
	return true
}

// HashFile hashes path's content with maphash under seed: fast enough for
// gigabytes, and unforgeable without the seed, which is all an equality
// check needs.
func HashFile(t testing.TB, path string, seed maphash.Seed) uint64 {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var h maphash.Hash
	h.SetSeed(seed)
	if _, err := io.CopyBuffer(&h, f, make([]byte, 4<<20)); err != nil {
		t.Fatal(err)
	}
	return h.Sum64()
}

// AssertSameFile checks that got has want's size and bytes.
func AssertSameFile(t testing.TB, got, want string) {
	t.Helper()
	gi, err := os.Stat(got)
	if err != nil {
		t.Fatal(err)
	}
	wi, err := os.Stat(want)
	if err != nil {
		t.Fatal(err)
	}
	if gi.Size() != wi.Size() {
		t.Fatalf("%s is %d bytes, want %d", got, gi.Size(), wi.Size())
	}
	seed := maphash.MakeSeed()
	if HashFile(t, got, seed) != HashFile(t, want, seed) {
		t.Fatalf("%s differs from %s", filepath.Base(got), filepath.Base(want))
	}
}

// A sparse layout: data at the start, a run longer than two chunks that ends
// off a chunk boundary, a run that has written zeros in its middle, and a
// hole at the end.
const (
	SparseSize = 48 << 20
	ZeroOff    = 30<<20 + 256<<10 // written zeros inside the third run
	ZeroLen    = 256 << 10
)

// SparseRuns are the data runs of the sparse layout.
var SparseRuns = []Run{
	{0, 64 << 10},
	{1 << 20, 20<<20 + 12<<10},
	{30 << 20, 1 << 20},
}

// MakeSparse writes the sparse layout to dir/name and returns its path.
func MakeSparse(t testing.TB, dir, name string) string {
	t.Helper()
	path := filepath.Join(dir, name)
	WriteRuns(t, path, SparseSize, SparseRuns)
	f, err := os.OpenFile(path, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteAt(make([]byte, ZeroLen), ZeroOff); err != nil {
		t.Fatal(err)
	}
	if err := f.Sync(); err != nil {
		t.Fatal(err)
	}
	if got := SeekMap(t, path); !slices.Equal(got, SparseRuns) {
		t.Fatalf("test setup: %s has data runs %v, want %v", path, got, SparseRuns)
	}
	return path
}
