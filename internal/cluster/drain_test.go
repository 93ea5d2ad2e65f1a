package cluster

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/quiverstorage/quiver/internal/api"
)

// TestPlanDrain: a drain's plan, its refusals (nothing recorded), the
// drained mark in placement, and the hand-over and removal transactions.
func TestPlanDrain(t *testing.T) {
	tc := startCluster(t)
	n2 := tc.join(t, tc.config(t, "n2"), newMemStore())
	tc.join(t, tc.config(t, "n3"), newMemStore())
	n1 := tc.first
	ctx := context.Background()
	never := func(bool, string) bool { return false }
	create := func(name string, replicas int) {
		t.Helper()
		if _, _, err := n1.Volumes().CreateVolume(ctx, api.VolumeSpec{Name: name, Capacity: 1 << 30, Replicas: replicas}, "", never); err != nil {
			t.Fatalf("create %s: %v", name, err)
		}
	}
	create("a", 2) // n1 (primary), n2: every node reports the same free bytes
	moves, err := n1.Volumes().PlanDrain(ctx, "n1")
	if err != nil || len(moves) != 1 || moves[0] != (Move{Volume: "a", To: "n3", Primary: true, Capacity: 1 << 30}) {
		t.Fatalf("plan: %+v, %v", moves, err)
	}
	if _, err := n1.Volumes().PlanDrain(ctx, "n9"); !errors.Is(err, ErrNodeNotFound) {
		t.Fatalf("drain of an unknown node: %v", err)
	}
	create("single", 1) // on n3, which holds no copy yet
	pl, _, err := n1.Volumes().Placement(ctx, "single")
	if err != nil || len(pl.Copies) != 1 {
		t.Fatalf("single: %+v, %v", pl, err)
	}
	if _, err := n1.Volumes().PlanDrain(ctx, pl.Copies[0].Node); !errors.Is(err, ErrNotSupported) || !strings.Contains(err.Error(), `"single"`) {
		t.Fatalf("drain with a volume of one copy: %v", err)
	}
	if err := n1.Volumes().DeleteVolume(ctx, "single"); err != nil {
		t.Fatal(err)
	}
	create("wide", 3)
	if _, err := n1.Volumes().PlanDrain(ctx, "n1"); !errors.Is(err, ErrNotEnoughNodes) || !strings.Contains(err.Error(), `"wide"`) {
		t.Fatalf("drain with nowhere to go: %v", err)
	}
	if err := n1.Volumes().DeleteVolume(ctx, "wide"); err != nil {
		t.Fatal(err)
	}
	// A drained node is not a target, and gets no new copy.
	if err := n1.SetDrain(ctx, "n3", DrainDone); err != nil {
		t.Fatal(err)
	}
	if _, err := n1.Volumes().PlanDrain(ctx, "n1"); !errors.Is(err, ErrNotEnoughNodes) || !strings.Contains(err.Error(), "n3 is drained") {
		t.Fatalf("drain with the only other node drained: %v", err)
	}
	if _, _, err := n1.Volumes().CreateVolume(ctx, api.VolumeSpec{Name: "w3", Capacity: 1 << 30, Replicas: 3}, "", never); !errors.Is(err, ErrNotEnoughNodes) {
		t.Fatalf("replicas 3 with a node drained: %v", err)
	}
	if was, err := n1.Undrain(ctx, "n3"); err != nil || !was {
		t.Fatalf("undrain: %v %v", was, err)
	}
	if state, _ := n1.Drained(ctx, "n3"); state != "" {
		t.Fatalf("n3 still %s", state)
	}

	// The new copy, then the hand-over as the primary holding its key.
	if err := n1.Volumes().AddCopy(ctx, "a", "n3", "test"); err != nil {
		t.Fatal(err)
	}
	if rec := n1.record(t, "a"); !slices.Equal(rec.Copies, []string{"n1", "n2", "n3"}) || slices.Contains(rec.InSync, "n3") {
		t.Fatalf("after AddCopy: %+v", rec)
	}
	waitFor(t, "n1 holding primary/a", func() bool {
		_, err := n1.Primaries().HoldPrimaryKey(ctx, "a")
		return err == nil
	})
	if err := n1.Volumes().RemoveCopy(ctx, "a", "n1"); !errors.Is(err, ErrNotPrimary) {
		t.Fatalf("removing the primary's copy: %v", err)
	}
	to, term, err := n1.Primaries().HandOver(ctx, "a", 1)
	if err != nil || to != "n2" || term != 2 {
		t.Fatalf("hand-over: %s %d %v", to, term, err)
	}
	rec := n1.record(t, "a")
	if rec.Primary != "n2" || rec.Term != 2 || slices.Contains(rec.Copies, "n1") || slices.Contains(rec.InSync, "n1") ||
		!slices.Equal(rec.Removing, []string{"n1"}) {
		t.Fatalf("after the hand-over: %+v", rec)
	}
	if uid, err := n1.Volumes().RemovingUID(ctx, "a"); err != nil || uid == "" {
		t.Fatalf("n1's copy not recorded removing: %q %v", uid, err)
	}
	waitFor(t, "n2 holding primary/a at term 2", func() bool {
		pr, err := n2.Primaries().HoldPrimaryKey(ctx, "a")
		return err == nil && pr.Term == 2
	})
	if _, _, err := n1.Primaries().HandOver(ctx, "a", 1); !errors.Is(err, ErrNotPrimary) {
		t.Fatalf("second hand-over by the old primary: %v", err)
	}
	if err := n1.Volumes().RemovedCopy(ctx, "a"); err != nil {
		t.Fatal(err)
	}
	if rec := n1.record(t, "a"); len(rec.Removing) != 0 {
		t.Fatalf("removing left: %+v", rec)
	}
	if p, _, _ := n1.Volumes().Placement(ctx, "a"); slices.ContainsFunc(p.Copies, func(c CopyInfo) bool { return c.Node == "n1" }) {
		t.Fatalf("n1 still placed: %+v", p)
	}
}
