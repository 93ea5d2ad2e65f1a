package pool

import (
	"bytes"
	"errors"
	"path/filepath"
	"testing"

	"github.com/quiverstorage/quiver/internal/storage"
	"github.com/quiverstorage/quiver/internal/testfs"
)

// tryDisk opens the live handle of disk root of a fresh 8 MiB volume "vm"
// in a pool at dir.
func tryDisk(t *testing.T, dir string) (*Pool, *Volume, *liveDisk) {
	t.Helper()
	p := openTestPool(t, dir)
	v := attachVM(t, p)
	d, err := v.OpenDisk("root")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = d.Close() })
	return p, v, d.(*liveDisk)
}

// tryer is the disk handle's Try interfaces.
type tryer interface {
	Nonblocking
	Batcher
}

// A tryMode tries one read or write: alone (TryReadAt, TryWriteAt), or in a
// batch (TryBatch) beside a read of the disk's first 4 KiB, so that the
// batch is big enough for the file's ring.
type tryMode struct {
	name        string
	read, write func(d Disk, p []byte, off int64) error
}

var tryModes = []tryMode{
	{"alone",
		func(d Disk, p []byte, off int64) error { return d.(tryer).TryReadAt(p, off) },
		func(d Disk, p []byte, off int64) error { return d.(tryer).TryWriteAt(p, off) }},
	{"batch",
		func(d Disk, p []byte, off int64) error { return tryBatch(d, false, p, off) },
		func(d Disk, p []byte, off int64) error { return tryBatch(d, true, p, off) }},
}

func tryBatch(d Disk, write bool, p []byte, off int64) error {
	ios := []IO{{Write: write, P: p, Off: off}, {P: make([]byte, 4096)}}
	d.(tryer).TryBatch(ios)
	return ios[0].Err
}

// dropCache writes the disk's dirty pages back and evicts its page cache.
func dropCache(t *testing.T, d *liveDisk) {
	t.Helper()
	f := d.v.files["root"].f
	if err := f.Sync(); err != nil {
		t.Fatal(err)
	}
	if err := f.Advise(0, 0, storage.AdviseDontNeed); err != nil {
		t.Fatal(err)
	}
}

// TestTryOnXFS: on XFS (RWF_NOWAIT for buffered reads and writes) a Try
// request succeeds when nothing has to wait, and says ErrWouldBlock, having
// changed nothing, when the data is not cached, the chunk is not owned yet,
// or the gate is closed.
func TestTryOnXFS(t *testing.T) {
	for _, m := range tryModes {
		t.Run(m.name, func(t *testing.T) {
			mnt := testfs.MountXFS(t, 1<<30)
			_, _, d := tryDisk(t, filepath.Join(mnt, "pool"))
			if d.v.files["root"].ch == nil {
				t.Fatal("chunk ownership is off on XFS with reflink")
			}
			// A fresh disk owns no chunk: the first write must copy up, so it
			// cannot be tried.
			if err := m.write(d, pattern(1, 4096), 8192); !errors.Is(err, ErrWouldBlock) {
				t.Fatalf("write into an unowned chunk: %v, want ErrWouldBlock", err)
			}
			if got := readBack(t, d, 8192, 4096); !bytes.Equal(got, make([]byte, 4096)) {
				t.Fatal("a refused write changed the disk")
			}
			// Once the chunk is owned and its blocks are allocated, a write into it
			// is a plain overwrite, but for one thing: the first write in each
			// tick of the clock must update the file's timestamps, which with
			// RWF_NOWAIT is refused. So: an ordinary write, then at once a Try.
			if err := d.WriteAt(pattern(2, 1<<20), 0, true); err != nil {
				t.Fatal(err)
			}
			tried := false
			for range 50 {
				if err := d.WriteAt(pattern(2, 4096), 8192, false); err != nil {
					t.Fatal(err)
				}
				err := m.write(d, pattern(3, 4096), 8192)
				if err == nil {
					tried = true
					break
				}
				if !errors.Is(err, ErrWouldBlock) {
					t.Fatal(err)
				}
			}
			if !tried {
				t.Fatal("50 writes into an owned, allocated chunk, each right after an ordinary one: all would block")
			}
			want := pattern(2, 1<<20)
			copy(want[8192:], pattern(3, 4096))
			got := make([]byte, 1<<20)
			if err := m.read(d, got, 0); err != nil {
				t.Fatalf("read of cached data: %v", err)
			}
			if !bytes.Equal(got, want) {
				t.Fatal("Try read does not return what was written")
			}

			dropCache(t, d)
			if err := m.read(d, got, 0); !errors.Is(err, ErrWouldBlock) {
				t.Fatalf("read of evicted data: %v, want ErrWouldBlock", err)
			}
			if got := readBack(t, d, 0, 1<<20); !bytes.Equal(got, want) {
				t.Fatal("data lost across the page-cache eviction")
			}
			if d.v.files["root"].nw.readOff.Load() || d.v.files["root"].nw.writeOff.Load() {
				t.Fatal("XFS was marked as refusing RWF_NOWAIT")
			}

			// A snapshot, rollback or capture holds the gate: Try steps aside.
			d.v.gate.Lock()
			errR, errW := m.read(d, got[:4096], 0), m.write(d, pattern(4, 4096), 0)
			d.v.gate.Unlock()
			if !errors.Is(errR, ErrWouldBlock) || !errors.Is(errW, ErrWouldBlock) {
				t.Fatalf("with the gate closed: read %v, write %v, want ErrWouldBlock", errR, errW)
			}
			if got := readBack(t, d, 0, 4096); !bytes.Equal(got, want[:4096]) {
				t.Fatal("a write tried with the gate closed changed the disk")
			}
		})
	}
}

