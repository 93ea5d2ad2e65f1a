package replica

import (
	"bytes"
	"context"
	"errors"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/quiverstorage/quiver/internal/storage"
)

func openFS(t *testing.T) storage.FS {
	t.Helper()
	fsys, err := storage.OpenOS(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = fsys.Close() })
	return fsys
}

// TestBitmapPersists: marks survive a close and reopen (a primary restart);
// a bitmap for another disk size or granule is refused; Remove deletes it.
func TestBitmapPersists(t *testing.T) {
	fsys := openFS(t)
	rel := BitmapPath("uid1", "root", "n2")
	b, created, err := OpenBitmap(fsys, rel, diskSize, 64<<10)
	if err != nil || !created {
		t.Fatalf("open: %v, created %v", err, created)
	}
	if err := b.Mark(100, 1); err != nil {
		t.Fatal(err)
	}
	if err := b.Mark(5<<20, 200<<10); err != nil { // 4 granules
		t.Fatal(err)
	}
	if err := b.Mark(diskSize-1, 1000); err != nil { // the last, cut at the end
		t.Fatal(err)
	}
	want := b.Ranges()
	b.Close() // without a Remove, as a crash would
	b2, created, err := OpenBitmap(fsys, rel, diskSize, 64<<10)
	if err != nil || created {
		t.Fatalf("reopen: %v, created %v", err, created)
	}
	if n, _ := b2.Granules(); n != 6 || len(b2.Ranges()) != 6 {
		t.Fatalf("after reopen: %d granules %v, want 6 as %v", n, b2.Ranges(), want)
	}
	for i, r := range b2.Ranges() {
		if r != want[i] {
			t.Fatalf("range %d: %v, want %v", i, r, want[i])
		}
	}
	b2.Close()
	if _, _, err := OpenBitmap(fsys, rel, diskSize, 1<<20); !errors.Is(err, ErrBitmap) {
		t.Fatalf("another granule: %v", err)
	}
	b3, _, err := OpenBitmap(fsys, rel, diskSize, 64<<10)
	if err != nil {
		t.Fatal(err)
	}
	if err := b3.Remove(); err != nil {
		t.Fatal(err)
	}
	if _, err := fsys.Lstat(rel); err == nil {
		t.Fatal("the bitmap is still there after Remove")
	}
}

