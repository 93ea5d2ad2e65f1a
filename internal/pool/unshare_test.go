package pool

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/quiverstorage/quiver/internal/faultio"
	"github.com/quiverstorage/quiver/internal/fscap"
	"github.com/quiverstorage/quiver/internal/storage"
	"github.com/quiverstorage/quiver/internal/testfs"
)

// TestInPlaceOverwriteAfterCopyOnWrite is the clone leak of
// docs/durability.md, made deterministic (unshare.go explains it). A
// volume is cloned; the clone writes a chunk, which XFS copies on write,
// and writes it back, which remaps the clone onto new blocks in XFS's log
// in memory and leaves the old blocks to the source alone; the source
// then writes a block of that chunk and flushes; XFS shuts down as in a
// crash and its log is replayed. The clone must hold its old data or its
// new write there, never the source's.
//
// Without the guard (the "unguarded" subtest) the source's write goes in
// place and its flush forces nothing, and the clone shows the source's data
// after the crash: that is the kernel's behaviour this test relies on, and
// where a kernel no longer shows it the unguarded subtest skips and says so.
// With it, the source's first write into the chunk forces the log first.
// In the "pinned" subtest the source has a snapshot, pinned for its first
// writes, taken before it wrote the chunk again and was cloned: the chunk's
// blocks are then not the snapshot's, and the write must not be left to
// copy on write (unshare.go), which would go in place.
func TestInPlaceOverwriteAfterCopyOnWrite(t *testing.T) {
	for _, c := range []struct {
		name            string
		guarded, pinned bool
	}{{"unguarded", false, false}, {"guarded", true, false}, {"pinned", true, true}} {
		guarded := c.guarded
		t.Run(c.name, func(t *testing.T) {
			leaked := cloneLeakAfterCrash(t, guarded, c.pinned)
			switch {
			case guarded && leaked:
				t.Fatal("the clone holds the source's write after the crash: data of one volume in another")
			case !guarded && !leaked:
				t.Skip("without the guard the clone kept its data: this kernel does not overwrite a block in place before the copy on write that unshared it is durable")
			}
		})
	}
}

// cloneLeakAfterCrash runs the scenario and reports whether the clone's
// block holds the source's write after the crash.
func cloneLeakAfterCrash(t *testing.T, guarded, pinned bool) bool {
	const size = 2 * ChunkSize
	const blk = 16 * 4096 // in chunk 0
	fill := func(b byte, n int) []byte { return bytes.Repeat([]byte{b}, n) }
	p, dir, sd := clonedOnXFSWith(t, size, guarded, pinned)
	mnt := filepath.Dir(dir)
	ctx := context.Background()
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	closed := false
	defer func() {
		if !closed {
			_ = p.Close()
		}
	}()
	dst, _ := p.Volume("dst")
	dd, err := dst.OpenDisk("d")
	if err != nil {
		t.Fatal(err)
	}
	// The clone rewrites chunk 0 and does not flush; its writeback (here
	// forced, in a VM's life the kernel's flusher) remaps it.
	if err := dd.WriteAt(fill(0x22, ChunkSize), 0, false); err != nil {
		t.Fatal(err)
	}
	dstImg, err := os.Open(filepath.Join(dir, "volumes", "dst", "disks", "d.img"))
	if err != nil {
		t.Fatal(err)
	}
	err = unix.SyncFileRange(int(dstImg.Fd()), 0, ChunkSize,
		unix.SYNC_FILE_RANGE_WAIT_BEFORE|unix.SYNC_FILE_RANGE_WRITE|unix.SYNC_FILE_RANGE_WAIT_AFTER)
	_ = dstImg.Close()
	if err != nil {
		t.Fatal(err)
	}
	srcImg, err := os.Open(filepath.Join(dir, "volumes", "src", "disks", "d.img"))
	if err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		data, shared, err := fscap.Sharing(srcImg, 0, ChunkSize)
		if err != nil {
			t.Fatal(err)
		}
		if data && !shared {
			break // the source owns chunk 0 alone, in memory
		}
		if time.Now().After(deadline) {
			t.Fatal("the source's chunk 0 is still shared 10 s after the clone's writeback")
		}
	}
	_ = srcImg.Close()
	// The source writes one block of chunk 0 and flushes it.
	if err := sd.WriteAt(fill(0x33, 4096), blk, false); err != nil {
		t.Fatal(err)
	}
	if err := sd.Flush(); err != nil {
		t.Fatal(err)
	}

	if err := testfs.ShutdownXFS(mnt); err != nil {
		t.Fatal(err)
	}
	_ = sd.Close()
	_ = dd.Close()
	_ = p.Close()
	closed = true
	if err := testfs.Remount(mnt); err != nil {
		t.Fatal(err)
	}
	p, err = Open(ctx, dir, log)
	if err != nil {
		t.Fatal(err)
	}
	closed = false
	read := func(vol string) byte {
		v, err := p.Volume(vol)
		if err != nil {
			t.Fatal(err)
		}
		d, err := v.OpenDisk("d")
		if err != nil {
			t.Fatal(err)
		}
		defer d.Close()
		b := make([]byte, 4096)
		if err := d.ReadAt(b, blk); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(b, fill(b[0], 4096)) {
			t.Fatalf("%s: block %d is torn", vol, blk/4096)
		}
		return b[0]
	}
	if got := read("src"); got != 0x33 {
		t.Errorf("source block after the crash holds %#x, want its flushed write 0x33", got)
	}
	got := read("dst")
	t.Logf("guarded=%v: after the crash the clone's block holds %#x (0x11 its old data, 0x22 its unflushed write, 0x33 the source's write)", guarded, got)
	if got != 0x11 && got != 0x22 && got != 0x33 {
		t.Errorf("clone block holds %#x, none of the writes", got)
	}
	return got == 0x33
}

