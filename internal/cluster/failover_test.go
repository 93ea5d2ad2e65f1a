package cluster

import (
	"context"
	"encoding/json"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/quiverstorage/quiver/internal/api"
)

// record reads a volume's record from etcd.
func (n *Node) record(t *testing.T, volume string) volumeRecord {
	t.Helper()
	resp, err := n.cli.Get(context.Background(), n.key("volumes", volume))
	if err != nil || len(resp.Kvs) == 0 {
		t.Fatalf("volume %s: %v", volume, err)
	}
	var rec volumeRecord
	if err := json.Unmarshal(resp.Kvs[0].Value, &rec); err != nil {
		t.Fatal(err)
	}
	return rec
}

func waitFor(t *testing.T, what string, ok func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !ok() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestFailover: when a primary's lease ends, an in-sync copy is promoted at
// term+1, takes over the attachments the primary published, and the other
// in-sync copy follows the new term; a copy out of sync is never promoted.
func TestFailover(t *testing.T) {
	tc := startCluster(t) // n1, with the etcd member: never the primary here
	stores := map[string]*memStore{"n1": tc.firstStore, "n2": newMemStore(), "n3": newMemStore()}
	stores["n2"].free, stores["n3"].free = 90<<30, 80<<30
	n2 := tc.join(t, tc.config(t, "n2"), stores["n2"])
	n3 := tc.join(t, tc.config(t, "n3"), stores["n3"])
	ctx := context.Background()
	never := func(bool, string) bool { return false }
	for _, spec := range []api.VolumeSpec{{Name: "two", Capacity: 1 << 30, Replicas: 2},
		{Name: "three", Capacity: 1 << 30, Replicas: 3}, {Name: "stale", Capacity: 1 << 30, Replicas: 2}} {
		p, _, err := tc.first.Volumes().CreateVolume(ctx, spec, "", never)
		if err != nil {
			t.Fatal(err)
		}
		if p.Primary != "n2" || p.Term != 1 {
			t.Fatalf("%s placed %+v: want primary n2 at term 1", spec.Name, p)
		}
		pr, err := n2.Primaries().HoldPrimary(ctx, spec.Name)
		if err != nil || pr.Term != 1 {
			t.Fatalf("n2 holds %s: %+v %v", spec.Name, pr, err)
		}
		if _, err := n3.Primaries().HoldPrimary(ctx, spec.Name); !errors.Is(err, ErrNotPrimary) {
			t.Fatalf("n3 holds %s: %v, want ErrNotPrimary", spec.Name, err)
		}
	}
	state := []byte(`{"kind":"Attachments","version":1,"epoch":3}`)
	if err := n2.Primaries().PublishAttachments("two", state); err != nil {
		t.Fatal(err)
	}
	if err := n3.Primaries().PublishAttachments("two", []byte("{}")); err != nil {
		t.Fatal(err) // not the primary: nothing published, no error
	}
	// "stale": n3 misses writes from now on.
	if err := n2.Copies().MarkOutOfSync("stale", "n3", 1, errors.New("test: copy cut off")); err != nil {
		t.Fatal(err)
	}

	_ = n2.Close() // revokes its lease: alive/n2 and primary/* vanish
	waitFor(t, "two promoted", func() bool { r := tc.first.record(t, "two"); return r.Primary != "n2" })
	two := tc.first.record(t, "two")
	if two.Primary != "n3" || two.Term != 2 || !slices.Equal(two.InSync, []string{"n3"}) {
		t.Fatalf("two after n2 went down: %+v; want n3 primary at term 2, in sync alone", two)
	}
	stores["n3"].mu.Lock()
	adopted := stores["n3"].adopted["two"]
	stores["n3"].mu.Unlock()
	if adopted != string(state) {
		t.Fatalf("n3 adopted %q, want the state n2 published", adopted)
	}
	if pr, err := n3.Primaries().HoldPrimary(ctx, "two"); err != nil || pr.Term != 2 || !n3.Holds(pr) {
		t.Fatalf("n3 holds two: %+v %v", pr, err)
	}
	pl, _, err := tc.first.Volumes().Placement(ctx, "two")
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range pl.Copies {
		if c.Node == "n2" && c.State != CopyDegraded {
			t.Fatalf("the old primary's copy is %q, want degraded", c.State)
		}
	}

	// "three": one of n1 and n3 is promoted; the other follows term 2
	// (a new attachment for the new primary, recorded at term 2).
	waitFor(t, "three promoted", func() bool { return tc.first.record(t, "three").Term == 2 })
	three := tc.first.record(t, "three")
	nodes := map[string]*Node{"n1": tc.first, "n3": n3}
	np := nodes[three.Primary]
	if np == nil {
		t.Fatalf("three promoted to %s", three.Primary)
	}
	waitFor(t, "the other copy to follow term 2", func() bool {
		r, err := np.Primaries().Role(ctx, "three")
		return err == nil && len(r.Targets) == 1 && r.Targets[0].Term == 2
	})
	r, _ := np.Primaries().Role(ctx, "three")
	if tgt := r.Targets[0]; tgt.Instance == "" || !stores[tgt.Node].hasAttached("three", np.Name(), 2) {
		t.Fatalf("target %+v: want its instance, and its attachment for %s at term 2", tgt, np.Name())
	}

	// "stale": its only other copy is out of date: never promoted.
	time.Sleep(4 * electInterval)
	if st := tc.first.record(t, "stale"); st.Primary != "n2" || st.Term != 1 {
		t.Fatalf("stale: %+v; an out-of-date copy was promoted", st)
	}
	if n := n3.failovers.Load() + tc.first.failovers.Load(); n != 2 {
		t.Fatalf("%d promotions counted, want 2", n)
	}
}

// TestPromotionOnLeaseEnd: a copy is promoted as soon as etcd ends the
// primary's lease, by the watch of primary/, not at the next election
// tick: with the ticker an hour away, the promotion still comes.
func TestPromotionOnLeaseEnd(t *testing.T) {
	tc := startCluster(t)
	s2, s3 := newMemStore(), newMemStore()
	s2.free, s3.free = 90<<30, 80<<30
	c2, c3 := tc.config(t, "n2"), tc.config(t, "n3")
	c2.electEvery, c3.electEvery = time.Hour, time.Hour
	n2 := tc.join(t, c2, s2)
	n3 := tc.join(t, c3, s3)
	ctx := context.Background()
	p, _, err := tc.first.Volumes().CreateVolume(ctx, api.VolumeSpec{Name: "vm", Capacity: 1 << 30, Replicas: 2}, "",
		func(bool, string) bool { return false })
	if err != nil {
		t.Fatal(err)
	}
	if p.Primary != "n2" {
		t.Fatalf("placed %+v: want primary n2", p)
	}
	// The primary takes its key when it first serves the volume.
	if _, err := n2.Primaries().HoldPrimary(ctx, "vm"); err != nil {
		t.Fatal(err)
	}
	_ = n2.Close() // revokes its lease: primary/vm goes
	waitFor(t, "vm promoted", func() bool { return tc.first.record(t, "vm").Primary == "n3" })
	if r := tc.first.record(t, "vm"); r.Term != 2 {
		t.Fatalf("vm after n2 went down: %+v; want n3 primary at term 2", r)
	}
	if _, err := n3.Primaries().HoldPrimary(ctx, "vm"); err != nil {
		t.Fatalf("n3 holds vm: %v", err)
	}
}

// TestFailoverBehindCopiesFollow: after a failover, the copies out of sync
// follow the new term too, so the new primary can resync them through a
// token of its own term, and are marked whole (what they missed is in an
// older primary's bitmaps, or unknown): the old primary once it is back,
// and a copy that was already degraded. MarkInSync clears it.
func TestFailoverBehindCopiesFollow(t *testing.T) {
	tc := startCluster(t) // n1: the etcd member, not placed on here
	stores := map[string]*memStore{"n2": newMemStore(), "n3": newMemStore(), "n4": newMemStore()}
	stores["n2"].free, stores["n3"].free, stores["n4"].free = 90<<30, 80<<30, 70<<30
	cfg2 := tc.config(t, "n2")
	n2 := tc.join(t, cfg2, stores["n2"])
	n3 := tc.join(t, tc.config(t, "n3"), stores["n3"])
	tc.join(t, tc.config(t, "n4"), stores["n4"])
	ctx := context.Background()
	never := func(bool, string) bool { return false }
	p, _, err := tc.first.Volumes().CreateVolume(ctx, api.VolumeSpec{Name: "v", Capacity: 1 << 30, Replicas: 3}, "", never)
	if err != nil {
		t.Fatal(err)
	}
	if p.Primary != "n2" || len(p.Copies) != 3 {
		t.Fatalf("placed %+v: want primary n2, three copies", p)
	}
	if _, err := n2.Primaries().HoldPrimary(ctx, "v"); err != nil {
		t.Fatal(err)
	}
	// n4 falls behind under n2 (its bitmap would be n2's).
	if err := n2.Copies().MarkOutOfSync("v", "n4", 1, errors.New("test: copy cut off")); err != nil {
		t.Fatal(err)
	}
	_ = n2.Close()
	waitFor(t, "v promoted", func() bool { return tc.first.record(t, "v").Primary == "n3" })
	if r := tc.first.record(t, "v"); r.Term != 2 {
		t.Fatalf("v after n2 went down: %+v; want n3 at term 2", r)
	}
	// n4 (up all along) follows term 2 while out of sync, and is whole.
	behind := func(node string) (Target, bool) {
		r, err := n3.Primaries().Role(ctx, "v")
		if err != nil {
			return Target{}, false
		}
		for _, b := range r.Behind {
			if b.Node == node {
				return b, true
			}
		}
		return Target{}, false
	}
	waitFor(t, "n4 to follow term 2", func() bool { b, ok := behind("n4"); return ok && b.Term == 2 })
	if b, _ := behind("n4"); !b.Whole || !stores["n4"].hasAttached("v", "n3", 2) || b.State != CopyDegraded {
		t.Fatalf("n4 behind: %+v; want degraded, whole, attached for n3 at term 2", b)
	}
	// The old primary: degraded and whole at once; back, it follows term 2.
	if b, ok := behind("n2"); !ok || !b.Whole || b.State != CopyDegraded || b.Term >= 2 {
		t.Fatalf("n2 behind while down: %+v %v; want degraded, whole, not at term 2", b, ok)
	}
	tc.join(t, cfg2, stores["n2"])
	waitFor(t, "n2 to follow term 2", func() bool { b, ok := behind("n2"); return ok && b.Term == 2 })
	if b, _ := behind("n2"); !b.Whole || !stores["n2"].hasAttached("v", "n3", 2) {
		t.Fatalf("n2 behind once back: %+v; want whole, attached for n3 at term 2", b)
	}
	if err := n3.Copies().MarkInSync("v", "n2", 2); err != nil {
		t.Fatal(err)
	}
	pl, _, err := tc.first.Volumes().Placement(ctx, "v")
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range pl.Copies {
		if c.Node == "n2" && (c.State != CopyInSync || c.Whole) {
			t.Fatalf("n2 back in sync: %+v; want in-sync, not whole", c)
		}
	}
}