// TestResyncUnderWrites: the copy is cut, writes go on degraded (and are
// marked, durably, in a bitmap that a new Set finds again, as after a
// primary restart), then the copy is back: the resync copies exactly the
// dirty granules while four writers keep writing, including into granules
// being copied, and Rejoin puts the copy back in sync. Afterwards the copy
// is byte-identical to the primary and gets every write as in sync.
func TestResyncUnderWrites(t *testing.T) {
	_, local := openDisk(t)
	copyPool, copyDisk := openDisk(t)
	px := serveCopy(t, copyPool)
	backend := px.backend
	fsys := openFS(t)
	oos := &outOfSync{}
	opts := Options{Timeout: 5 * time.Second, OutOfSync: oos.record,
		Bitmap: func(node string) (*Bitmap, bool, error) {
			return OpenBitmap(fsys, BitmapPath("uid", "root", node), diskSize, DefaultGranule)
		}}
	s, err := NewSet(context.Background(), diskSize, []Copy{{Node: "b", Addr: px.ln.Addr().String(), Export: "vm/root"}}, nil, opts)
	if err != nil {
		t.Fatal(err)
	}
	d := s.Disk(local)
	if err := d.WriteAt(bytes.Repeat([]byte{1}, 1<<20), 0, false); err != nil {
		t.Fatal(err)
	}
	if err := d.Flush(); err != nil {
		t.Fatal(err)
	}
	px.cut()
	var written, rounded int64
	r := rand.New(rand.NewPCG(7, 7))
	buf := make([]byte, 8<<10)
	for range 40 {
		off := r.Int64N(diskSize/4096-2) * 4096
		for i := range buf {
			buf[i] = byte(r.Uint32())
		}
		if err := d.WriteAt(buf, off, false); err != nil {
			t.Fatal(err)
		}
		written += int64(len(buf))
		rounded += spanOf(off, int64(len(buf)))
	}
	if got := s.InSync(); len(got) != 0 {
		t.Fatalf("in sync after the cut: %v", got)
	}
	dirty, _ := s.Bitmap("b").Granules()
	// As after a restart of the primary: a new Set with the copy out of
	// sync finds the bitmap on disk.
	s.Close()
	s, err = NewSet(context.Background(), diskSize, nil, []string{"b"}, opts)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if n, _ := s.Bitmap("b").Granules(); n != dirty || n == 0 {
		t.Fatalf("bitmap after the restart: %d granules, before %d", n, dirty)
	}
	d = s.Disk(local)
	if err := d.WriteAt(bytes.Repeat([]byte{9}, 4096), diskSize-4096, true); err != nil {
		t.Fatal(err)
	}
	dirty, _ = s.Bitmap("b").Granules()
	written += 4096
	rounded += spanOf(diskSize-4096, 4096)

	px2 := newProxy(t, backend)
	rs, err := s.BeginResync(context.Background(), Copy{Node: "b", Addr: px2.ln.Addr().String(), Export: "vm/root"})
	if err != nil {
		t.Fatal(err)
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var during atomic.Int64
	for w := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := rand.New(rand.NewPCG(uint64(w), 3))
			b := make([]byte, 4096)
			for {
				select {
				case <-stop:
					return
				default:
				}
				// Half of them into dirty granules, being copied.
				off := r.Int64N(diskSize/4096) * 4096
				if w%2 == 0 {
					rg := rs.ranges[r.IntN(len(rs.ranges))]
					off = rg[0] + r.Int64N(rg[1]/4096)*4096
				}
				for i := range b {
					b[i] = byte(r.Uint32())
				}
				if err := d.WriteAt(b, off, false); err != nil {
					t.Error(err)
					return
				}
				during.Add(1)
			}
		}()
	}
	slow := func(ctx context.Context, n int) error { time.Sleep(time.Millisecond); return nil }
	if err := rs.Run(context.Background(), local, slow); err != nil {
		t.Fatal(err)
	}
	committed := false
	if err := Rejoin([]*Resync{rs}, func() error { committed = true; return nil }); err != nil || !committed {
		t.Fatalf("rejoin: %v (committed %v)", err, committed)
	}
	close(stop)
	wg.Wait()
	if err := d.WriteAt(bytes.Repeat([]byte{7}, 4096), 0, false); err != nil {
		t.Fatal(err)
	}
	if err := d.Flush(); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(contents(t, local), contents(t, copyDisk)) {
		t.Fatal("the copy differs from the primary after the resync")
	}
	if got := s.InSync(); len(got) != 1 || got[0] != "b" {
		t.Fatalf("in sync after the rejoin: %v", got)
	}
	if s.Bitmap("b") != nil {
		t.Fatal("a bitmap is left after the rejoin")
	}
	if _, err := fsys.Lstat(BitmapPath("uid", "root", "b")); err == nil {
		t.Fatal("the bitmap file is left after the rejoin")
	}
	if rs.Copied() != int64(dirty)*DefaultGranule {
		t.Fatalf("copied %d bytes, want %d granules", rs.Copied(), dirty)
	}
	if rs.Copied() > 2*rounded {
		t.Fatalf("copied %d bytes for %d written meanwhile (%d rounded up to granules)", rs.Copied(), written, rounded)
	}
	t.Logf("written while degraded %d B (%d B rounded up to granules), copied %d B (%d granules; %d B of data), %d writes during the resync",
		written, rounded, rs.Copied(), dirty, rs.Sent(), during.Load())
}

// TestResyncStopsOnCopyFailure: a copy that fails during its resync stops
// the resync and leaves the bitmap whole; requests are not failed by it.
func TestResyncStopsOnCopyFailure(t *testing.T) {
	_, local := openDisk(t)
	copyPool, _ := openDisk(t)
	px := serveCopy(t, copyPool)
	oos := &outOfSync{}
	s, err := NewSet(context.Background(), diskSize, nil, []string{"b"}, Options{Timeout: time.Second, OutOfSync: oos.record})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	d := s.Disk(local)
	if n, _ := s.Bitmap("b").Granules(); n != 0 {
		t.Fatalf("an out-of-sync copy without a bitmap has missed nothing, yet %d granules are dirty", n)
	}
	// A new copy: everything dirty.
	if err := s.MarkWhole("b"); err != nil {
		t.Fatal(err)
	}
	if n, _ := s.Bitmap("b").Granules(); n != diskSize/DefaultGranule {
		t.Fatalf("a copy without a bitmap: %d granules dirty", n)
	}
	rs, err := s.BeginResync(context.Background(), Copy{Node: "b", Addr: px.ln.Addr().String(), Export: "vm/root"})
	if err != nil {
		t.Fatal(err)
	}
	px.cut()
	if err := d.WriteAt(make([]byte, 4096), 0, false); err != nil {
		t.Fatalf("a write with the resyncing copy cut: %v", err)
	}
	if err := rs.Run(context.Background(), local, nil); !errors.Is(err, ErrResync) {
		t.Fatalf("run: %v", err)
	}
	if err := Rejoin([]*Resync{rs}, func() error { t.Fatal("committed"); return nil }); err == nil {
		t.Fatal("rejoin of a stopped resync")
	}
	if n, _ := s.Bitmap("b").Granules(); n != diskSize/DefaultGranule {
		t.Fatalf("bitmap after the stop: %d granules", n)
	}
	if nodes, _ := oos.reported(); len(nodes) != 0 {
		t.Fatalf("recorded out of sync again: %v", nodes)
	}
}

