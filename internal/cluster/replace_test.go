package cluster

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/quiverstorage/quiver/internal/api"
)

// replaceProgress records what a replace reports.
type replaceProgress struct {
	mu          sync.Mutex
	total, done int64
	volumes     []string
}

func (p *replaceProgress) AddTotal(n int64) { p.mu.Lock(); p.total += n; p.mu.Unlock() }
func (p *replaceProgress) Add(n int64)      { p.mu.Lock(); p.done += n; p.mu.Unlock() }
func (p *replaceProgress) Done(v string) {
	p.mu.Lock()
	p.volumes = append(p.volumes, v)
	p.mu.Unlock()
}

// playPrimary does, as prim, what a volume's primary does for a node being
// replaced (the replicated package's resync loop, which this package does
// not run): each copy on a node marked replaced and down is replaced
// (ReplaceCopy, preferring the node named), and the new copy is put in the
// in-sync set as its rebuild would. It runs until ctx ends.
func playPrimary(ctx context.Context, t *testing.T, prim *Node) {
	go func() {
		for ctx.Err() == nil {
			sleep(ctx, 100*time.Millisecond)
			repl, err := prim.Replacements(ctx)
			if err != nil {
				continue
			}
			pls, err := prim.Volumes().Placements(ctx)
			if err != nil {
				continue
			}
			for name, p := range pls {
				if p.Primary != prim.Name() || p.Deleting {
					continue
				}
				for _, c := range p.Copies {
					if to, ok := repl[c.Node]; ok {
						next, err := prim.Copies().ReplaceCopy(ctx, name, c.Node, to, p.Term)
						if err != nil {
							t.Logf("primary: replace the copy of %s on %s: %v", name, c.Node, err)
							continue
						}
						sleep(ctx, 300*time.Millisecond) // the rebuild
						if err := prim.Copies().MarkInSync(name, next, p.Term); err != nil {
							t.Logf("primary: %s on %s in sync: %v", name, next, err)
						}
					}
				}
			}
		}
	}()
}

