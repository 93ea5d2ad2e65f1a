package pool

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"

	"github.com/quiverstorage/quiver/internal/storage/crashfs"
)

// memSource is a fill source held in memory. A unit listed in hold blocks
// until release is closed; reads counts the units read.
type memSource struct {
	disks   map[string][]byte
	hold    map[string]int64 // disk -> offset of a unit that waits
	release chan struct{}
	held    chan struct{} // closed when a read reaches the held unit
	mu      sync.Mutex
	reads   map[string]int
	fail    error
}

func (s *memSource) ReadDisk(ctx context.Context, disk string, p []byte, off int64) error {
	s.mu.Lock()
	if s.reads == nil {
		s.reads = map[string]int{}
	}
	s.reads[fmt.Sprintf("%s@%d", disk, off)]++
	fail := s.fail
	s.mu.Unlock()
	if fail != nil {
		return fail
	}
	if h, ok := s.hold[disk]; ok && h == off && s.release != nil {
		s.mu.Lock()
		if s.held != nil {
			close(s.held)
			s.held = nil
		}
		s.mu.Unlock()
		select {
		case <-s.release:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	copy(p, s.disks[disk][off:])
	return nil
}

// fillContent makes a disk's source content: units of random bytes, some
// all zeros, one with only its second 64 KiB piece holding data.
func fillContent(seed uint64, size int64) []byte {
	rng := rand.New(rand.NewPCG(seed, 3))
	p := make([]byte, size)
	for u := int64(0); u*fillUnit < size; u++ {
		end := min((u+1)*fillUnit, size)
		switch u % 4 {
		case 1: // zeros
		case 2:
			lo := u*fillUnit + changeGranule
			for i := lo; i < min(lo+changeGranule, end); i++ {
				p[i] = byte(rng.Uint32())
			}
		default:
			for i := u * fillUnit; i < end; i++ {
				p[i] = byte(rng.Uint32())
			}
		}
	}
	return p
}

func TestFillServesBeforeTheCopy(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	p := openTestPool(t, dir)
	disks := []DiskSpec{{Name: "root", Size: 5 * mib}, {Name: "data", Size: 3*mib + 4096}}
	src := &memSource{disks: map[string][]byte{"root": fillContent(1, 5*mib), "data": fillContent(2, 3*mib+4096)},
		hold: map[string]int64{"root": 0}, release: make(chan struct{}), held: make(chan struct{})}
	if _, _, err := p.Create(ctx, VolumeSpec{Name: "vm", Capacity: 16 * mib, Disks: disks, Fill: "bad source"}); !errors.Is(err, ErrInvalid) {
		t.Fatalf("a fill source with a space: %v, want ErrInvalid", err)
	}
	mustCreate(t, p, VolumeSpec{Name: "vm", Capacity: 16 * mib, Disks: disks, Fill: "test:backup-1"})
	v, _ := p.Volume("vm")
	if f := v.Filling(); f == nil || f.Source != "test:backup-1" {
		t.Fatalf("Filling() = %+v", f)
	}
	h, err := v.OpenDisk("data")
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	buf := make([]byte, 4096)
	if err := h.ReadAt(buf, 0); !errors.Is(err, ErrFillSource) {
		t.Fatalf("a read before the source is connected: %v, want ErrFillSource", err)
	}

	// The copy waits on root's first unit; the VM reads and writes others.
	filled := make(chan error, 1)
	held := src.held
	go func() { filled <- v.Fill(ctx, src, nil) }()
	<-held // the copy is connected and waits on root's first unit
	want := bytes.Clone(src.disks["data"])
	got := make([]byte, 2*mib)
	if err := h.ReadAt(got, mib); err != nil || !bytes.Equal(got, want[mib:3*mib]) {
		t.Fatalf("read of units not filled: %v, equal %v", err, bytes.Equal(got, want[mib:3*mib]))
	}
	w := bytes.Repeat([]byte{0xab}, 8192)
	if err := h.WriteAt(w, 3*mib-4096, false); err != nil {
		t.Fatal(err)
	}
	copy(want[3*mib-4096:], w)
	if err := h.Zero(0, 4096, 0); err != nil {
		t.Fatal(err)
	}
	clear(want[:4096])
	if ext, err := h.Extents(0, 3*mib+4096, 0); err != nil || len(ext) == 0 {
		t.Fatalf("extents while filling: %v %v", ext, err)
	}
	for _, op := range []func() error{
		func() error { _, _, err := v.CreateSnapshot(ctx, "s", nil); return err },
		func() error {
			_, err := p.Clone(ctx, CloneRequest{Source: Source{Volume: "vm"}, Names: []string{"c"}}, nil)
			return err
		},
		func() error { _, err := v.SetDirectAccess(ctx, "node-a", true); return err },
		func() error { _, err := v.AddDisk(ctx, DiskSpec{Name: "extra", Size: mib}); return err },
	} {
		if err := op(); !errors.Is(err, ErrBusy) {
			t.Fatalf("an operation that would copy or hand out the images while filling: %v, want ErrBusy", err)
		}
	}
	if fi := v.Info().Fill; fi == nil || fi.TotalBytes != 8*mib+4096 || fi.FilledBytes >= fi.TotalBytes {
		t.Fatalf("Info().Fill while filling = %+v", fi)
	}
	close(src.release)
	if err := <-filled; err != nil {
		t.Fatal(err)
	}
	if v.Filling() != nil || v.Info().Fill != nil {
		t.Fatalf("still filling after Fill returned: %+v", v.Filling())
	}
	if got := readAll(t, v, "", "data"); !bytes.Equal(got, want) {
		t.Fatal("data differs from the source plus the VM's writes")
	}
	if got := readAll(t, v, "", "root"); !bytes.Equal(got, src.disks["root"]) {
		t.Fatal("root differs from the source")
	}
	// Units the VM read were fetched once; all-zero units left holes.
	src.mu.Lock()
	for k, n := range src.reads {
		if n != 1 {
			t.Errorf("unit %s read %d times from the source", k, n)
		}
	}
	src.mu.Unlock()
	info := v.Info()
	for _, d := range info.Disks {
		if d.Name == "root" && d.Allocated >= 4*mib {
			t.Errorf("root: %d bytes allocated for 3.1 MiB of data: zero units were written", d.Allocated)
		}
	}
	if _, err := p.fs.ReadDir(v.fillDir()); err == nil {
		t.Error("fill maps left after the volume is whole")
	}
	if _, _, err := v.CreateSnapshot(ctx, "s", nil); err != nil {
		t.Fatalf("snapshot once whole: %v", err)
	}
	// A restart keeps it whole.
	p.Close()
	p = openTestPool(t, dir)
	v, _ = p.Volume("vm")
	if v.Filling() != nil {
		t.Fatal("filling again after a restart")
	}
}

func TestFillSourceFailureIsAnError(t *testing.T) {
	ctx := context.Background()
	p := openTestPool(t, t.TempDir())
	mustCreate(t, p, VolumeSpec{Name: "vm", Capacity: 8 * mib, Disks: []DiskSpec{{Name: "root", Size: 2 * mib}}, Fill: "x"})
	v, _ := p.Volume("vm")
	src := &memSource{disks: map[string][]byte{"root": fillContent(1, 2*mib)}, fail: errors.New("store down")}
	if err := v.Fill(ctx, src, nil); !errors.Is(err, ErrFillSource) {
		t.Fatalf("Fill with a failing source: %v, want ErrFillSource", err)
	}
	h, _ := v.OpenDisk("root")
	defer h.Close()
	if err := h.WriteAt(make([]byte, 512), 0, false); !errors.Is(err, ErrFillSource) {
		t.Fatalf("a write into a unit that cannot be filled: %v, want ErrFillSource", err)
	}
	src.mu.Lock()
	src.fail = nil
	src.mu.Unlock()
	if err := v.Fill(ctx, src, nil); err != nil {
		t.Fatal(err)
	}
	if got := readAll(t, v, "", "root"); !bytes.Equal(got, src.disks["root"]) {
		t.Fatal("root differs from the source")
	}
}

// TestFillSurvivesPowerCuts cuts the power at a random sync while a VM
// writes and reads a filling volume and the copy runs, keeping a random
// part of what was not synced; after the reboot the fill completes. Every
// byte must then hold its source's value or a VM write's, and every write
// acknowledged by a flush must be there (or a later write): a unit the VM
// wrote is never fetched from the source again.
func TestFillSurvivesPowerCuts(t *testing.T) {
	ctx := context.Background()
	runs := 60
	if raceOn {
		runs = 20
	}
	sizes := map[string]int64{"root": 4 * mib, "data": 3*mib + 64<<10}
	for run := range runs {
		rng := rand.New(rand.NewPCG(uint64(run), 11))
		src := &memSource{disks: map[string][]byte{}}
		for i, d := range []string{"root", "data"} {
			src.disks[d] = fillContent(uint64(10*run+i), sizes[d])
		}
		cfs := crashfs.New("/crash")
		cfs.KeepPartial(uint64(run))
		p := crashPool(t, cfs)
		mustCreate(t, p, VolumeSpec{Name: "vm", Capacity: 16 * mib, Fill: "test:b",
			Disks: []DiskSpec{{Name: "root", Size: sizes["root"]}, {Name: "data", Size: sizes["data"]}}})
		cfs.CutAtSync(len(cfs.Syncs())+1+rng.IntN(40), rng.IntN(2) == 0)
		v, _ := p.Volume("vm")
		go func() { _ = v.Fill(ctx, src, nil) }()

		type write struct {
			disk   string
			off, n int64
			val    byte
			acked  bool
		}
		var writes []*write
		handles := map[string]Disk{}
		for d := range sizes {
			h, err := v.OpenDisk(d)
			if err != nil {
				t.Fatal(err)
			}
			handles[d] = h
		}
		for i := 0; !cfs.Off() && i < 300; i++ {
			disk := []string{"root", "data"}[rng.IntN(2)]
			switch r := rng.IntN(10); {
			case r == 0:
				if handles[disk].Flush() == nil {
					for _, w := range writes {
						if w.disk == disk {
							w.acked = true
						}
					}
				}
			case r == 1:
				_ = handles[disk].ReadAt(make([]byte, 4096), rng.Int64N(sizes[disk]-4096))
			default:
				w := &write{disk: disk, off: rng.Int64N(sizes[disk] - 8192), n: 1 + rng.Int64N(8192), val: byte(i%250 + 1)}
				if handles[disk].WriteAt(bytes.Repeat([]byte{w.val}, int(w.n)), w.off, false) == nil {
					writes = append(writes, w)
				}
			}
		}
		for _, h := range handles {
			h.Close()
		}
		p = reboot(t, p, cfs)
		v, err := p.Volume("vm")
		if err != nil {
			t.Fatal(err)
		}
		if err := v.Fill(ctx, src, nil); err != nil {
			t.Fatalf("run %d: fill after the reboot: %v", run, err)
		}
		for disk, size := range sizes {
			got := readAll(t, v, "", disk)
			// lastAck[b]: the last acknowledged write over b, or -1.
			lastAck := make([]int, size)
			for b := range lastAck {
				lastAck[b] = -1
			}
			byVal := map[byte][]int{}
			for k, w := range writes {
				if w.disk != disk {
					continue
				}
				byVal[w.val] = append(byVal[w.val], k)
				if w.acked {
					for b := w.off; b < w.off+w.n; b++ {
						lastAck[b] = k
					}
				}
			}
			for b := int64(0); b < size; b++ {
				// What may be there: the last acknowledged write over b or
				// a write after it; with none acknowledged, the source's
				// byte too.
				if lastAck[b] < 0 && got[b] == src.disks[disk][b] {
					continue
				}
				ok := false
				for _, k := range byVal[got[b]] {
					if w := writes[k]; k >= lastAck[b] && b >= w.off && b < w.off+w.n {
						ok = true
						break
					}
				}
				if !ok {
					t.Fatalf("run %d: %s byte %d is %#x: neither the source's %#x nor a write that may be there (last acknowledged write over it: %d)",
						run, disk, b, got[b], src.disks[disk][b], lastAck[b])
				}
			}
		}
		p.Close()
	}
}