// spanOf is the bytes of the granules [off, off+length) touches.
func spanOf(off, length int64) int64 {
	first, last := off/DefaultGranule, (off+length-1)/DefaultGranule
	return (last - first + 1) * DefaultGranule
}

// TestResyncOfACopyDroppedByAnotherDisk: a copy that left the in-sync set
// through another disk's Set is still written by this disk's Set; its
// resync drops it here first (marking the unflushed changes) instead of
// refusing.
func TestResyncOfACopyDroppedByAnotherDisk(t *testing.T) {
	_, local := openDisk(t)
	copyPool, copyDisk := openDisk(t)
	px := serveCopy(t, copyPool)
	oos := &outOfSync{}
	s, err := NewSet(context.Background(), diskSize, []Copy{{Node: "b", Addr: px.ln.Addr().String(), Export: "vm/root"}}, nil,
		Options{Timeout: 5 * time.Second, OutOfSync: oos.record})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	d := s.Disk(local)
	if err := d.WriteAt(bytes.Repeat([]byte{3}, 4096), 1<<20, false); err != nil {
		t.Fatal(err)
	}
	rs, err := s.BeginResync(context.Background(), Copy{Node: "b", Addr: px.ln.Addr().String(), Export: "vm/root"})
	if err != nil {
		t.Fatal(err)
	}
	if n, _ := s.Bitmap("b").Granules(); n != 1 {
		t.Fatalf("%d granules dirty, want the unflushed write's 1", n)
	}
	if err := rs.Run(context.Background(), local, nil); err != nil {
		t.Fatal(err)
	}
	if err := Rejoin([]*Resync{rs}, func() error { return nil }); err != nil {
		t.Fatal(err)
	}
	if err := d.Flush(); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(contents(t, local), contents(t, copyDisk)) {
		t.Fatal("the copy differs after the resync")
	}
}

