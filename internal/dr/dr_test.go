package dr

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"testing"

	"github.com/quiverstorage/quiver/internal/pool"
	"github.com/quiverstorage/quiver/internal/storage/crashfs"
)

const mib = 1 << 20

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

func openPool(t *testing.T, dir string) *pool.Pool {
	t.Helper()
	p, err := pool.Open(context.Background(), dir, quiet)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close() })
	return p
}

func volume(t *testing.T, p *pool.Pool, spec pool.VolumeSpec) *pool.Volume {
	t.Helper()
	if _, _, err := p.Create(context.Background(), spec); err != nil {
		t.Fatal(err)
	}
	v, err := p.Volume(spec.Name)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// scribble writes n random pieces (some zeroes) into v's disks.
func scribble(t *testing.T, v *pool.Volume, rng *rand.Rand, n int) {
	t.Helper()
	for range n {
		disks := v.Info().Disks
		d := disks[rng.IntN(len(disks))]
		h, err := v.OpenDisk(d.Name)
		if err != nil {
			t.Fatal(err)
		}
		size := int64(4096 * (1 + rng.IntN(32)))
		off := rng.Int64N(d.Size-size) &^ 511
		if rng.IntN(5) == 0 {
			err = h.Zero(off, size, pool.ZeroMayTrim)
		} else {
			p := make([]byte, size)
			for i := range p {
				p[i] = byte(rng.UintN(256))
			}
			err = h.WriteAt(p, off, false)
		}
		h.Close()
		if err != nil {
			t.Fatal(err)
		}
	}
}

// content reads every disk of snapshot snap of v (the live disks when "").
func content(t *testing.T, v *pool.Volume, snap string) map[string][]byte {
	t.Helper()
	out := map[string][]byte{}
	disks := v.Info().Disks
	if snap != "" {
		s, err := v.Snapshot(snap)
		if err != nil {
			t.Fatal(err)
		}
		disks = s.Disks
	}
	for _, d := range disks {
		var h pool.Disk
		var err error
		if snap == "" {
			h, err = v.OpenDisk(d.Name)
		} else {
			h, err = v.OpenSnapshotDisk(snap, d.Name)
		}
		if err != nil {
			t.Fatal(err)
		}
		b := make([]byte, h.Size())
		if err := h.ReadAt(b, 0); err != nil {
			t.Fatal(err)
		}
		h.Close()
		out[d.Name] = b
	}
	return out
}

func sameContent(t *testing.T, what string, got, want map[string][]byte) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%s: disks %d, want %d", what, len(got), len(want))
	}
	for d, w := range want {
		if !bytes.Equal(got[d], w) {
			t.Fatalf("%s: disk %s differs (%d bytes, want %d)", what, d, len(got[d]), len(w))
		}
	}
}

func vm(name string) pool.VolumeSpec {
	return pool.VolumeSpec{Name: name, Capacity: 64 * mib,
		Disks: []pool.DiskSpec{{Name: "root", Size: 4 * mib}, {Name: "data", Size: 3 * mib}, {Name: "logs", Size: 2 * mib}}}
}

func TestCyclesShipPoints(t *testing.T) {
	ctx := context.Background()
	src := volume(t, openPool(t, t.TempDir()), vm("vm"))
	dst := volume(t, openPool(t, t.TempDir()), pool.VolumeSpec{Name: "vm-dr", Capacity: mib})
	s, err := NewSource(src, "site-b")
	if err != nil {
		t.Fatal(err)
	}
	r, err := NewReceiver(dst, "site-b", 2)
	if err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(1, 2))
	scribble(t, src, rng, 200)

	st, err := s.Cycle(ctx, r)
	if err != nil {
		t.Fatal(err)
	}
	if st.Base != "" || st.Changed != 9*mib || st.Point.Seq != 1 {
		t.Fatalf("first cycle: %+v", st)
	}
	sameContent(t, "point 1", content(t, dst, st.Point.Snapshot), content(t, src, st.Point.Snapshot))

	// A few writes: only their granules travel.
	scribble(t, src, rng, 3)
	st2, err := s.Cycle(ctx, r)
	if err != nil {
		t.Fatal(err)
	}
	if st2.Base != st.Point.Snapshot || st2.Changed > 3*(128<<10+64<<10) || st2.Sent+st2.Zeroed != st2.Changed {
		t.Fatalf("second cycle after 3 writes of at most 128 KiB: %+v", st2)
	}
	sameContent(t, "point 2", content(t, dst, st2.Point.Snapshot), content(t, src, st2.Point.Snapshot))
	if ps := points("site-b", src.Snapshots()); len(ps) != 1 || ps[0] != st2.Point {
		t.Fatalf("the source keeps %v, want only the last point", ps)
	}

	// The disk set changes: one removed, one grown, one added.
	if _, err := src.RemoveDiskWith(ctx, "data", true); err != nil {
		t.Fatal(err)
	}
	if _, err := src.GrowDisk(ctx, "logs", 5*mib); err != nil {
		t.Fatal(err)
	}
	if _, err := src.AddDisk(ctx, pool.DiskSpec{Name: "extra", Size: 2 * mib}); err != nil {
		t.Fatal(err)
	}
	scribble(t, src, rng, 20)
	st3, err := s.Cycle(ctx, r)
	if err != nil {
		t.Fatal(err)
	}
	sameContent(t, "point 3", content(t, dst, st3.Point.Snapshot), content(t, src, st3.Point.Snapshot))
	st4, err := s.Cycle(ctx, r)
	if err != nil {
		t.Fatal(err)
	}
	if st4.Changed != 0 {
		t.Errorf("a cycle with nothing written shipped %+v", st4)
	}
	if ps := r.held(); len(ps) != 2 || ps[0] != st3.Point || ps[1] != st4.Point {
		t.Fatalf("the target keeps %v, want the last 2 points", ps)
	}
}

