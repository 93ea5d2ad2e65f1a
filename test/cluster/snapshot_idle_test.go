package clustertest

import (
	"context"
	"testing"
	"time"

	"github.com/quiverstorage/quiver/internal/api"
)

// TestReplicatedSnapshotIdle: a snapshot of a replicated volume that no
// client has open is taken on both copies. The snapshot's replication Sets
// are then their only users; releasing them while still frozen closed them
// under their own gate and hung the request (found with node drain's
// hand-over, which freezes the same way).
func TestReplicatedSnapshotIdle(t *testing.T) {
	c := startCluster(t)
	ctx := context.Background()
	v, err := c.nodes[0].api().CreateVolume(ctx, api.VolumeSpec{Name: "idle", Capacity: 4 << 20, Replicas: 2,
		Disks: []api.DiskSpec{{Name: "d0", Size: 4 << 20}}})
	if err != nil {
		t.Fatal(err)
	}
	cctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	snap, err := c.byName(v.Primary).api().CreateSnapshot(cctx, "idle", "s1")
	if err != nil {
		t.Fatalf("snapshot of a replicated volume no client has open: %v", err)
	}
	for _, n := range copyNodes(v) {
		s, err := c.byName(n).api().GetSnapshot(ctx, "idle", "s1")
		if err != nil || s.UID != snap.UID {
			t.Fatalf("snapshot on %s: %+v (%v), want UID %s", n, s, err, snap.UID)
		}
	}
	// A second one: the Sets were closed, not left frozen.
	if _, err := c.byName(v.Primary).api().CreateSnapshot(cctx, "idle", "s2"); err != nil {
		t.Fatalf("second snapshot: %v", err)
	}
}