// TestStoppedResyncKeepsMirroredWrites: a write mirrored to a resyncing
// copy, acknowledged but not flushed there, is in the copy's bitmap file
// however the resync stops (the copy may lose it, and the copy's next
// resync must copy it), beside the granules that were dirty before.
func TestStoppedResyncKeepsMirroredWrites(t *testing.T) {
	for _, tc := range []struct {
		name string
		stop func(t *testing.T, s *Set, d *Disk, rs *Resync, px *proxy)
		also int64 // a granule the stop marks too, or 0
	}{
		{"abort", func(t *testing.T, s *Set, d *Disk, rs *Resync, px *proxy) { rs.Abort(errors.New("cancelled")) }, 0},
		{"failed request", func(t *testing.T, s *Set, d *Disk, rs *Resync, px *proxy) {
			px.cut()
			if err := d.WriteAt(make([]byte, 4096), 5<<20, false); err != nil {
				t.Fatalf("a write with the resyncing copy cut: %v", err)
			}
		}, 5 << 20},
		{"failed run", func(t *testing.T, s *Set, d *Disk, rs *Resync, px *proxy) {
			px.cut()
			if err := rs.Run(context.Background(), d, nil); !errors.Is(err, ErrResync) {
				t.Fatalf("run: %v", err)
			}
		}, 0},
		{"failed rejoin", func(t *testing.T, s *Set, d *Disk, rs *Resync, px *proxy) {
			if err := rs.Run(context.Background(), d, nil); err != nil {
				t.Fatal(err)
			}
			if err := Rejoin([]*Resync{rs}, func() error { return errors.New("etcd: lease lost") }); err == nil {
				t.Fatal("rejoin with a failed commit")
			}
		}, 0},
		{"retire", func(t *testing.T, s *Set, d *Disk, rs *Resync, px *proxy) {
			thaw := s.Freeze()
			s.Retire()
			thaw()
		}, 0},
		{"close", func(t *testing.T, s *Set, d *Disk, rs *Resync, px *proxy) { s.Close() }, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, local := openDisk(t)
			copyPool, copyDisk := openDisk(t)
			px := serveCopy(t, copyPool)
			fsys := openFS(t)
			rel := BitmapPath("uid", "root", "b")
			oos := &outOfSync{}
			s, err := NewSet(context.Background(), diskSize, nil, []string{"b"}, Options{Timeout: time.Second, OutOfSync: oos.record,
				Bitmap: func(node string) (*Bitmap, bool, error) {
					return OpenBitmap(fsys, BitmapPath("uid", "root", node), diskSize, DefaultGranule)
				}})
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			d := s.Disk(local)
			if err := d.WriteAt(bytes.Repeat([]byte{1}, 4096), 0, false); err != nil { // behind: granule 0
				t.Fatal(err)
			}
			rs, err := s.BeginResync(context.Background(), Copy{Node: "b", Addr: px.ln.Addr().String(), Export: "vm/root"})
			if err != nil {
				t.Fatal(err)
			}
			mirrored := bytes.Repeat([]byte{2}, 4096)
			if err := d.WriteAt(mirrored, 2<<20, false); err != nil {
				t.Fatal(err)
			}
			got := make([]byte, 4096)
			if err := copyDisk.ReadAt(got, 2<<20); err != nil || !bytes.Equal(got, mirrored) {
				t.Fatalf("the write was not mirrored to the resyncing copy (%v)", err)
			}
			tc.stop(t, s, d, rs, px)
			if rs.Err() == nil {
				t.Fatal("the resync did not stop")
			}
			b, _, err := OpenBitmap(fsys, rel, diskSize, DefaultGranule)
			if err != nil {
				t.Fatal(err)
			}
			defer b.Close()
			marked := map[int64]bool{}
			for _, r := range b.Ranges() {
				marked[r[0]] = true
			}
			if !marked[0] || !marked[2<<20] || !marked[tc.also] {
				t.Fatalf("bitmap file after the stop: %v, want the granules at 0, 2 MiB and %d", b.Ranges(), tc.also)
			}
		})
	}
}

// TestRejoinWhoseCommitFailedRecordsDiverged: when the commit that puts a
// copy back in sync fails (its outcome may be unknown: it may still apply),
// the copy is recorded through Options.Diverged, which rewrites its record
// whatever it says, not through OutOfSync, which leaves a record showing
// the copy out of sync as it is and so lets a late commit apply after it.
func TestRejoinWhoseCommitFailedRecordsDiverged(t *testing.T) {
	_, local := openDisk(t)
	copyPool, _ := openDisk(t)
	px := serveCopy(t, copyPool)
	var outOfSync, diverged []string
	s, err := NewSet(context.Background(), diskSize, nil, []string{"b"}, Options{Timeout: 5 * time.Second,
		OutOfSync: func(node string, _ error) error { outOfSync = append(outOfSync, node); return nil },
		Diverged:  func(node string, _ error) error { diverged = append(diverged, node); return nil }})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if err := s.Disk(local).WriteAt(bytes.Repeat([]byte{3}, 4096), 1<<20, false); err != nil {
		t.Fatal(err)
	}
	rs, err := s.BeginResync(context.Background(), Copy{Node: "b", Addr: px.ln.Addr().String(), Export: "vm/root"})
	if err != nil {
		t.Fatal(err)
	}
	if err := rs.Run(context.Background(), local, nil); err != nil {
		t.Fatal(err)
	}
	if err := Rejoin([]*Resync{rs}, func() error { return errors.New("etcd: context deadline exceeded") }); err == nil {
		t.Fatal("Rejoin succeeded with a failed commit")
	}
	if len(diverged) != 1 || diverged[0] != "b" || len(outOfSync) != 0 {
		t.Fatalf("recorded diverged %v, out of sync %v; want the copy diverged", diverged, outOfSync)
	}
	if len(s.InSync()) != 0 || s.Bitmap("b") == nil {
		t.Fatalf("in sync %v, bitmap %v: want the copy out of sync with its bitmap", s.InSync(), s.Bitmap("b"))
	}
}