// failing is a target that fails after a number of writes.
type failing struct {
	Target
	left int
}

func (f *failing) Write(ctx context.Context, disk string, off int64, data []byte) error {
	if f.left--; f.left < 0 {
		return errors.New("link cut")
	}
	return f.Target.Write(ctx, disk, off, data)
}

// TestUncommittedCycleLeavesLastPoint: a cycle cut midway leaves the
// target at its last point, the source at its base; the next cycle works,
// and rolls back the target's live disks when anything else changed them.
func TestUncommittedCycleLeavesLastPoint(t *testing.T) {
	ctx := context.Background()
	src := volume(t, openPool(t, t.TempDir()), vm("vm"))
	dst := volume(t, openPool(t, t.TempDir()), pool.VolumeSpec{Name: "vm-dr", Capacity: mib})
	s, _ := NewSource(src, "b")
	r, _ := NewReceiver(dst, "b", 3)
	rng := rand.New(rand.NewPCG(3, 4))
	scribble(t, src, rng, 100)
	first, err := s.Cycle(ctx, r)
	if err != nil {
		t.Fatal(err)
	}
	// Only root changes now.
	h, err := src.OpenDisk("root")
	if err != nil {
		t.Fatal(err)
	}
	for i := range 20 {
		if err := h.WriteAt(bytes.Repeat([]byte{byte(i + 1)}, 64<<10), int64(i)*128<<10, false); err != nil {
			t.Fatal(err)
		}
	}
	h.Close()
	if _, err := s.Cycle(ctx, &failing{Target: r, left: 2}); err == nil {
		t.Fatal("a cycle whose link was cut succeeded")
	}
	if last, _, _ := r.Last(ctx); last != first.Point {
		t.Fatalf("after a cut cycle the target's last point is %v, want %v", last, first.Point)
	}
	if ps := points("b", src.Snapshots()); len(ps) != 1 || ps[0] != first.Point {
		t.Fatalf("after a cut cycle the source keeps %v, want its base %v", ps, first.Point)
	}
	sameContent(t, "the last point after a cut cycle", content(t, dst, first.Point.Snapshot), content(t, src, first.Point.Snapshot))

	// Something else writes the target's live disks where the source
	// did not change: the next cycle must not keep it.
	h, err = dst.OpenDisk("logs")
	if err != nil {
		t.Fatal(err)
	}
	if err := h.WriteAt(bytes.Repeat([]byte{0xee}, 8192), 2*mib-8192, false); err != nil {
		t.Fatal(err)
	}
	h.Close()
	second, err := s.Cycle(ctx, r)
	if err != nil {
		t.Fatal(err)
	}
	if second.Base != first.Point.Snapshot {
		t.Fatalf("the cycle after a cut one: %+v, want a delta from %s", second, first.Point.Snapshot)
	}
	sameContent(t, "the point after a cut cycle", content(t, dst, second.Point.Snapshot), content(t, src, second.Point.Snapshot))
}

