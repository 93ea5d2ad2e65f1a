package replica

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/quiverstorage/quiver/internal/faultio"
	"github.com/quiverstorage/quiver/internal/nbd"
	"github.com/quiverstorage/quiver/internal/pool"
)

const diskSize = 8 << 20

func quiet() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// openDisk makes a pool with one volume "vm" of one disk "root" and returns
// the pool and a handle on the disk.
func openDisk(t *testing.T) (*pool.Pool, pool.Disk) {
	t.Helper()
	return openDiskWith(t, pool.Options{})
}

// openDiskWith is openDisk on a pool opened with opts (a faultio FS).
func openDiskWith(t *testing.T, opts pool.Options) (*pool.Pool, pool.Disk) {
	t.Helper()
	opts.Logger = quiet()
	p, err := pool.OpenWith(context.Background(), t.TempDir(), opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close() })
	if _, _, err := p.Create(context.Background(), pool.VolumeSpec{Name: "vm", Capacity: diskSize,
		Disks: []pool.DiskSpec{{Name: "root", Size: diskSize}}}); err != nil {
		t.Fatal(err)
	}
	v, err := p.Volume("vm")
	if err != nil {
		t.Fatal(err)
	}
	d, err := v.OpenDisk("root")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = d.Close() })
	return p, d
}

// proxy stands between the primary and a copy's NBD server, so a test can
// cut the copy off (connections reset) or freeze it (nothing answered).
type proxy struct {
	ln      net.Listener
	backend string
	mu      sync.Mutex
	conns   []net.Conn
	frozen  chan struct{}
}

func newProxy(t *testing.T, backend string) *proxy {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	px := &proxy{ln: ln, backend: backend, frozen: make(chan struct{})}
	t.Cleanup(px.cut)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			b, err := net.Dial("tcp", backend)
			if err != nil {
				c.Close()
				continue
			}
			px.mu.Lock()
			px.conns = append(px.conns, c, b)
			px.mu.Unlock()
			go px.pipe(b, c)
			go px.pipe(c, b)
		}
	}()
	return px
}

func (px *proxy) pipe(dst, src net.Conn) {
	buf := make([]byte, 64<<10)
	for {
		n, err := src.Read(buf)
		select {
		case <-px.frozen:
			return // swallow: the copy never answers
		default:
		}
		if n > 0 {
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			dst.Close()
			return
		}
	}
}

func (px *proxy) cut() {
	px.ln.Close()
	px.mu.Lock()
	defer px.mu.Unlock()
	for _, c := range px.conns {
		c.Close()
	}
}

func (px *proxy) freeze() { close(px.frozen) }

// serveCopy serves a copy pool's disks over NBD on loopback (tokenless
// implicit attachments) and returns a proxy to it.
func serveCopy(t *testing.T, p *pool.Pool) *proxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := nbd.NewServer(nbd.PoolExports{Pool: p}, nbd.Config{Logger: quiet()})
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(ctx)
	})
	return newProxy(t, ln.Addr().String())
}

// outOfSync records the copies reported out of sync; fail makes the next
// reports fail (a primary cut off from etcd).
type outOfSync struct {
	mu    sync.Mutex
	nodes []string
	errs  []error
	fail  error
}

func (o *outOfSync) record(node string, cause error) error {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.fail != nil {
		return o.fail
	}
	o.nodes, o.errs = append(o.nodes, node), append(o.errs, cause)
	return nil
}

func (o *outOfSync) reported() ([]string, []error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	return append([]string(nil), o.nodes...), append([]error(nil), o.errs...)
}

func setup(t *testing.T, timeout time.Duration) (*Disk, pool.Disk, pool.Disk, *proxy, *outOfSync) {
	t.Helper()
	_, local := openDisk(t)
	copyPool, copyDisk := openDisk(t)
	px := serveCopy(t, copyPool)
	oos := &outOfSync{}
	d, err := Open(context.Background(), local, []Copy{{Node: "b", Addr: px.ln.Addr().String(), Export: "vm/root"}},
		Options{Timeout: timeout, Granule: 64 << 10, OutOfSync: oos.record})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Set().Close() })
	return d, local, copyDisk, px, oos
}

