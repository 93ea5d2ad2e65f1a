package cluster

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"google.golang.org/grpc"

	"github.com/quiverstorage/quiver/internal/api"
)

// TestSettleOf: clones and snapshots are undone, changes of the disks
// finished.
func TestSettleOf(t *testing.T) {
	for _, tc := range []struct {
		kinds []string
		want  Settlement
	}{
		{[]string{OpSnapshot}, SettleUndo},
		{[]string{OpRollback}, SettleFinish},
		{[]string{OpAddDisk}, SettleFinish},
		{[]string{OpGrowDisk}, SettleFinish},
		{[]string{OpRemoveDisk}, SettleFinish},
		{[]string{OpClone}, SettleUndo},
		{[]string{OpClone, OpClone}, SettleUndo},
	} {
		var in Intent
		for _, k := range tc.kinds {
			in.Ops = append(in.Ops, Op{Kind: k})
		}
		if got := SettleOf(in); got != tc.want {
			t.Errorf("%v: %s, want %s", tc.kinds, got, tc.want)
		}
	}
}

// TestNeedsSettling: an intent this process began is left to it (it may
// have let I/O go on after it); one of another node, or of an earlier
// process of this node, is settled; one settled already is not.
func TestNeedsSettling(t *testing.T) {
	for _, tc := range []struct {
		name    string
		in      Intent
		ownHere bool
		want    bool
	}{
		{"begun by this process", Intent{ID: "i1", Primary: "n1"}, true, false},
		{"another node's, or an earlier process's", Intent{ID: "i1", Primary: "n1"}, false, true},
		{"undone, waiting for its nodes", Intent{ID: "i1", Primary: "n2", Settled: true, Pending: []string{"n2"}}, false, false},
	} {
		if got := NeedsSettling(tc.in, tc.ownHere); got != tc.want {
			t.Errorf("%s: %v, want %v", tc.name, got, tc.want)
		}
	}
}

// TestUndoOps: a clone is undone unless its name is placed with its own
// UID; a snapshot is deleted by its UID.
func TestUndoOps(t *testing.T) {
	in := Intent{Ops: []Op{{Kind: OpClone, Name: "a", UID: "ua"}, {Kind: OpClone, Name: "b", UID: "ub"},
		{Kind: OpClone, Name: "c", UID: "uc"}}}
	got := UndoOps(in, map[string]string{"a": "ua", "b": "other"})
	var names []string
	for _, op := range got {
		if op.Kind != OpUnclone || op.UID == "" {
			t.Fatalf("undo op %+v", op)
		}
		names = append(names, op.Name)
	}
	if !slices.Equal(names, []string{"b", "c"}) {
		t.Fatalf("unplaced %v, want [b c] (a is placed; b's name is another volume's)", names)
	}
	snap := UndoOps(Intent{Ops: []Op{{Kind: OpSnapshot, Name: "s", UID: "us"}}}, nil)
	if len(snap) != 1 || snap[0].Kind != OpDeleteSnapshot || snap[0].Name != "s" || snap[0].UID != "us" {
		t.Fatalf("snapshot undo %+v", snap)
	}
}

// TestPendingNodes: the holders of an undone intent are its primary and
// copies but this node; a node stays pending until it answered the undo,
// and is dropped once out of the placement.
func TestPendingNodes(t *testing.T) {
	in := Intent{Primary: "n1", Nodes: []string{"n2", "n3"}}
	if got := HoldersOf(in, "n2"); !slices.Equal(got, []string{"n1", "n3"}) {
		t.Fatalf("holders %v", got)
	}
	answered := map[string]error{"n1": errors.New("no answer"), "n3": nil}
	if got := StillPending([]string{"n1", "n3"}, answered, []string{"n1", "n2", "n3"}); !slices.Equal(got, []string{"n1"}) {
		t.Fatalf("pending %v, want [n1]", got)
	}
	if got := StillPending([]string{"n1"}, nil, []string{"n2", "n3"}); len(got) != 0 {
		t.Fatalf("pending %v: n1 left the placement", got)
	}
}