// TestTryWriteOnExt4: ext4 refuses RWF_NOWAIT for buffered writes; Try then
// says ErrWouldBlock, remembers it, and leaves the disk alone.
func TestTryWriteOnExt4(t *testing.T) {
	for _, m := range tryModes {
		t.Run(m.name, func(t *testing.T) {
			mnt := testfs.MountExt4(t, 256<<20)
			_, _, d := tryDisk(t, filepath.Join(mnt, "pool"))
			if err := d.WriteAt(pattern(1, 8192), 0, false); err != nil {
				t.Fatal(err)
			}
			if err := m.write(d, pattern(2, 4096), 0); !errors.Is(err, ErrWouldBlock) {
				t.Fatalf("Try write on ext4: %v, want ErrWouldBlock", err)
			}
			if !d.v.files["root"].nw.writeOff.Load() {
				t.Fatal("ext4's refusal was not remembered")
			}
			if got := readBack(t, d, 0, 8192); !bytes.Equal(got, pattern(1, 8192)) {
				t.Fatal("a refused write changed the disk")
			}
			got := make([]byte, 8192)
			if err := m.read(d, got, 0); err != nil || !bytes.Equal(got, pattern(1, 8192)) {
				t.Fatalf("Try read of cached data on ext4: %v", err)
			}
		})
	}
}

// TestTryObeysTheRules: a Try write is checked like any write: range,
// read-only attachments, fencing, the writer role; and a write that would
// claim the role steps aside, since claiming takes the gate exclusively.
func TestTryObeysTheRules(t *testing.T) {
	for _, m := range tryModes {
		t.Run(m.name, func(t *testing.T) {
			p := openTestPool(t, t.TempDir())
			v := attachVM(t, p)
			src, dst, ro := mustAttach(t, v, "src", "rw"), mustAttach(t, v, "dst", "rw"), mustAttach(t, v, "ro", "ro")
			srcRoot, dstRoot, roRoot := mustOpen(t, src, "root"), mustOpen(t, dst, "root"), mustOpen(t, ro, "root")
			try := func(d Disk, off int64) error { return m.write(d, pattern(9, 4096), off) }

			if err := try(srcRoot, 0); !errors.Is(err, ErrWouldBlock) {
				t.Fatalf("first write of an attachment (claims the role): %v, want ErrWouldBlock", err)
			}
			if err := srcRoot.WriteAt(pattern(1, 4096), 0, false); err != nil {
				t.Fatal(err)
			}
			if err := try(srcRoot, 8*mib); !errors.Is(err, ErrOutOfRange) {
				t.Fatalf("write past the end: %v, want ErrOutOfRange", err)
			}
			if err := try(roRoot, 0); !errors.Is(err, ErrReadOnly) {
				t.Fatalf("write through a read-only attachment: %v, want ErrReadOnly", err)
			}
			if err := dstRoot.WriteAt(pattern(2, 4096), 4096, false); err != nil {
				t.Fatal(err)
			}
			if err := try(srcRoot, 0); !errors.Is(err, ErrFenced) {
				t.Fatalf("write of a fenced attachment: %v, want ErrFenced", err)
			}
			if got := readBack(t, dstRoot, 0, 4096); !bytes.Equal(got, pattern(1, 4096)) {
				t.Fatal("a fenced Try write was applied")
			}
		})
	}
}