func contents(t *testing.T, d pool.Disk) []byte {
	t.Helper()
	b := make([]byte, diskSize)
	if err := d.ReadAt(b, 0); err != nil {
		t.Fatal(err)
	}
	return b
}

// TestEveryCopyHoldsEveryAcknowledgedWrite: concurrent writes (some FUA),
// trims and zeroes, then a flush: the copy's disk is byte for byte the
// primary's.
func TestEveryCopyHoldsEveryAcknowledgedWrite(t *testing.T) {
	d, local, copyDisk, _, oos := setup(t, 5*time.Second)
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := rand.New(rand.NewPCG(uint64(w), 1))
			buf := make([]byte, 16<<10)
			for range 100 {
				off := r.Int64N(diskSize/512-32) * 512
				for i := range buf {
					buf[i] = byte(r.Uint32())
				}
				var err error
				switch r.IntN(10) {
				case 0:
					err = d.Trim(off, 4096, false)
				case 1:
					flags := pool.ZeroFUA
					if r.IntN(2) == 0 {
						flags |= pool.ZeroMayTrim
					}
					err = d.Zero(off, 8192, flags)
				default:
					err = d.WriteAt(buf, off, r.IntN(4) == 0)
				}
				if err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	if err := d.Flush(); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(contents(t, local), contents(t, copyDisk)) {
		t.Fatal("the copy differs from the primary")
	}
	if nodes, _ := oos.reported(); len(nodes) != 0 || len(d.InSync()) != 1 {
		t.Fatalf("out of sync %v, in sync %v", nodes, d.InSync())
	}
	if b := d.Set().Bitmap("b"); b != nil {
		t.Fatalf("a dirty bitmap with every copy in sync: %v", b.Ranges())
	}
}

// TestCopyDownDegrades: a copy whose connection breaks is recorded out of
// sync before the write is acknowledged, I/O goes on, and every write
// from then on is in the dirty set.
func TestCopyDownDegrades(t *testing.T) {
	d, _, _, px, oos := setup(t, 5*time.Second)
	if err := d.WriteAt(bytes.Repeat([]byte{1}, 4096), 0, false); err != nil {
		t.Fatal(err)
	}
	px.cut()
	if err := d.WriteAt(bytes.Repeat([]byte{2}, 4096), 1<<20, false); err != nil {
		t.Fatalf("write with the copy down: %v", err)
	}
	nodes, errs := oos.reported()
	if len(nodes) != 1 || nodes[0] != "b" || !errors.Is(errs[0], ErrCopyDown) {
		t.Fatalf("out of sync: %v %v", nodes, errs)
	}
	if len(d.InSync()) != 0 {
		t.Fatalf("in sync: %v", d.InSync())
	}
	if err := d.WriteAt(bytes.Repeat([]byte{3}, 100<<10), 3<<20, true); err != nil {
		t.Fatal(err)
	}
	if err := d.Flush(); err != nil {
		t.Fatal(err)
	}
	// The write at 0 was never flushed, so the copy may have lost it with
	// its connection: 1 granule; 1 at 1 MiB; 100 KiB at 3 MiB over 64 KiB
	// granules: 2.
	if n, g := d.Set().Bitmap("b").Granules(); n != 4 || g != 64<<10 {
		t.Fatalf("dirty granules %d of %d bytes, want 4 of 64 KiB: %v", n, g, d.Set().Bitmap("b").Ranges())
	}
	if nodes, _ := oos.reported(); len(nodes) != 1 {
		t.Fatalf("reported again: %v", nodes)
	}
}

// TestUnrecordedFailureIsNotAcknowledged: when the failed copy cannot be
// recorded out of sync (the primary is cut off from etcd), the write fails
// and so does every later one: nothing is acknowledged that a promoted
// copy could lack.
func TestUnrecordedFailureIsNotAcknowledged(t *testing.T) {
	d, _, _, px, oos := setup(t, 5*time.Second)
	oos.fail = errors.New("etcd: context deadline exceeded")
	px.cut()
	for i := range 3 {
		err := d.WriteAt(make([]byte, 4096), int64(i)*4096, false)
		if !errors.Is(err, ErrNotAcknowledged) {
			t.Fatalf("write %d: %v, want ErrNotAcknowledged", i, err)
		}
	}
	if err := d.Flush(); !errors.Is(err, ErrNotAcknowledged) {
		t.Fatalf("flush: %v", err)
	}
	if len(d.InSync()) != 1 {
		t.Fatalf("the copy left the in-sync set without being recorded: %v", d.InSync())
	}
}

// TestSilentCopyTimesOut: a copy that answers nothing is down after the
// timeout.
func TestSilentCopyTimesOut(t *testing.T) {
	d, _, _, px, oos := setup(t, 300*time.Millisecond)
	px.freeze()
	if err := d.WriteAt(make([]byte, 4096), 0, false); err != nil {
		t.Fatalf("write with a silent copy: %v", err)
	}
	nodes, errs := oos.reported()
	if len(nodes) != 1 || !errors.Is(errs[0], ErrCopyDown) {
		t.Fatalf("out of sync: %v %v", nodes, errs)
	}
}

// failingDisk fails its writes while fail is set (a full pool).
type failingDisk struct {
	pool.Disk
	fail bool
}

func (f *failingDisk) WriteAt(p []byte, off int64, fua bool) error {
	if f.fail {
		return errors.New("no space left on device")
	}
	return f.Disk.WriteAt(p, off, fua)
}

// TestLocalFailureRepairsCopies: a write the primary's disk fails, but the
// copy applied, fails to the client and the copy gets the primary's data
// back: the copies never hold a change the primary lacks, and the copy
// stays in sync.
func TestLocalFailureRepairsCopies(t *testing.T) {
	_, local := openDisk(t)
	copyPool, copyDisk := openDisk(t)
	px := serveCopy(t, copyPool)
	fd := &failingDisk{Disk: local}
	oos := &outOfSync{}
	d, err := Open(context.Background(), fd, []Copy{{Node: "b", Addr: px.ln.Addr().String(), Export: "vm/root"}},
		Options{Timeout: 5 * time.Second, OutOfSync: oos.record})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Set().Close()
	if err := d.WriteAt(bytes.Repeat([]byte{1}, 8192), 4096, false); err != nil {
		t.Fatal(err)
	}
	fd.fail = true
	if err := d.WriteAt(bytes.Repeat([]byte{2}, 8192), 4096, false); err == nil {
		t.Fatal("a write the primary failed was acknowledged")
	}
	fd.fail = false
	if err := d.Flush(); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(contents(t, local), contents(t, copyDisk)) {
		t.Fatal("the copy holds a write the primary failed")
	}
	if nodes, _ := oos.reported(); len(nodes) != 0 || len(d.InSync()) != 1 {
		t.Fatalf("out of sync %v, in sync %v", nodes, d.InSync())
	}
}

// TestChangeWhileCopyLeavesIsMarked: a change that begins while a failed
// copy is leaving the in-sync set is still sent to the copy, and must be in
// the copy's bitmap: the copy took it without a flush and may lose it. A
// flush comes first, so the change is not among the unflushed changes of
// before. The copy's pool refuses one write (ENOSPC), so its connection
// stays up, and the flush and the change are made from a callback of the
// leaving: while its bitmap is made (Options.Bitmap) or while it is
// recorded out of sync (Options.OutOfSync, after its changes are marked).
func TestChangeWhileCopyLeavesIsMarked(t *testing.T) {
	for _, during := range []string{"bitmap", "out-of-sync"} {
		t.Run(during, func(t *testing.T) {
			_, local := openDisk(t)
			fio := faultio.New(openFS(t))
			copyPool, copyDisk := openDiskWith(t, pool.Options{FS: fio})
			px := serveCopy(t, copyPool)
			var d *Disk
			late := bytes.Repeat([]byte{5}, 4096)
			var lateErr error
			calls := 0
			meanwhile := func(at string) {
				if at != during {
					return
				}
				calls++
				fio.LimitWrites(-1)
				if lateErr = d.Flush(); lateErr == nil {
					lateErr = d.WriteAt(late, 3<<20, false)
				}
			}
			s, err := NewSet(context.Background(), diskSize, []Copy{{Node: "b", Addr: px.ln.Addr().String(), Export: "vm/root"}}, nil,
				Options{Timeout: 5 * time.Second,
					OutOfSync: func(node string, cause error) error { meanwhile("out-of-sync"); return nil },
					Bitmap: func(node string) (*Bitmap, bool, error) {
						meanwhile("bitmap")
						return MemoryBitmap(diskSize, DefaultGranule), true, nil
					}})
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			d = s.Disk(local)
			fio.LimitWrites(0)
			if err := d.WriteAt(bytes.Repeat([]byte{2}, 4096), 1<<20, false); err != nil {
				t.Fatalf("write refused by the copy: %v", err)
			}
			if calls != 1 || lateErr != nil {
				t.Fatalf("%d calls while the copy left; the flush and change meanwhile: %v", calls, lateErr)
			}
			if len(s.InSync()) != 0 {
				t.Fatalf("in sync: %v", s.InSync())
			}
			got := make([]byte, 4096)
			if err := copyDisk.ReadAt(got, 3<<20); err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got, late) {
				t.Fatal("the change made while the copy was leaving did not reach it: the test missed the window")
			}
			want := [][2]int64{{1 << 20, 64 << 10}, {3 << 20, 64 << 10}}
			if r := s.Bitmap("b").Ranges(); len(r) != 2 || r[0] != want[0] || r[1] != want[1] {
				t.Fatalf("bitmap %v, want %v (the refused write and the change sent while the copy left)", r, want)
			}
		})
	}
}