// TestUnshareZeroEdges: on XFS, trims and zeroes whose ends are not on a
// 4 KiB block write their partial blocks through the guarded write path;
// both a volume and its clone must read back exactly what was asked.
func TestUnshareZeroEdges(t *testing.T) {
	mnt := testfs.MountXFS(t, 300<<20)
	p := openTestPool(t, filepath.Join(mnt, "pool"))
	if p.us == nil {
		t.Fatalf("a pool on XFS has no unsharer (caps %+v)", p.Caps())
	}
	const size = 2 * ChunkSize
	mustCreate(t, p, VolumeSpec{Name: "a", Capacity: size, Disks: []DiskSpec{{Name: "d", Size: size}}})
	va, _ := p.Volume("a")
	da, err := va.OpenDisk("d")
	if err != nil {
		t.Fatal(err)
	}
	defer da.Close()
	full := bytes.Repeat([]byte{0x5a}, size)
	if err := da.WriteAt(full, 0, true); err != nil {
		t.Fatal(err)
	}
	if _, err := p.Clone(context.Background(), CloneRequest{Source: Source{Volume: "a"}, Names: []string{"b"}}, nil); err != nil {
		t.Fatal(err)
	}
	vb, _ := p.Volume("b")
	db, err := vb.OpenDisk("d")
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	models := map[Disk][]byte{da: bytes.Clone(full), db: bytes.Clone(full)}
	ops := []struct {
		d        Disk
		off, len int64
		trim     bool
	}{
		{da, 100, 200, true},                 // inside one block
		{da, 4096 - 512, 8192 + 1024, false}, // both edges partial, two whole blocks between
		{db, 512, 4096, true},                // across a block boundary
		{db, ChunkSize - 1000, 3000, false},  // across the chunk boundary
		{da, 3 * 4096, 4096, true},           // whole block
		{db, size - 700, 700, false},         // the disk's last bytes
	}
	for _, op := range ops {
		var err error
		if op.trim {
			err = op.d.Trim(op.off, op.len, false)
		} else {
			err = op.d.Zero(op.off, op.len, 0)
		}
		if err != nil {
			t.Fatalf("zero %d+%d: %v", op.off, op.len, err)
		}
		clear(models[op.d][op.off : op.off+op.len])
	}
	for d, want := range models {
		got := make([]byte, size)
		if err := d.ReadAt(got, 0); err != nil {
			t.Fatal(err)
		}
		if i := firstDiff(got, want); i >= 0 {
			t.Errorf("byte %d holds %#x, want %#x", i, got[i], want[i])
		}
	}
}

