package replicated

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/quiverstorage/quiver/internal/cluster"
	"github.com/quiverstorage/quiver/internal/nbd"
)

// TestHandOverUnknownOutcome (issue 29): the primary freezes the volume's
// Sets, records the hand-over in etcd and retires the Sets. When that
// transaction's answer is lost, the old primary acknowledges a write
// afterwards only if etcd shows it still the primary:
//
//   - lost before it reached etcd: etcd shows the old primary still at its
//     term; HandOver fails and the write is acknowledged;
//   - applied, its answer lost, and etcd out of reach until the hand-over
//     gives up: HandOver fails, and the write is abandoned (nbd.ErrAbandon),
//     never acknowledged; etcd, back, shows the new primary;
//   - applied, its answer lost, etcd in reach: HandOver reads that it
//     applied and succeeds; the write is abandoned.
func TestHandOverUnknownOutcome(t *testing.T) {
	nodes := startNodes(t)
	ctx := context.Background()
	buf := make([]byte, 4096)

	// open places volume and opens its disk on the primary as a client
	// would.
	open := func(volume string) (*testNode, *Volumes, nbd.Export, string) {
		t.Helper()
		prim, _ := placeVolume(t, nodes, volume)
		sets := newReplicaSets(prim.node, prim.pool, quietLogger(), newReplMetrics(), cluster.Config{}, nil)
		ex, err := Exports{Exports: nbd.PoolExports{Pool: prim.pool}, node: prim.node, log: quietLogger(),
			sets: sets}.Open(ctx, volume+"/d0", "test")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = ex.Disk.Close() })
		if err := ex.Disk.WriteAt(buf, 0, true); err != nil {
			t.Fatalf("write before the hand-over: %v", err)
		}
		return prim, sets, ex, "/quiver/primary/" + volume
	}
	primaryOf := func(volume string) (string, uint64) {
		p, _, err := nodes["n1"].node.Volumes().Placement(ctx, volume)
		if err != nil {
			t.Fatal(err)
		}
		return p.Primary, p.Term
	}

	// Lost before it reached etcd.
	prim, sets, ex, pk := open("lost")
	prim.fault.arm(deletes(pk), false, false)
	_, err := sets.HandOver(ctx, "lost")
	if prim.fault.hit() != 1 || err == nil {
		t.Fatalf("hand-over lost before etcd: %v (fault fired %d times), want an error", err, prim.fault.hit())
	}
	if who, term := primaryOf("lost"); who != prim.node.Name() || term != 1 {
		t.Fatalf("etcd shows %s at term %d, want %s still at term 1", who, term, prim.node.Name())
	}
	if err := ex.Disk.WriteAt(buf, 4096, true); err != nil {
		t.Fatalf("write on the primary etcd still shows: %v", err)
	}

	// Applied, its answer lost, etcd out of reach.
	prim, sets, ex, pk = open("dark")
	prim.fault.arm(deletes(pk), true, true)
	hctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	_, err = sets.HandOver(hctx, "dark")
	cancel()
	if prim.fault.hit() != 1 || !errors.Is(err, cluster.ErrUnknownOutcome) {
		t.Fatalf("hand-over applied with etcd out of reach: %v (fault fired %d times), want ErrUnknownOutcome", err,
			prim.fault.hit())
	}
	werr := ex.Disk.WriteAt(buf, 4096, true)
	prim.fault.heal()
	if who, term := primaryOf("dark"); who == prim.node.Name() || term != 2 {
		t.Fatalf("etcd shows %s at term %d, want the other node at term 2", who, term)
	}
	if !errors.Is(werr, nbd.ErrAbandon) {
		t.Fatalf("write after a hand-over of unknown outcome, which applied: %v, want it abandoned", werr)
	}

	// Applied, its answer lost, etcd in reach.
	prim, sets, ex, pk = open("applied")
	prim.fault.arm(deletes(pk), true, false)
	to, err := sets.HandOver(ctx, "applied")
	if prim.fault.hit() != 1 || err != nil || to == prim.node.Name() {
		t.Fatalf("hand-over applied with its answer lost: %q, %v (fault fired %d times)", to, err, prim.fault.hit())
	}
	if who, term := primaryOf("applied"); who != to || term != 2 {
		t.Fatalf("etcd shows %s at term %d, want %s at term 2", who, term, to)
	}
	if err := ex.Disk.WriteAt(buf, 4096, true); !errors.Is(err, nbd.ErrAbandon) {
		t.Fatalf("write after the hand-over: %v, want it abandoned", err)
	}
}
