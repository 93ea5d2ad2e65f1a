package cluster

import (
	"context"
	"errors"
	"slices"
	"testing"

	"github.com/quiverstorage/quiver/internal/api"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"
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

// TestMarkInSyncTxnPolicy (issue 29): MarkInSync commits through the one
// policy for etcd transactions: a try that etcd surely did not apply (no
// leader) is made again and succeeds; a try applied with its answer lost
// is ErrUnknownOutcome, never a plain failure, and etcd shows it applied.
func TestMarkInSyncTxnPolicy(t *testing.T) {
	tc := startCluster(t)
	fault := &txnFault{}
	cfg := tc.config(t, "n2")
	cfg.EtcdDialOptions = []grpc.DialOption{fault.option()}
	st := newMemStore()
	st.free = 90 << 30 // placed first: the primary
	n2 := tc.join(t, cfg, st)
	ctx := context.Background()
	never := func(bool, string) bool { return false }
	p, _, err := tc.first.Volumes().CreateVolume(ctx, api.VolumeSpec{Name: "v", Capacity: 1 << 30, Replicas: 2}, "", never)
	if err != nil || p.Primary != "n2" {
		t.Fatalf("create: %+v, %v; want n2 the primary", p, err)
	}
	ck := n2.key("copies", "v", "n1")
	inSync := func() bool { return slices.Contains(tc.first.record(t, "v").InSync, "n1") }
	for _, c := range []struct {
		name    string
		applied bool
		err     error
		want    error // nil: MarkInSync succeeds
	}{
		{"not applied, no leader: tried again", false, rpctypes.ErrGRPCNoLeader, nil},
		{"applied, answer lost: unknown", true, nil, ErrUnknownOutcome},
	} {
		t.Run(c.name, func(t *testing.T) {
			if err := n2.Copies().MarkOutOfSync("v", "n1", 1, errors.New("test: copy cut off")); err != nil {
				t.Fatal(err)
			}
			if inSync() {
				t.Fatal("n1 still in sync")
			}
			hits := fault.hit()
			fault.armPut(ck, c.applied, c.err)
			err := n2.Copies().MarkInSync("v", "n1", 1)
			if fault.hit() != hits+1 {
				t.Fatalf("the fault did not fire: %v", err)
			}
			if c.want == nil && err != nil || c.want != nil && !errors.Is(err, c.want) {
				t.Fatalf("MarkInSync: %v, want %v", err, c.want)
			}
			if !inSync() {
				t.Fatalf("n1 not in sync after MarkInSync (%v)", err)
			}
		})
	}
}

// TestLateMarkInSyncCannotFollowDiverged: a MarkInSync whose outcome the
// primary does not know may still be applied later. After the primary
// records the copy diverged (replica.Rejoin's fallback), such a late put-back
// must no longer apply: MarkDiverged rewrites the volume's record even when
// the copy is out of the in-sync set already (MarkOutOfSync leaves it as it
// is), so a transaction that compares the record's revision read before
// fails.
func TestLateMarkInSyncCannotFollowDiverged(t *testing.T) {
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
	cause := errors.New("connection refused")
	if err := prim.Copies().MarkOutOfSync("web01", other.Name(), 1, cause); err != nil {
		t.Fatal(err)
	}
	vk := prim.key("volumes", "web01")
	rev := func() int64 {
		resp, err := prim.cli.Get(ctx, vk)
		if err != nil || len(resp.Kvs) == 0 {
			t.Fatalf("read %s: %v", vk, err)
		}
		return resp.Kvs[0].ModRevision
	}
	// What a MarkInSync on its way compares: the record as it was read.
	seen := rev()
	if err := prim.Copies().MarkOutOfSync("web01", other.Name(), 1, cause); err != nil || rev() != seen {
		t.Fatalf("MarkOutOfSync of a copy out of sync already: %v, the record rewritten: %v (the case Rejoin must not rely on)",
			err, rev() != seen)
	}
	if err := prim.Copies().MarkDiverged("web01", other.Name(), 1, cause); err != nil {
		t.Fatal(err)
	}
	if rev() == seen {
		t.Fatal("MarkDiverged left the record's revision: a late MarkInSync comparing it would still apply")
	}
	late, err := prim.cli.Txn(ctx).If(clientv3.Compare(clientv3.ModRevision(vk), "=", seen)).
		Then(clientv3.OpPut(vk, "late put-back")).Commit()
	if err != nil || late.Succeeded {
		t.Fatalf("a late put-back comparing the record read before MarkDiverged applied: %v, %v", late, err)
	}
}
