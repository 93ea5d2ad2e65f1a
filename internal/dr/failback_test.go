package dr

import (
	"bytes"
	"context"
	"errors"
	"math/rand/v2"
	"testing"

	"github.com/quiverstorage/quiver/internal/pool"
)

// writeAt writes n bytes of b at off of disk d of v.
func writeAt(t *testing.T, v *pool.Volume, d string, off, n int64, b byte) {
	t.Helper()
	h, err := v.OpenDisk(d)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	if err := h.WriteAt(bytes.Repeat([]byte{b}, int(n)), off, false); err != nil {
		t.Fatal(err)
	}
}

// TestFailback: site A ships to B; A is lost mid-cycle (a point it took
// but never shipped stays behind) and B is promoted; both sides write.
// When A returns it is demoted: B's first cycle back ships only what B
// changed since the last point both had (at most 1.2 times the granules
// changed on either side), A's own writes since are rolled back and its
// stray point dropped, and both sides end byte-identical. Then a planned
// migration back: B's final cycle, B demoted, A promoted at B's last
// point, and A ships to B again as a delta of nothing.
func TestFailback(t *testing.T) {
	ctx := context.Background()
	pa, pb := openPool(t, t.TempDir()), openPool(t, t.TempDir())
	a := volume(t, pa, vm("vm"))
	tsA, tsB := NewTargets(pa, 3), NewTargets(pb, 3)
	if _, err := tsB.Accept(ctx, "db", "vm-dr"); err != nil {
		t.Fatal(err)
	}
	rB, err := tsB.Receiver("db")
	if err != nil {
		t.Fatal(err)
	}
	sA, _ := NewSource(a, "db")
	rng := rand.New(rand.NewPCG(9, 10))
	scribble(t, a, rng, 100)
	if _, err := sA.Cycle(ctx, rB); err != nil {
		t.Fatal(err)
	}
	scribble(t, a, rng, 5)
	common, err := sA.Cycle(ctx, rB)
	if err != nil {
		t.Fatal(err)
	}

	// A writes on and takes a point it never ships: the site is lost.
	const g = 64 << 10 // the change tracking's granule
	for i := range int64(6) {
		writeAt(t, a, "root", i*3*g, g, byte(0xa0+i))
	}
	stray := newPoint("db", common.Point.Seq+1)
	if _, _, err := a.CreateSnapshot(ctx, stray.Snapshot, nil); err != nil {
		t.Fatal(err)
	}
	// B takes over at the common point and writes too, some of it where
	// A wrote.
	b, err := pb.Volume("vm-dr")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tsB.Promote(ctx, "db"); err != nil {
		t.Fatal(err)
	}
	if _, err := tsB.Promote(ctx, "db"); !errors.Is(err, ErrNoTarget) {
		t.Fatalf("a promote on the side already primary: %v, want ErrNoTarget", err)
	}
	for i := range int64(4) {
		writeAt(t, b, "data", i*2*g, g, byte(0xb0+i))
	}
	writeAt(t, b, "root", 3*g, g, 0xbb) // where A wrote too
	changedEither := int64(6+4) * g     // A's six granules and B's five, one shared

	// A returns. Not while a VM writes there, not without a common point.
	att, _, err := a.Attach("vm-node", pool.ModeReadWrite)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tsA.Demote(ctx, "db", "vm"); !errors.Is(err, pool.ErrBusy) {
		t.Fatalf("demoting a volume a VM may write: %v, want ErrBusy", err)
	}
	if err := a.Detach(att.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := tsA.Demote(ctx, "db2", "vm"); !errors.Is(err, pool.ErrInvalid) {
		t.Fatalf("demoting for a relationship of no point here: %v, want ErrInvalid", err)
	}
	if _, err := tsA.Demote(ctx, "db", "vm"); err != nil {
		t.Fatal(err)
	}
	rA, err := tsA.Receiver("db")
	if err != nil {
		t.Fatal(err)
	}
	sB, _ := NewSource(b, "db")
	back, err := sB.Cycle(ctx, rA)
	if err != nil {
		t.Fatal(err)
	}
	shipped := back.Sent + back.Zeroed
	if back.Base != common.Point.Snapshot || shipped == 0 || shipped > changedEither*12/10 {
		t.Fatalf("the first cycle back: %+v (%d bytes shipped), want a delta from %s of at most 1.2 x %d",
			back, shipped, common.Point.Snapshot, changedEither)
	}
	t.Logf("failback: %d bytes shipped for %d changed on either side since the common point", shipped, changedEither)
	sameContent(t, "A after the failback", content(t, a, back.Point.Snapshot), content(t, b, back.Point.Snapshot))
	sameContent(t, "A's live disks after the failback", content(t, a, ""), content(t, b, back.Point.Snapshot))
	if _, err := a.Snapshot(stray.Snapshot); !errors.Is(err, pool.ErrSnapshotNotFound) {
		t.Fatalf("A's stray point after the failback: %v, want it dropped", err)
	}

	// A planned migration back to A: the last cycle, B demoted, A
	// promoted; then A ships to B again, a delta of nothing.
	scribble(t, b, rng, 5)
	final, err := sB.Cycle(ctx, rA)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tsB.Demote(ctx, "db", "vm-dr"); err != nil {
		t.Fatal(err)
	}
	if _, err := tsA.Promote(ctx, "db"); err != nil {
		t.Fatal(err)
	}
	sameContent(t, "A promoted after the planned migration", content(t, a, ""), content(t, b, ""))
	rB, _ = tsB.Receiver("db")
	again, err := sA.Cycle(ctx, rB)
	if err != nil {
		t.Fatal(err)
	}
	if again.Base != final.Point.Snapshot || again.Changed != 0 {
		t.Fatalf("A's first cycle after the migration back: %+v, want nothing changed since %s", again, final.Point.Snapshot)
	}
}