// Every log force changes the barrier's size, also the first force after a
// failed one: a truncate to the size the file already has changes no
// metadata fdatasync forces. (The first version flipped a flag per force
// and made a new, empty barrier after a failure, so the force after a
// failed first one truncated it to 0 and forced nothing.)
func TestForceLogChangesTheBarrierAfterAFailure(t *testing.T) {
	dir := t.TempDir()
	osfs, err := storage.OpenOS(dir)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "pool.lock"), []byte("1234\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	fio := faultio.New(osfs)
	lock, err := fio.OpenFile("pool.lock", os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer lock.Close()
	u, err := newUnsharer(fio, lock)
	if err != nil {
		t.Fatal(err)
	}
	size := func() int64 {
		t.Helper()
		fi, err := os.Stat(filepath.Join(dir, "pool.lock"))
		if err != nil {
			t.Fatal(err)
		}
		return fi.Size()
	}
	for i, fail := range []bool{true, false, false, true, true, false, false, true} {
		before := size()
		if fail {
			fio.FailSync(1, unix.EIO)
		}
		err := u.forceLog()
		if fail != (err != nil) {
			t.Fatalf("force %d (sync failing: %v): %v", i, fail, err)
		}
		if after := size(); after == before {
			t.Fatalf("force %d left the barrier at %d bytes: it forced nothing", i, after)
		}
	}
	u.close()
	if b, err := os.ReadFile(filepath.Join(dir, "pool.lock")); err != nil || string(b) != "1234\n" {
		t.Fatalf("pool.lock after close: %q, %v; want its PID line alone", b, err)
	}
}

// On a pool too full for a chunk's worth of new blocks, the first write
// into a shared chunk still succeeds: it falls back to cloning just the
// blocks under the write. And after a restart, an overwrite of data the
// image owns alone still succeeds on the full pool, though it must first
// force the log (through pool.lock: no file is made). (Until session 16 the
// fallback's scratch file kept the 1 MiB extent size hint, and XFS reserved
// the whole hint-aligned extent for its 4 KiB: the fallback failed too.)
func TestUnshareOnAFullPool(t *testing.T) {
	const size = 4 * ChunkSize
	fill := func(b byte, n int) []byte { return bytes.Repeat([]byte{b}, n) }
	p, dir, sd := clonedOnXFS(t, size, true)
	mnt := filepath.Dir(dir)
	ctx := context.Background()
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	defer func() { _ = p.Close() }()
	// Chunk 0 the source's own: rewritten whole after the clone.
	if err := sd.WriteAt(fill(0x22, ChunkSize), 0, true); err != nil {
		t.Fatal(err)
	}

	// Leave about 256 KiB free: less than a chunk.
	filler, err := os.Create(filepath.Join(mnt, "filler"))
	if err != nil {
		t.Fatal(err)
	}
	defer filler.Close()
	free := func() int64 {
		var st unix.Statfs_t
		if err := unix.Statfs(mnt, &st); err != nil {
			t.Fatal(err)
		}
		return int64(st.Bavail) * st.Bsize
	}
	var at int64
	for f := free(); f > 256<<10; f = free() {
		n := (f - 256<<10) &^ 4095
		if n == 0 {
			break
		}
		if err := unix.Fallocate(int(filler.Fd()), 0, at, n); err != nil {
			t.Fatalf("fallocate %d bytes of filler: %v", n, err)
		}
		at += n
	}
	if f := free(); f >= ChunkSize/2 {
		t.Fatalf("%d bytes free after filling, want less than half a chunk", f)
	}

	// Shared chunk 1: the whole-chunk clone cannot fit, the 4 KiB one can.
	blk := ChunkSize + 8*4096
	if err := sd.WriteAt(fill(0x33, 4096), int64(blk), true); err != nil {
		t.Fatalf("first write into a shared chunk on a full pool (%d bytes free): %v", free(), err)
	}
	got := make([]byte, size)
	if err := sd.ReadAt(got, 0); err != nil {
		t.Fatal(err)
	}
	want := fill(0x11, size)
	copy(want, fill(0x22, ChunkSize))
	copy(want[blk:], fill(0x33, 4096))
	if !bytes.Equal(got, want) {
		t.Fatal("the source does not read its data and its new write")
	}
	dst, _ := p.Volume("dst")
	dd, err := dst.OpenDisk("d")
	if err != nil {
		t.Fatal(err)
	}
	if err := dd.ReadAt(got, 0); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, fill(0x11, size)) {
		t.Fatal("the clone changed with its source's write")
	}
	_ = dd.Close()

	// Fill the pool to the last block: no file can be made now.
	for ; ; at += 4096 {
		if err := unix.Fallocate(int(filler.Fd()), 0, at, 4096); err != nil {
			break
		}
	}
	if f, err := os.Create(filepath.Join(mnt, "one-more")); err == nil {
		f.Close()
		t.Logf("a file could still be made with %d bytes free", free())
	}

	// After a restart every chunk is unowned again: an overwrite in chunk
	// 0, which holds data shared with nothing, forces the log first,
	// without making a file (its barrier is pool.lock).
	_ = sd.Close()
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	if p, err = Open(ctx, dir, log); err != nil {
		t.Fatalf("open the full pool: %v", err)
	}
	if p.us == nil {
		t.Fatalf("the full pool opened without its unsharer (caps %+v)", p.Caps())
	}
	src, _ := p.Volume("src")
	if sd, err = src.OpenDisk("d"); err != nil {
		t.Fatal(err)
	}
	defer sd.Close()
	forces := p.us.done.Load()
	if err := sd.WriteAt(fill(0x44, 4096), 4096, true); err != nil {
		t.Fatalf("overwrite of the image's own block on a full pool after a restart (%d bytes free): %v", free(), err)
	}
	if p.us.done.Load() == forces {
		t.Fatal("the overwrite of a block a copy on write left to the image forced no log")
	}
}

