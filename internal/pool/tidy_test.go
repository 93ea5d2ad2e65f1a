package pool

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/quiverstorage/quiver/internal/fscap"
	"github.com/quiverstorage/quiver/internal/testfs"
)

// TestTidy: after tidyAfter copy-on-write writes into a chunk pinned by a
// snapshot, the tidier rewrites the chunk whole in the background (one
// extent of the image's own, owned), changing no byte of the disk or the
// snapshot; a chunk whose writes a capture shared meanwhile is left alone.
func TestTidy(t *testing.T) {
	const size = 4 * ChunkSize
	dir, v, d, want := pinnedDisk(t, size, true)
	ctx := context.Background()
	snapWant := bytes.Clone(want)
	img, err := os.Open(filepath.Join(dir, "volumes", "vm", "disks", "d.img"))
	if err != nil {
		t.Fatal(err)
	}
	defer img.Close()
	write := func(chunk, block int64, b byte) {
		t.Helper()
		off := chunk*ChunkSize + block*4096
		w := bytes.Repeat([]byte{b}, 4096)
		copy(want[off:], w)
		if err := d.WriteAt(w, off, false); err != nil {
			t.Fatal(err)
		}
	}
	// Chunk 1 takes tidyAfter writes; chunk 2 one write (not queued).
	for n := range tidyAfter {
		write(1, int64(3+7*n), byte(0x40+n))
	}
	write(2, 9, 0x50)
	df := v.files["d"]
	owned := func(i int64) bool {
		v.gate.RLock()
		defer v.gate.RUnlock()
		return df.ch.isOwned(i)
	}
	if owned(1) || owned(2) {
		t.Fatal("a chunk owned right after copy-on-write writes: the write path rewrote it")
	}
	deadline := time.Now().Add(tidyDelay + 5*time.Second)
	for !owned(1) {
		if time.Now().After(deadline) {
			t.Fatalf("chunk 1 not tidied %v after its writes", tidyDelay+5*time.Second)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err := d.Flush(); err != nil { // written back: the extent map as it will stay
		t.Fatal(err)
	}
	if solid, err := fscap.Solid(img, ChunkSize, ChunkSize); err != nil || !solid {
		t.Fatalf("chunk 1 after tidying: solid %v (%v), want one extent of its own", solid, err)
	}
	if owned(2) {
		t.Fatal("chunk 2, written once, was tidied")
	}
	got := make([]byte, size)
	if err := d.ReadAt(got, 0); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Fatal("the disk changed when its chunk was tidied")
	}
	snap, err := os.ReadFile(filepath.Join(dir, "volumes", "vm", "snapshots", "s", "d.img"))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(snap, snapWant) {
		t.Fatal("the snapshot changed when the disk's chunk was tidied")
	}

	// A capture between the writes and the tidier: the chunk is shared
	// anew, its count zeroed, and the queued rewrite does nothing.
	for n := range tidyAfter {
		write(3, int64(3+7*n), byte(0x60+n))
	}
	if _, _, err := v.CreateSnapshot(ctx, "s2", nil); err != nil {
		t.Fatal(err)
	}
	time.Sleep(tidyDelay + 500*time.Millisecond)
	if owned(3) {
		t.Fatal("chunk 3, shared by a snapshot after its writes, was tidied")
	}
	if err := d.ReadAt(got, 0); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Fatal("the disk does not read back what was written")
	}
}