func TestReceiverRefusesAnotherBase(t *testing.T) {
	ctx := context.Background()
	src := volume(t, openPool(t, t.TempDir()), vm("vm"))
	dst := volume(t, openPool(t, t.TempDir()), pool.VolumeSpec{Name: "vm-dr", Capacity: mib})
	s, _ := NewSource(src, "b")
	r, _ := NewReceiver(dst, "b", 3)
	scribble(t, src, rand.New(rand.NewPCG(5, 6)), 50)
	first, err := s.Cycle(ctx, r)
	if err != nil {
		t.Fatal(err)
	}
	other := newPoint("b", first.Point.Seq)
	if err := r.Begin(ctx, Start{Point: newPoint("b", 2), Base: &other}); !errors.Is(err, ErrDiverged) {
		t.Fatalf("a delta from a point the target does not hold: %v, want ErrDiverged", err)
	}
	if err := r.Begin(ctx, Start{Point: newPoint("b", 1), Base: &first.Point}); !errors.Is(err, ErrDiverged) {
		t.Fatalf("a point not after the target's last: %v, want ErrDiverged", err)
	}
	if err := r.Begin(ctx, Start{Point: Point{Seq: 2, Snapshot: "root"}, Base: &first.Point}); !errors.Is(err, pool.ErrInvalid) {
		t.Fatalf("a point with a foreign name: %v, want ErrInvalid", err)
	}
	if _, err := NewSource(src, "Bad_Name"); !errors.Is(err, pool.ErrInvalid) {
		t.Fatalf("a bad relationship name: %v", err)
	}
	// Another source of the same relationship (another VM): its points
	// are not this one's, and its full point would overwrite them:
	// refused, nothing written; with Replace, it ships in full and the
	// target follows it.
	src2 := volume(t, openPool(t, t.TempDir()), vm("vm"))
	scribble(t, src2, rand.New(rand.NewPCG(7, 8)), 50)
	s2, _ := NewSource(src2, "b")
	if _, err := s2.Cycle(ctx, r); !errors.Is(err, ErrDiverged) {
		t.Fatalf("another VM's full point into a target holding points: %v, want ErrDiverged", err)
	}
	if last, _, _ := r.Last(ctx); last != first.Point {
		t.Fatalf("after a refused full point the target's last point is %v, want %v", last, first.Point)
	}
	sameContent(t, "the target after another VM's refused point", content(t, dst, first.Point.Snapshot), content(t, src, first.Point.Snapshot))
	s2.Replace = true
	st, err := s2.Cycle(ctx, r)
	if err != nil {
		t.Fatal(err)
	}
	if st.Base != "" || st.Point.Seq != 2 {
		t.Fatalf("another source's first cycle: %+v, want a full point 2", st)
	}
	sameContent(t, "another source's point", content(t, dst, st.Point.Snapshot), content(t, src2, st.Point.Snapshot))
}

// TestTargetSurvivesPowerCuts cuts the target's power at a random sync
// during a cycle (the strict crash twin, keeping a random part of what was
// not synced); after the reboot the target's last point is one of the
// source's points, whole, and the next cycle brings it to the source's
// newest.
func TestTargetSurvivesPowerCuts(t *testing.T) {
	ctx := context.Background()
	runs := 30
	if raceOn {
		runs = 6
	}
	for run := range runs {
		rng := rand.New(rand.NewPCG(uint64(run), 21))
		src := volume(t, openPool(t, t.TempDir()), vm("vm"))
		s, _ := NewSource(src, "b")
		cfs := crashfs.New("/crash")
		cfs.KeepPartial(uint64(run))
		open := func() *pool.Pool {
			p, err := pool.OpenWith(ctx, "/crash", pool.Options{FS: cfs, Logger: quiet})
			if err != nil {
				t.Fatalf("run %d: open the target: %v", run, err)
			}
			return p
		}
		tp := open()
		dst := volume(t, tp, pool.VolumeSpec{Name: "vm-dr", Capacity: mib})
		r, _ := NewReceiver(dst, "b", 2)
		points := map[string]map[string][]byte{}
		for range 2 {
			scribble(t, src, rng, 40)
			st, err := s.Cycle(ctx, r)
			if err != nil {
				t.Fatalf("run %d: %v", run, err)
			}
			points[st.Point.Snapshot] = content(t, src, st.Point.Snapshot)
		}
		scribble(t, src, rng, 40)
		// Nothing writes the source during the cycle: its point is this.
		pending := content(t, src, "")
		cfs.CutAtSync(len(cfs.Syncs())+1+rng.IntN(30), rng.IntN(2) == 0)
		_, _ = s.Cycle(ctx, r)
		_ = tp.Close()
		cfs.CutPower()
		cfs.Reboot()
		tp = open()
		dst, err := tp.Volume("vm-dr")
		if err != nil {
			t.Fatalf("run %d: %v", run, err)
		}
		r, _ = NewReceiver(dst, "b", 2)
		last, ok, _ := r.Last(ctx)
		want, known := points[last.Snapshot]
		if !known && ok && last.Seq == 3 {
			want, known = pending, true // the cut cycle's point, committed
		}
		if !ok || !known {
			t.Fatalf("run %d: the target's last point after the cut is %v (%v), not one of the source's", run, last, ok)
		}
		sameContent(t, fmt.Sprintf("run %d: the last point after the cut", run), content(t, dst, last.Snapshot), want)
		st, err := s.Cycle(ctx, r)
		if err != nil {
			t.Fatalf("run %d: the cycle after the reboot: %v", run, err)
		}
		sameContent(t, fmt.Sprintf("run %d: the point after the reboot", run), content(t, dst, st.Point.Snapshot),
			content(t, src, st.Point.Snapshot))
		_ = tp.Close()
	}
}