// clonedOnXFS makes a pool on a new XFS (in its directory pool), volume src
// with one disk d of size bytes written whole (0x11) and flushed, and its
// live clone dst; it returns the pool and src/d open. Without guarded the
// pool's unshare guard is off.
func clonedOnXFS(t *testing.T, size int64, guarded bool) (*Pool, string, Disk) {
	t.Helper()
	return clonedOnXFSWith(t, size, guarded, false)
}

// clonedOnXFSWith is clonedOnXFS; with pinned, src is first written whole
// (0x10) and snapshotted (snapshot "s", pinned for its first writes), and
// the later write of 0x11 leaves it no block of the snapshot's.
func clonedOnXFSWith(t *testing.T, size int64, guarded, pinned bool) (*Pool, string, Disk) {
	t.Helper()
	dir := filepath.Join(testfs.MountXFS(t, 300<<20), "pool")
	ctx := context.Background()
	p, err := OpenWith(ctx, dir, Options{Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), NoUnshareGuard: !guarded})
	if err != nil {
		t.Fatal(err)
	}
	if !p.Caps().Reflink || (p.us != nil) != guarded {
		p.Close()
		t.Fatalf("a pool on XFS (caps %+v): unsharer %v, want %v", p.Caps(), p.us != nil, guarded)
	}
	mustCreate(t, p, VolumeSpec{Name: "src", Capacity: size, Disks: []DiskSpec{{Name: "d", Size: size}}})
	src, _ := p.Volume("src")
	sd, err := src.OpenDisk("d")
	if err == nil && pinned {
		if err = sd.WriteAt(bytes.Repeat([]byte{0x10}, int(size)), 0, true); err == nil {
			_, _, err = src.CreateSnapshot(ctx, "s", nil)
		}
	}
	if err == nil {
		err = sd.WriteAt(bytes.Repeat([]byte{0x11}, int(size)), 0, true)
	}
	if err == nil && pinned {
		err = checkPinnedNowhere(p, "src", "d")
	}
	if err == nil {
		_, err = p.Clone(ctx, CloneRequest{Source: Source{Volume: "src"}, Names: []string{"dst"}}, nil)
	}
	if err != nil {
		p.Close()
		t.Fatal(err)
	}
	return p, dir, sd
}

// checkPinnedNowhere checks that disk d of volume vol has a pin and shares
// no block with it.
func checkPinnedNowhere(p *Pool, vol, d string) error {
	v, err := p.Volume(vol)
	if err != nil {
		return err
	}
	v.gate.RLock()
	defer v.gate.RUnlock()
	df := v.files[d]
	if df == nil || df.pin == nil {
		return fmt.Errorf("disk %s of %s has no pin", d, vol)
	}
	for off := int64(0); off < df.size; off += 4096 {
		same, err := df.f.SameBlocks(df.pin, off, 4096)
		if err != nil {
			return err
		}
		if same {
			return fmt.Errorf("disk %s of %s still shares block %d with its pin", d, vol, off/4096)
		}
	}
	return nil
}