// TestTidyAcrossCaptures: a chunk that takes one copy-on-write write
// between every two snapshots (each capture zeroes its count) is still
// tidied once it has taken more than fragAfter since it was last rewritten
// whole, and lands in one extent (the images' copy-on-write extent size
// is one block, so XFS reserves nothing around the writes that the rewrite
// would take apart); the disk and every snapshot keep their content.
func TestTidyAcrossCaptures(t *testing.T) {
	const size = 2 * ChunkSize
	dir, v, d, want := pinnedDisk(t, size, true)
	ctx := context.Background()
	df := v.files["d"]
	owned := func(i int64) bool {
		v.gate.RLock()
		defer v.gate.RUnlock()
		return df.ch.isOwned(i)
	}
	snaps := map[string][]byte{"s": bytes.Clone(want)}
	for n := range fragAfter + 1 {
		if n > 0 {
			name := fmt.Sprintf("e%d", n)
			if _, _, err := v.CreateSnapshot(ctx, name, nil); err != nil {
				t.Fatal(err)
			}
			snaps[name] = bytes.Clone(want)
		}
		off := ChunkSize + int64(16*n+1)*4096 // apart: each write splits a shared extent
		w := bytes.Repeat([]byte{byte(0x30 + n)}, 4096)
		copy(want[off:], w)
		if err := d.WriteAt(w, off, false); err != nil {
			t.Fatal(err)
		}
		if n < fragAfter {
			time.Sleep(tidyDelay / 10)
			if owned(1) {
				t.Fatalf("chunk 1 tidied after %d writes, one per capture", n+1)
			}
		}
	}
	deadline := time.Now().Add(tidyDelay + 5*time.Second)
	for !owned(1) {
		if time.Now().After(deadline) {
			t.Fatalf("chunk 1 not tidied after %d copy-on-write writes, one per capture", fragAfter+1)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err := d.Flush(); err != nil {
		t.Fatal(err)
	}
	img, err := os.Open(filepath.Join(dir, "volumes", "vm", "disks", "d.img"))
	if err != nil {
		t.Fatal(err)
	}
	defer img.Close()
	em, err := fscap.ExtentMap(img)
	if err != nil {
		t.Fatal(err)
	}
	records := 0
	for _, e := range em {
		if e.Logical < 2*ChunkSize && e.Logical+e.Length > ChunkSize {
			records++
		}
	}
	if records != 1 {
		t.Fatalf("chunk 1 after tidying: %d extent records, want 1", records)
	}
	got := make([]byte, size)
	if err := d.ReadAt(got, 0); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Fatal("the disk changed when its chunk was tidied")
	}
	for name, content := range snaps {
		b, err := os.ReadFile(filepath.Join(dir, "volumes", "vm", "snapshots", name, "d.img"))
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(b, content) {
			t.Fatalf("snapshot %s changed when the disk's chunk was tidied", name)
		}
	}
}

// TestTryWriteIntoPinnedChunk: right after a snapshot, the non-blocking
// write path (TryWriteAt, TryBatch) takes a write into a chunk wholly
// pinned by the snapshot itself, by XFS's copy on write, instead of
// refusing it: the disk reads it back, the snapshot keeps its content, the
// chunk stays unowned with its count, and after cowWrites such writes, or
// across two chunks, it refuses (the ordinary write path then).
func TestTryWriteIntoPinnedChunk(t *testing.T) {
	const size = 4 * ChunkSize
	dir, v, d, want := pinnedDisk(t, size, false)
	snapWant := bytes.Clone(want)
	nb := d.(Nonblocking)
	block := func(b byte) []byte { return bytes.Repeat([]byte{b}, 4096) }
	df := v.files["d"]
	for n := range cowWrites {
		off := ChunkSize + int64(1+2*n)*4096
		if err := nb.TryWriteAt(block(byte(0x30+n)), off); err != nil {
			t.Fatalf("try write %d into a pinned chunk: %v", n, err)
		}
		copy(want[off:], block(byte(0x30+n)))
	}
	if df.ch.isOwned(1) || df.ch.cow[1] != cowWrites {
		t.Fatalf("chunk 1 after %d copy-on-write writes: owned %v, count %d", cowWrites, df.ch.isOwned(1), df.ch.cow[1])
	}
	if err := nb.TryWriteAt(block(0x40), ChunkSize+100*4096); !errors.Is(err, ErrWouldBlock) {
		t.Fatalf("a try write past cowWrites: %v, want ErrWouldBlock", err)
	}
	if err := nb.TryWriteAt(block(0x41), 2*ChunkSize-2048); !errors.Is(err, ErrWouldBlock) {
		t.Fatalf("a try write across two chunks: %v, want ErrWouldBlock", err)
	}
	// A batch: two writes into pinned chunks 2 and 3, done by the batch.
	ios := []IO{{P: block(0x50), Off: 2*ChunkSize + 4096, Write: true}, {P: block(0x51), Off: 3*ChunkSize + 8192, Write: true}}
	d.(Batcher).TryBatch(ios)
	for i, x := range ios {
		if x.Err != nil {
			t.Fatalf("batch write %d into a pinned chunk: %v", i, x.Err)
		}
		copy(want[x.Off:], x.P)
	}
	if df.ch.cow[2] != 1 || df.ch.cow[3] != 1 {
		t.Fatalf("chunks 2 and 3 after a batch write each: counts %d, %d", df.ch.cow[2], df.ch.cow[3])
	}
	got := make([]byte, size)
	if err := d.ReadAt(got, 0); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Fatal("the disk does not read back the try writes")
	}
	snap, err := os.ReadFile(filepath.Join(dir, "volumes", "vm", "snapshots", "s", "d.img"))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(snap, snapWant) {
		t.Fatal("the snapshot changed under the try writes")
	}
}

// pinnedDisk makes a pool on XFS with volume vm of one disk d of size
// bytes, written full of 0x11 and flushed, and snapshot s of it (which the
// disk pins): what the first writes after a snapshot meet. tidy false turns
// the tidier off. It returns the pool's directory, the volume, the open
// disk (closed at the end of the test) and the disk's content.
func pinnedDisk(t *testing.T, size int64, tidy bool) (string, *Volume, Disk, []byte) {
	t.Helper()
	return pinnedDiskWith(t, size, tidy, false)
}

// pinnedDiskWith is pinnedDisk; with legacy, the image is given the 1 MiB
// extent size hint the pool set on images before session 27 (while still
// empty, as XFS requires), so that the disk opens with the copy-on-write
// extent size that hint keeps (cloneRewrite off).
func pinnedDiskWith(t *testing.T, size int64, tidy, legacy bool) (string, *Volume, Disk, []byte) {
	t.Helper()
	dir := filepath.Join(testfs.MountXFS(t, 300<<20), "pool")
	ctx := context.Background()
	p, err := OpenWith(ctx, dir, Options{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	if p.us == nil {
		t.Fatalf("a pool on XFS (caps %+v) without its unshare guard", p.Caps())
	}
	p.us.tidy.off = !tidy
	mustCreate(t, p, VolumeSpec{Name: "vm", Capacity: size, Disks: []DiskSpec{{Name: "d", Size: size}}})
	v, _ := p.Volume("vm")
	if legacy {
		img, err := os.OpenFile(filepath.Join(dir, "volumes", "vm", "disks", "d.img"), os.O_RDWR, 0)
		if err != nil {
			t.Fatal(err)
		}
		err = fscap.SetExtentSizeHint(img, ExtentSizeHint)
		_ = img.Close()
		if err != nil {
			t.Fatal(err)
		}
	}
	d, err := v.OpenDisk("d")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	if df := v.files["d"]; df.cloneRewrite == legacy {
		t.Fatalf("legacy %v: the disk opened with cloneRewrite %v", legacy, df.cloneRewrite)
	}
	want := bytes.Repeat([]byte{0x11}, int(size))
	if err := d.WriteAt(want, 0, true); err != nil {
		t.Fatal(err)
	}
	if _, _, err := v.CreateSnapshot(ctx, "s", nil); err != nil {
		t.Fatal(err)
	}
	return dir, v, d, want
}