// TestCopyDivergesWhenItsBitmapFails: an in-sync copy refuses a change (its
// pool is full) that the primary applied, and the primary's pool cannot
// write the copy's dirty bitmap. The copy must not stay in sync without the
// change: it leaves through Options.Diverged (its resync copies it whole)
// and the change is acknowledged; without Diverged, or when Diverged fails,
// the change is not acknowledged.
func TestCopyDivergesWhenItsBitmapFails(t *testing.T) {
	for _, tc := range []struct {
		name        string
		diverged    bool
		divergedErr error
		// bitmapMade: the bitmap file exists, so it opens and its mark
		// fails; otherwise making it fails.
		bitmapMade bool
	}{
		{"recorded diverged, the bitmap cannot be made", true, nil, false},
		{"recorded diverged, the bitmap cannot be marked", true, nil, true},
		{"diverged cannot be recorded", true, errors.New("etcd out of reach"), true},
		{"no Diverged", false, nil, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, local := openDisk(t)
			copyFS := faultio.New(openFS(t))
			copyPool, copyDisk := openDiskWith(t, pool.Options{FS: copyFS})
			px := serveCopy(t, copyPool)
			bitmapFS := faultio.New(openFS(t))
			if tc.bitmapMade {
				b, _, err := OpenBitmap(bitmapFS, BitmapPath("uid1", "root", "b"), diskSize, DefaultGranule)
				if err != nil {
					t.Fatal(err)
				}
				b.Close()
			}
			var divergedCalls, outOfSyncCalls int
			opts := Options{Timeout: 5 * time.Second,
				OutOfSync: func(string, error) error { outOfSyncCalls++; return nil },
				Bitmap: func(node string) (*Bitmap, bool, error) {
					return OpenBitmap(bitmapFS, BitmapPath("uid1", "root", node), diskSize, DefaultGranule)
				}}
			if tc.diverged {
				opts.Diverged = func(node string, cause error) error {
					divergedCalls++
					if node != "b" {
						t.Errorf("diverged %s", node)
					}
					return tc.divergedErr
				}
			}
			s, err := NewSet(context.Background(), diskSize, []Copy{{Node: "b", Addr: px.ln.Addr().String(), Export: "vm/root"}},
				nil, opts)
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			d := s.Disk(local)
			copyFS.LimitWrites(0)
			bitmapFS.LimitWrites(0)
			data := bytes.Repeat([]byte{7}, 4096)
			err = d.WriteAt(data, 1<<20, false)
			copyFS.LimitWrites(-1)
			got := make([]byte, 4096)
			if rerr := copyDisk.ReadAt(got, 1<<20); rerr != nil || bytes.Equal(got, data) {
				t.Fatalf("the copy took the write (%v): the test missed its case", rerr)
			}
			if tc.diverged && tc.divergedErr == nil {
				if err != nil || divergedCalls != 1 || outOfSyncCalls != 0 || len(s.InSync()) != 0 {
					t.Fatalf("write: %v; diverged %d, out of sync %d, in sync %v: want acknowledged, the copy diverged",
						err, divergedCalls, outOfSyncCalls, s.InSync())
				}
				// Later changes neither reach the copy nor need its bitmap.
				if err := d.WriteAt(data, 2<<20, false); err != nil {
					t.Fatalf("a later write: %v", err)
				}
				return
			}
			if !errors.Is(err, ErrNotAcknowledged) {
				t.Fatalf("write: %v, want ErrNotAcknowledged", err)
			}
		})
	}
}