// TestFirstWritesIntoPinnedBlocks: after a snapshot, which the disk pins,
// the first cowWrites writes into a chunk are left to XFS's copy on write:
// each takes new blocks under itself only, and the rest of the chunk stays
// shared with the snapshot (no 1 MiB rewrite); the next write into the
// chunk rewrites it whole, into blocks of its own in one extent. The
// snapshot keeps its content throughout, and deleting it drops the pin.
func TestFirstWritesIntoPinnedBlocks(t *testing.T) {
	for _, legacy := range []bool{false, true} {
		t.Run(map[bool]string{false: "clone rewrite", true: "legacy hint"}[legacy], func(t *testing.T) {
			firstWritesIntoPinnedBlocks(t, legacy)
		})
	}
}

func firstWritesIntoPinnedBlocks(t *testing.T, legacy bool) {
	const size = 2 * ChunkSize
	dir, v, d, want := pinnedDiskWith(t, size, false, legacy)
	ctx := context.Background()
	img, err := os.Open(filepath.Join(dir, "volumes", "vm", "disks", "d.img"))
	if err != nil {
		t.Fatal(err)
	}
	defer img.Close()
	snap, err := os.Open(filepath.Join(dir, "volumes", "vm", "snapshots", "s", "d.img"))
	if err != nil {
		t.Fatal(err)
	}
	defer snap.Close()
	same := func(off, n int64) bool {
		t.Helper()
		ok, err := fscap.SameBlocks(img, snap, off, n)
		if err != nil {
			t.Fatal(err)
		}
		return ok
	}
	if !same(0, size) {
		t.Fatal("the image does not share its blocks with the snapshot just taken")
	}
	// cowWrites writes into chunk 0, each flushed (written back, remapped).
	var blocks []int64
	for n := range cowWrites + 1 {
		blocks = append(blocks, int64(5+4*n))
	}
	for n, b := range blocks[:cowWrites] {
		w := bytes.Repeat([]byte{byte(0x20 + n)}, 4096)
		copy(want[b*4096:], w)
		if err := d.WriteAt(w, b*4096, true); err != nil {
			t.Fatal(err)
		}
		if same(b*4096, 4096) {
			t.Fatalf("write %d: block %d still shared with the snapshot", n, b)
		}
		// The blocks before and after it, not written, stay shared.
		if !same(b*4096-4096, 4096) || !same(b*4096+4096, 4096) {
			t.Fatalf("write %d into block %d unshared more than its block: the chunk was rewritten", n, b)
		}
	}
	// The next write rewrites the chunk whole.
	b := blocks[cowWrites]
	copy(want[b*4096:], bytes.Repeat([]byte{0x30}, 4096))
	if err := d.WriteAt(want[b*4096:(b+1)*4096], b*4096, true); err != nil {
		t.Fatal(err)
	}
	for off := int64(0); off < ChunkSize; off += 4096 {
		if same(off, 4096) {
			t.Fatalf("after write %d, block %d of chunk 0 is still the snapshot's: the chunk was not rewritten", cowWrites+1, off/4096)
		}
	}
	if solid, err := fscap.Solid(img, 0, ChunkSize); err != nil || !solid {
		t.Fatalf("chunk 0 after its rewrite: solid %v (%v), want one extent of its own", solid, err)
	}
	if !same(ChunkSize, ChunkSize) {
		t.Fatal("chunk 1, never written, no longer shared with the snapshot")
	}
	got := make([]byte, size)
	if err := d.ReadAt(got, 0); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Fatal("the disk does not read back what was written")
	}
	if _, err := snap.ReadAt(got, 0); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, bytes.Repeat([]byte{0x11}, size)) {
		t.Fatal("the snapshot changed")
	}
	if err := v.DeleteSnapshot(ctx, "s"); err != nil {
		t.Fatal(err)
	}
	v.gate.RLock()
	pinned := v.files["d"].pin
	v.gate.RUnlock()
	if pinned != nil {
		t.Fatal("the disk still pins its deleted snapshot")
	}
}
