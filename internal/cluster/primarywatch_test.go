package cluster

import (
	"context"
	"testing"
	"time"

	"github.com/quiverstorage/quiver/internal/api"
)

// TestWatchPrimary: a node that is not the volume's primary is told once
// its watch is in place, and then when the primary's lease ends and a copy
// is promoted: after the last signal, Role names the new primary. Once its
// context ends, the channel is closed. The 30 s bounds only check
// liveness.
func TestWatchPrimary(t *testing.T) {
	tc := startCluster(t) // n1, with the etcd member: never the primary here
	stores := map[string]*memStore{"n2": newMemStore(), "n3": newMemStore()}
	stores["n2"].free, stores["n3"].free = 90<<30, 80<<30
	n2 := tc.join(t, tc.config(t, "n2"), stores["n2"])
	tc.join(t, tc.config(t, "n3"), stores["n3"])
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	never := func(bool, string) bool { return false }
	if p, _, err := tc.first.Volumes().CreateVolume(ctx, api.VolumeSpec{Name: "two", Capacity: 1 << 30, Replicas: 2}, "", never); err != nil || p.Primary != "n2" {
		t.Fatalf("placed %+v, %v: want primary n2", p, err)
	}
	if _, err := n2.Primaries().HoldPrimary(ctx, "two"); err != nil {
		t.Fatal(err)
	}
	moves := tc.first.Primaries().WatchPrimary(ctx, "two")
	next := func(what string) {
		t.Helper()
		select {
		case _, ok := <-moves:
			if !ok {
				t.Fatalf("%s: the channel is closed", what)
			}
		case <-time.After(30 * time.Second):
			t.Fatalf("%s: no signal in 30 s", what)
		}
	}
	next("the watch in place")

	_ = n2.Close() // revokes its lease: primary/two vanishes, n3 is promoted
	for {
		next("the promotion")
		r, err := tc.first.Primaries().Role(ctx, "two")
		if err != nil {
			t.Fatal(err)
		}
		if r.Primary == "n3" {
			break
		}
	}
	cancel()
	for range moves { // a signal may be pending; then the channel closes
	}
}