// TestIntentRecord: the etcd side. An intent is recorded only by the
// primary at its term under its lease, one at a time; ended, it is gone;
// settled with pending nodes it stays, settled. An unplaced clone is
// undone on the copy (by its record) and on the primary (by its manifest's
// source).
func TestIntentRecord(t *testing.T) {
	tc := startCluster(t)
	stores := map[string]*memStore{"n2": newMemStore(), "n3": newMemStore()}
	stores["n2"].free, stores["n3"].free = 90<<30, 80<<30
	n2 := tc.join(t, tc.config(t, "n2"), stores["n2"])
	n3 := tc.join(t, tc.config(t, "n3"), stores["n3"])
	ctx := context.Background()
	never := func(bool, string) bool { return false }
	if _, _, err := tc.first.Volumes().CreateVolume(ctx, api.VolumeSpec{Name: "v", Capacity: 1 << 30, Replicas: 2,
		Disks: []api.DiskSpec{{Name: "root", Size: 1 << 20}}}, "", never); err != nil {
		t.Fatal(err)
	}
	pr, err := n2.Primaries().HoldPrimaryKey(ctx, "v")
	if err != nil {
		t.Fatal(err)
	}
	grow := []Op{{Kind: OpGrowDisk, Name: "root", Disk: &api.DiskSpec{Name: "root", Size: 2 << 20}}}
	if _, err := n3.Ops().BeginIntent(ctx, "v", pr.Term, grow, []string{"n2"}); !errors.Is(err, ErrNotPrimary) {
		t.Fatalf("intent by a copy: %v", err)
	}
	if _, err := n2.Ops().BeginIntent(ctx, "v", pr.Term+1, grow, []string{"n3"}); !errors.Is(err, ErrNotPrimary) {
		t.Fatalf("intent at another term: %v", err)
	}
	in, err := n2.Ops().BeginIntent(ctx, "v", pr.Term, grow, []string{"n3"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := n2.Ops().BeginIntent(ctx, "v", pr.Term, grow, []string{"n3"}); !errors.Is(err, ErrIntentPending) {
		t.Fatalf("a second intent: %v", err)
	}
	got, ok, err := n3.Ops().VolumeIntent(ctx, "v")
	if err != nil || !ok || got.ID != in.ID || got.Primary != "n2" || got.Ops[0].Term != pr.Term ||
		!NeedsSettling(got, false) {
		t.Fatalf("intent read %+v %v %v", got, ok, err)
	}
	if err := n2.Ops().EndIntent(ctx, "v", pr.Term, in); err != nil {
		t.Fatal(err)
	}
	if _, ok, _ := n3.Ops().VolumeIntent(ctx, "v"); ok {
		t.Fatal("an ended intent is still recorded")
	}

	// Clones: the copy's made through the op, the primary's own in its
	// store (its record comes with the placement, which never happens).
	clone := Op{Kind: OpClone, Name: "c", UID: "uc", Nodes: []string{"n3"}}
	in, err = n2.Ops().BeginIntent(ctx, "v", pr.Term, []Op{clone}, []string{"n3"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := stores["n2"].CloneCopy(ctx, "v", clone); err != nil {
		t.Fatal(err)
	}
	if err := n2.Ops().RunOp(ctx, "v", pr.Term, clone); err != nil {
		t.Fatal(err)
	}
	// Undone on the primary; n3 does not answer (pending), then does.
	if err := n2.Ops().UndoClone(ctx, "v", clone); err != nil {
		t.Fatal(err)
	}
	if stores["n2"].has("c") || !stores["n3"].has("c") {
		t.Fatal("the primary's undo: its own clone must go, the copy's stay")
	}
	if err := n2.Ops().SettledIntent(ctx, "v", pr.Term, in, []string{"n3"}); err != nil {
		t.Fatal(err)
	}
	all, err := n3.Ops().Intents(ctx)
	if err != nil || !all["v"].Settled || !slices.Equal(all["v"].Pending, []string{"n3"}) || NeedsSettling(all["v"], false) {
		t.Fatalf("intents %+v %v: want v settled, n3 pending", all, err)
	}
	if _, err := n2.Ops().BeginIntent(ctx, "v", pr.Term, grow, nil); !errors.Is(err, ErrIntentPending) {
		t.Fatalf("an intent while one waits for its nodes: %v", err)
	}
	undo := clone
	undo.Kind = OpUnclone
	if err := n2.Ops().RunOp(ctx, "v", pr.Term, undo); err != nil {
		t.Fatal(err)
	}
	if stores["n3"].has("c") {
		t.Fatal("the copy's clone survived the undo")
	}
	if err := n2.Ops().SettledIntent(ctx, "v", pr.Term, all["v"], nil); err != nil {
		t.Fatal(err)
	}
	if all, _ := n3.Ops().Intents(ctx); len(all) != 0 {
		t.Fatalf("intents left: %+v", all)
	}
	// The name is free again: nothing of the undone clone blocks it.
	if err := n2.Ops().RunOp(ctx, "v", pr.Term, Op{Kind: OpClone, Name: "c", UID: "uc2", Nodes: []string{"n3"}}); err != nil {
		t.Fatalf("a clone of the undone one's name: %v", err)
	}
}

// TestBeginIntentUnknownOutcome: an intent whose recording Txn has an unknown
// outcome is never left unknown: BeginIntent learns it (the same Txn again)
// and returns the intent recorded, by the first try (applied, its answer
// lost) or by the second (the first never applied). Left unknown, the intent
// could be recorded late and finished after writes followed the cut.
func TestBeginIntentUnknownOutcome(t *testing.T) {
	tc := startCluster(t)
	fault := &txnFault{}
	cfg := tc.config(t, "n2")
	cfg.EtcdDialOptions = []grpc.DialOption{fault.option()}
	st := newMemStore()
	st.free = 90 << 30 // placed first: the primary
	n2 := tc.join(t, cfg, st)
	ctx := context.Background()
	never := func(bool, string) bool { return false }
	if _, _, err := tc.first.Volumes().CreateVolume(ctx, api.VolumeSpec{Name: "v", Capacity: 1 << 30, Replicas: 2,
		Disks: []api.DiskSpec{{Name: "root", Size: 1 << 20}}}, "", never); err != nil {
		t.Fatal(err)
	}
	pr, err := n2.Primaries().HoldPrimaryKey(ctx, "v")
	if err != nil {
		t.Fatal(err)
	}
	grow := []Op{{Kind: OpGrowDisk, Name: "root", Disk: &api.DiskSpec{Name: "root", Size: 2 << 20}}}
	ik := n2.key("intents", "v")
	for _, applied := range []bool{true, false} {
		t.Run(fmt.Sprintf("first try applied: %v", applied), func(t *testing.T) {
			hits := fault.hit()
			fault.armPut(ik, applied, nil) // the connection lost: an unknown outcome
			in, err := n2.Ops().BeginIntent(ctx, "v", pr.Term, grow, []string{"n1"})
			if fault.hit() != hits+1 {
				t.Fatalf("the fault did not fire: %v", err)
			}
			if err != nil {
				t.Fatalf("BeginIntent after an unknown outcome: %v, want the intent recorded", err)
			}
			got, ok, err := tc.first.Ops().VolumeIntent(ctx, "v")
			if err != nil || !ok || got.ID != in.ID {
				t.Fatalf("intent in etcd %+v %v %v, want %s", got, ok, err, in.ID)
			}
			if err := n2.Ops().EndIntent(ctx, "v", pr.Term, in); err != nil {
				t.Fatalf("end the intent: %v (its revision is the record's)", err)
			}
			if _, ok, _ := tc.first.Ops().VolumeIntent(ctx, "v"); ok {
				t.Fatal("the intent is still recorded after its end")
			}
		})
	}
	// The caller's context ends while the first try's outcome is unknown
	// (applied, its answer lost; the retries' pause is 100 ms): the
	// outcome is learnt all the same, on a context of its own. (Should the
	// first try not even be sent in time, nothing is recorded and
	// BeginIntent fails: also right.)
	t.Run("the caller's context ends", func(t *testing.T) {
		fault.armPut(ik, true, nil)
		defer fault.disarm()
		cctx, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
		defer cancel()
		in, err := n2.Ops().BeginIntent(cctx, "v", pr.Term, grow, []string{"n1"})
		if err == nil {
			defer func() { _ = n2.Ops().EndIntent(ctx, "v", pr.Term, in) }()
		}
		got, ok, _ := tc.first.Ops().VolumeIntent(ctx, "v")
		switch {
		case err == nil && (!ok || got.ID != in.ID):
			t.Fatalf("BeginIntent succeeded but etcd holds %+v (%v)", got, ok)
		case err != nil && ok:
			t.Fatalf("BeginIntent: %v, and an intent is recorded (%s): an unknown outcome left unknown", err, got.ID)
		}
	})
	// etcd never answers: after twice the lease, ErrIntentLeft (the caller
	// abandons the term), never a plain error.
	t.Run("never learnt", func(t *testing.T) {
		fault.armSticky(ik)
		defer fault.disarm()
		_, err := n2.Ops().BeginIntent(ctx, "v", pr.Term, grow, []string{"n1"})
		if !errors.Is(err, ErrIntentLeft) {
			t.Fatalf("BeginIntent with etcd never answering: %v, want ErrIntentLeft", err)
		}
	})
}
