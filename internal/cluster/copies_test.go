package cluster

import (
	"context"
	"errors"
	"testing"

	"github.com/quiverstorage/quiver/internal/api"
)

// TestMarkOutOfSync: only the primary, at its term and holding its lease,
// takes a copy out of the in-sync set; the copy is then degraded, and the
// primary writes no copy but the in-sync ones.
func TestMarkOutOfSync(t *testing.T) {
	tc := startCluster(t)
	n2 := tc.join(t, tc.config(t, "n2"), newMemStore())
	ctx := context.Background()
	never := func(bool, string) bool { return false }
	p, _, err := tc.first.Volumes().CreateVolume(ctx, api.VolumeSpec{Name: "web01", Capacity: 1 << 30, Replicas: 2}, "", never)
	if err != nil {
		t.Fatal(err)
	}
	nodes := map[string]*Node{"n1": tc.first, "n2": n2}
	prim, other := nodes[p.Primary], nodes[p.Copies[1].Node]
	role, err := prim.Primaries().Role(ctx, "web01")
	if err != nil || !role.IsPrimary(prim.Name()) || len(role.Targets) != 1 || role.Targets[0].Node != other.Name() ||
		role.Targets[0].Instance != other.Instance() || role.Targets[0].Term != 1 || role.Term != 1 {
		t.Fatalf("primary's role %+v, %v", role, err)
	}
	if r, _ := other.Primaries().Role(ctx, "web01"); r.IsPrimary(other.Name()) || r.CopyTerm != 1 || len(r.Targets) != 0 {
		t.Fatalf("copy's role %+v", r)
	}
	cause := errors.New("connection refused")
	if err := other.Copies().MarkOutOfSync("web01", prim.Name(), 1, cause); !errors.Is(err, ErrNotPrimary) || errors.Is(err, ErrNoSession) {
		t.Fatalf("a copy marking the primary out of sync: %v", err)
	}
	if err := prim.Copies().MarkOutOfSync("web01", other.Name(), 2, cause); !errors.Is(err, ErrNotPrimary) || errors.Is(err, ErrNoSession) {
		t.Fatalf("the primary at a term it does not hold: %v", err)
	}
	if err := prim.Copies().MarkOutOfSync("web01", other.Name(), 1, cause); err != nil {
		t.Fatal(err)
	}
	if err := prim.Copies().MarkOutOfSync("web01", other.Name(), 1, cause); err != nil {
		t.Fatalf("again (a concurrent request): %v", err)
	}
	got, _, _ := prim.Volumes().Placement(ctx, "web01")
	for _, c := range got.Copies {
		want := CopyInSync
		if c.Node == other.Name() {
			want = CopyDegraded
		}
		if c.State != want {
			t.Errorf("copy %+v, want %s", c, want)
		}
	}
	if role, _ := prim.Primaries().Role(ctx, "web01"); len(role.Targets) != 0 {
		t.Fatalf("still writing the degraded copy: %+v", role.Targets)
	}
	// A primary without its session acknowledges nothing that needs a
	// copy dropped.
	_ = prim.Close()
	if err := prim.Copies().MarkOutOfSync("web01", other.Name(), 1, cause); !errors.Is(err, ErrNoSession) {
		t.Fatalf("after the session ended: %v", err)
	}
}
