package fscap

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

	"github.com/quiverstorage/quiver/internal/testfs"
	"golang.org/x/sys/unix"
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

// run is a byte range [off, off+len) of a file.
type run struct{ off, len int64 }

const blockSize = 4096

var (
	patternOnce sync.Once
	pattern     []byte
)

// content returns the bytes the test files hold at [off, off+n): a fixed
// random pattern, indexed by absolute offset, with the offset of each 4 KiB
// block stamped into it, so no two blocks are alike and a block read from the
// wrong place is caught. off and n must be multiples of 4 KiB.
func content(off, n int64) []byte {
	b := make([]byte, n)
	fillContent(b, off)
	return b
}

// fillContent fills b with content(off, len(b)) without allocating.
func fillContent(b []byte, off int64) {
	patternOnce.Do(func() {
		pattern = make([]byte, testChunk)
		r := rand.NewChaCha8([32]byte{'q', 'u', 'i', 'v', 'e', 'r'})
		r.Read(pattern)
	})
	for i := 0; i < len(b); i += blockSize {
		p := (off + int64(i)) % int64(len(pattern))
		copy(b[i:i+blockSize], pattern[p:p+blockSize])
		binary.LittleEndian.PutUint64(b[i:], uint64(off+int64(i))|1<<63)
	}
}

// writeRuns creates path with the given size and writes content() to each
// data run, leaving holes elsewhere, then fsyncs it.
func writeRuns(t testing.TB, path string, size int64, runs []run) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := f.Truncate(size); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, testChunk)
	for _, r := range runs {
		for off := r.off; off < r.off+r.len; off += testChunk {
			b := buf[:min(testChunk, r.off+r.len-off)]
			fillContent(b, off)
			if _, err := f.WriteAt(b, off); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := f.Sync(); err != nil {
		t.Fatal(err)
	}
}

// seekMap lists path's data runs with lseek directly, as an oracle
// independent of dataRuns.
func seekMap(t testing.TB, path string) []run {
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
	var runs []run
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
		runs = append(runs, run{start, end - start})
		off = end
	}
	return runs
}

func sumRuns(runs []run) int64 {
	var n int64
	for _, r := range runs {
		n += r.len
	}
	return n
}

// within reports whether every run of inner lies inside a run of outer: the
// holes of outer are still holes in inner.
func within(inner, outer []run) bool {
	for _, in := range inner {
		ok := false
		for _, out := range outer {
			if in.off >= out.off && in.off+in.len <= out.off+out.len {
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

// hashFile hashes path's content with maphash under seed: fast enough for
// gigabytes, and unforgeable without the seed, which is all an equality
// check needs.
func hashFile(t testing.TB, path string, seed maphash.Seed) uint64 {
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

// assertSameFile checks that got has want's size and bytes.
func assertSameFile(t testing.TB, got, want string) {
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
	if hashFile(t, got, seed) != hashFile(t, want, seed) {
		t.Fatalf("%s differs from %s", filepath.Base(got), filepath.Base(want))
	}
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

// A sparse layout: data at the start, a run longer than two chunks that ends
// off a chunk boundary, a run that has written zeros in its middle, and a
// hole at the end.
const (
	sparseSize = 48 << 20
	zeroOff    = 30<<20 + 256<<10 // written zeros inside the third run
	zeroLen    = 256 << 10
)

var sparseRuns = []run{
	{0, 64 << 10},
	{1 << 20, 20<<20 + 12<<10},
	{30 << 20, 1 << 20},
}

// makeSparse writes the sparse layout to dir/name and returns its path.
func makeSparse(t testing.TB, dir, name string) string {
	t.Helper()
	path := filepath.Join(dir, name)
	writeRuns(t, path, sparseSize, sparseRuns)
	f, err := os.OpenFile(path, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteAt(make([]byte, zeroLen), zeroOff); err != nil {
		t.Fatal(err)
	}
	if err := f.Sync(); err != nil {
		t.Fatal(err)
	}
	if got := seekMap(t, path); !slices.Equal(got, sparseRuns) {
		t.Fatalf("test setup: %s has data runs %v, want %v", path, got, sparseRuns)
	}
	return path
}

// testChunk is the size of the test pattern and of the write buffer.
const testChunk = 8 << 20