// TestReplaceNode: the refusals of a replace (the node up, the same node,
// a new node unknown, down or drained; nothing changed by any), then a
// replace of a node that is gone: the volume it held a copy of (in sync:
// no write found it failed) is rebuilt on the new node by its primary, and
// the volume whose only copy it held is left as it is and named, the node
// kept; once that volume is deleted (pending: its copy's node is gone), the
// replace run again drops that copy, the delete completes, and the node is
// forgotten: its records gone, its pool refused, a third run finds no such
// node.
func TestReplaceNode(t *testing.T) {
	tc := startCluster(t)
	n1 := tc.first
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cfg2, store2 := tc.config(t, "n2"), newMemStore()
	n2 := tc.join(t, cfg2, store2)
	tc.join(t, tc.config(t, "n3"), newMemStore())
	never := func(bool, string) bool { return false }
	create := func(name string, replicas int) Placement {
		t.Helper()
		p, _, err := n1.Volumes().CreateVolume(ctx, api.VolumeSpec{Name: name, Capacity: 1 << 30, Replicas: replicas,
			Disks: []api.DiskSpec{{Name: "root", Size: 1 << 20}}}, "", never)
		if err != nil {
			t.Fatalf("create %s: %v", name, err)
		}
		return p
	}
	// Equal free bytes everywhere: ties go by the copies held, then the name.
	for _, c := range []struct {
		name     string
		replicas int
		copies   []string
	}{{"a", 2, []string{"n1", "n2"}}, {"b", 2, []string{"n3", "n1"}}, {"c", 1, []string{"n2"}}} {
		p := create(c.name, c.replicas)
		var got []string
		for _, cp := range p.Copies {
			got = append(got, cp.Node)
		}
		if !slices.Equal(got, c.copies) || p.Primary != c.copies[0] {
			t.Fatalf("%s placed on %v (primary %s), want %v", c.name, got, p.Primary, c.copies)
		}
	}
	nodes := func() []string {
		t.Helper()
		ns, err := n1.Nodes(ctx)
		if err != nil {
			t.Fatal(err)
		}
		var names []string
		for _, ni := range ns {
			names = append(names, ni.Name)
		}
		return names
	}
	refused := func(what, old, new string, want error, says string) {
		t.Helper()
		var pr replaceProgress
		_, err := n1.ReplaceNode(ctx, old, new, &pr)
		if !errors.Is(err, want) || !strings.Contains(err.Error(), says) {
			t.Fatalf("replace %s: %v, want %v saying %q", what, err, want, says)
		}
		t.Logf("replace %s refused: %v", what, err)
		if repl, err := n1.Replacements(ctx); err != nil || len(repl) != 0 {
			t.Fatalf("after the refusal: replacing %v, %v", repl, err)
		}
		if rec := n1.record(t, "a"); !slices.Equal(rec.Copies, []string{"n1", "n2"}) || len(rec.InSync) != 2 {
			t.Fatalf("after the refusal: a is %+v", rec)
		}
	}
	refused("of a node that is up", "n2", "n3", ErrNodeInUse, "quiver node remove n2 --drain")
	refused("of a node by itself", "n2", "n2", ErrInvalidMember, "another node")

	_ = n2.Close()
	waitFor(t, "n2 down", func() bool {
		ns, err := n1.Nodes(ctx)
		return err == nil && slices.ContainsFunc(ns, func(ni NodeInfo) bool { return ni.Name == "n2" && !ni.Up })
	})
	refused("by a node that is not one", "n2", "n4", ErrNodeNotFound, "quiver node add n4")
	refused("of a node that is not one", "n9", "n3", ErrNodeNotFound, "no such node")
	tc.join(t, tc.config(t, "n4"), newMemStore())
	if err := n1.SetDrain(ctx, "n4", DrainDone); err != nil {
		t.Fatal(err)
	}
	refused("by a drained node", "n2", "n4", ErrNotEnoughNodes, "undrain it")
	if _, err := n1.Undrain(ctx, "n4"); err != nil {
		t.Fatal(err)
	}

	pctx, stop := context.WithCancel(ctx)
	defer stop()
	playPrimary(pctx, t, n1)

	// "c" has its only copy on n2: left as it is, n2 kept.
	// Each replace is bounded: one that waits for a rebuild that never
	// comes fails the test instead of hanging it.
	rctx, rcancel := context.WithTimeout(ctx, 30*time.Second)
	defer rcancel()
	pr := &replaceProgress{}
	_, err := n1.ReplaceNode(rctx, "n2", "n4", pr)
	if !errors.Is(err, ErrDegraded) || !strings.Contains(err.Error(), "c: its only copy is on n2") {
		t.Fatalf("replace with a volume stuck on n2: %v, want %v naming c", err, ErrDegraded)
	}
	t.Logf("replace with c stuck: %v", err)
	if rec := n1.record(t, "a"); !slices.Equal(rec.Copies, []string{"n1", "n4"}) || !slices.Equal(rec.InSync, []string{"n1", "n4"}) {
		t.Fatalf("a after the replace: %+v, want its copies on n1 and n4, in sync", rec)
	}
	if rec := n1.record(t, "c"); !slices.Equal(rec.Copies, []string{"n2"}) || rec.State != volumeActive {
		t.Fatalf("c after the replace: %+v, want it untouched on n2", rec)
	}
	if !slices.Equal(pr.volumes, []string{"a"}) || pr.total != 1<<20 || pr.done != 1<<20 {
		t.Fatalf("progress: %v done, %d of %d bytes; want a done, 1 MiB of 1 MiB", pr.volumes, pr.done, pr.total)
	}
	if got := nodes(); !slices.Equal(got, []string{"n1", "n2", "n3", "n4"}) {
		t.Fatalf("nodes after the replace that stopped: %v", got)
	}
	if repl, err := n1.Replacements(ctx); err != nil || len(repl) != 0 {
		t.Fatalf("after the replace that stopped: replacing %v, %v; want the mark gone", repl, err)
	}

	// Deleted, the volume waits for n2; the replace drops n2's copy.
	if err := n1.Volumes().DeleteVolume(ctx, "c"); !errors.Is(err, ErrDeletePending) {
		t.Fatalf("delete c: %v, want %v", err, ErrDeletePending)
	}
	pr = &replaceProgress{}
	rm, err := n1.ReplaceNode(rctx, "n2", "n4", pr)
	if err != nil {
		t.Fatal(err)
	}
	if rm.Name != "n2" || rm.NodeID == "" || rm.MemberID != 0 {
		t.Fatalf("replaced %+v: want n2's node id and no etcd member (external etcd)", rm)
	}
	if got := nodes(); !slices.Equal(got, []string{"n1", "n3", "n4"}) {
		t.Fatalf("nodes after the replace: %v", got)
	}
	if _, ok, err := n1.Volumes().Placement(ctx, "c"); err != nil || ok {
		t.Fatalf("c after the replace: placed %v, %v; want its delete complete", ok, err)
	}
	if rec := n1.record(t, "b"); !slices.Equal(rec.Copies, []string{"n3", "n1"}) {
		t.Fatalf("b after the replace: %+v, want it untouched", rec)
	}
	if n, err := Join(ctx, cfg2, store2); !errors.Is(err, ErrNodeRemoved) {
		if err == nil {
			_ = n.Close()
		}
		t.Fatalf("the replaced node's pool joins again: %v, want %v", err, ErrNodeRemoved)
	}
	if _, err := n1.ReplaceNode(ctx, "n2", "n4", pr); !errors.Is(err, ErrNodeNotFound) {
		t.Fatalf("replace again once done: %v, want %v", err, ErrNodeNotFound)
	}
}
