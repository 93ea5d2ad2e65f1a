package replicated

import (
	"context"
	"errors"
	"testing"

	"github.com/quiverstorage/quiver/internal/cluster"
)

// TestResyncStartNotRecorded (issue 29): a resync whose start cannot be
// recorded in etcd (the copy's state, as the primary at its term) stops
// there, and leaves the copy out of sync; once etcd answers, the next
// resync brings it back.
func TestResyncStartNotRecorded(t *testing.T) {
	nodes := startNodes(t)
	ctx := context.Background()
	prim, other := placeVolume(t, nodes, "r")
	if err := prim.node.Copies().MarkOutOfSync("r", other, 1, errors.New("test: the copy failed a write")); err != nil {
		t.Fatal(err)
	}
	sets := newReplicaSets(prim.node, prim.pool, quietLogger(), newReplMetrics(), cluster.Config{}, nil)
	state := func() string {
		p, _, err := prim.node.Volumes().Placement(ctx, "r")
		if err != nil {
			t.Fatal(err)
		}
		for _, c := range p.Copies {
			if c.Node == other {
				return c.State
			}
		}
		t.Fatalf("no copy on %s: %+v", other, p)
		return ""
	}
	p, _, err := prim.node.Volumes().Placement(ctx, "r")
	if err != nil {
		t.Fatal(err)
	}
	prim.fault.arm(putsOnly("/quiver/copies/r/"+other), false, false)
	err = sets.resync(ctx, "r", other, p, false, nil)
	if prim.fault.hit() != 1 || err == nil {
		t.Fatalf("resync whose start was not recorded: %v (fault fired %d times), want an error", err, prim.fault.hit())
	}
	if s := state(); s == cluster.CopyInSync {
		t.Fatalf("copy %s after a resync whose start was not recorded: %s, want out of sync", other, s)
	}
	t.Logf("stopped: %v", err)
	if err := sets.resync(ctx, "r", other, p, false, nil); err != nil {
		t.Fatal(err)
	}
	if s := state(); s != cluster.CopyInSync {
		t.Fatalf("copy %s after a resync: %s, want in sync", other, s)
	}
}