// heldDisk is a local disk whose writes at one offset wait until released:
// a change still in flight on the primary while the rest goes on.
type heldDisk struct {
	pool.Disk
	at      int64
	entered chan struct{}
	release chan struct{}
}

func (d *heldDisk) WriteAt(p []byte, off int64, fua bool) error {
	if off == d.at {
		d.entered <- struct{}{}
		<-d.release
	}
	return d.Disk.WriteAt(p, off, fua)
}

// TestFlushDoesNotCoverAChangeInFlight: a FLUSH that begins while a change
// is in flight does not make that change durable on a copy (it may reach the
// copy first: NBD's FLUSH covers only what completed before it was sent), so
// a copy that fails after the FLUSH ended must have the change's range in its
// bitmap, whether the change is still in flight when the copy fails or
// finished (acknowledged) before.
func TestFlushDoesNotCoverAChangeInFlight(t *testing.T) {
	for _, finished := range []bool{false, true} {
		t.Run(fmt.Sprintf("change finished before the copy fails: %v", finished), func(t *testing.T) {
			_, local := openDisk(t)
			copyFS := faultio.New(openFS(t))
			copyPool, _ := openDiskWith(t, pool.Options{FS: copyFS})
			px := serveCopy(t, copyPool)
			s, err := NewSet(context.Background(), diskSize, []Copy{{Node: "b", Addr: px.ln.Addr().String(), Export: "vm/root"}},
				nil, Options{Timeout: 5 * time.Second, OutOfSync: func(string, error) error { return nil }})
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			held := &heldDisk{Disk: local, at: 1 << 20, entered: make(chan struct{}), release: make(chan struct{})}
			d := s.Disk(held)
			inflight := make(chan error, 1)
			go func() { inflight <- d.WriteAt(bytes.Repeat([]byte{1}, 4096), 1<<20, false) }()
			<-held.entered
			if err := d.Flush(); err != nil {
				t.Fatalf("a flush while a change is in flight: %v", err)
			}
			if finished {
				close(held.release)
				if err := <-inflight; err != nil {
					t.Fatal(err)
				}
			}
			// The copy fails: its pool is full.
			copyFS.LimitWrites(0)
			if err := d.WriteAt(bytes.Repeat([]byte{2}, 4096), 3<<20, false); err != nil {
				t.Fatalf("a write the copy refuses: %v", err)
			}
			if !finished {
				close(held.release)
				if err := <-inflight; err != nil {
					t.Fatal(err)
				}
			}
			if len(s.InSync()) != 0 {
				t.Fatalf("in sync: %v", s.InSync())
			}
			got := s.Bitmap("b").Ranges()
			if !slices.Contains(got, [2]int64{1 << 20, 64 << 10}) {
				t.Fatalf("bitmap %v lacks the change a flush overtook (granule at 1 MiB)", got)
			}
		})
	}
}
