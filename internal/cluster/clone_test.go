package cluster

import (
	"context"
	"errors"
	"testing"

	"github.com/quiverstorage/quiver/internal/api"
)

// TestCloneOps: the etcd side of a clone of a replicated volume. Each copy
// makes its clone and records its copy of it; PlaceClone places it on the
// same nodes with the primary at term 1, every copy in sync, and refuses a
// name placed already; an unclone deletes an unplaced clone and its record,
// and leaves a placed one alone.
func TestCloneOps(t *testing.T) {
	tc := startCluster(t) // n1: the etcd member, not placed on here
	stores := map[string]*memStore{"n2": newMemStore(), "n3": newMemStore()}
	stores["n2"].free, stores["n3"].free = 90<<30, 80<<30
	n2 := tc.join(t, tc.config(t, "n2"), stores["n2"])
	tc.join(t, tc.config(t, "n3"), stores["n3"])
	ctx := context.Background()
	never := func(bool, string) bool { return false }
	p, _, err := tc.first.Volumes().CreateVolume(ctx, api.VolumeSpec{Name: "v", Capacity: 1 << 30, Replicas: 2,
		Disks: []api.DiskSpec{{Name: "root", Size: 1 << 20}}}, "", never)
	if err != nil {
		t.Fatal(err)
	}
	if p.Primary != "n2" {
		t.Fatalf("placed %+v: want primary n2", p)
	}
	spec := func(name string) api.VolumeSpec {
		return api.VolumeSpec{Name: name, Capacity: 1 << 30, Replicas: 2, Disks: []api.DiskSpec{{Name: "root", Size: 1 << 20}}}
	}
	copies := []string{"n2", "n3"}

	// Made on the copy, placed by the primary.
	if err := n2.Ops().RunOp(ctx, "v", 1, Op{Kind: OpClone, Name: "c1", UID: "u1", Nodes: []string{"n3"}}); err != nil {
		t.Fatal(err)
	}
	if !stores["n3"].has("c1") {
		t.Fatal("the copy did not make its clone")
	}
	if _, err := n2.Volumes().PlaceClone(ctx, spec("c1"), "u1", "", "local-c1", copies, Charge{}); err != nil {
		t.Fatal(err)
	}
	r := tc.first.record(t, "c1")
	if r.Primary != "n2" || r.Term != 1 || len(r.InSync) != 2 || len(r.Copies) != 2 || r.UID != "u1" {
		t.Fatalf("clone record %+v: want primary n2 at term 1, both copies in sync", r)
	}
	role, err := n2.Primaries().Role(ctx, "c1")
	if err != nil {
		t.Fatal(err)
	}
	if len(role.Targets) != 1 || role.Targets[0].Node != "n3" || !stores["n3"].hasAttached("c1", "n2", 1) || role.Targets[0].Term != 1 {
		t.Fatalf("clone's role on its primary: %+v, want n3 a target attached for n2 at term 1", role)
	}
	// A placed clone is left by an unclone; a name placed is refused.
	if err := n2.Ops().RunOp(ctx, "v", 1, Op{Kind: OpUnclone, Name: "c1", UID: "u1", Nodes: []string{"n3"}}); err == nil {
		t.Fatal("unclone of a placed clone succeeded")
	}
	if !stores["n3"].has("c1") {
		t.Fatal("unclone deleted a placed clone")
	}
	if _, err := n2.Volumes().PlaceClone(ctx, spec("c1"), "u1b", "", "local", copies, Charge{}); !errors.Is(err, ErrVolumeExists) {
		t.Fatalf("a clone placed over a placed name: %v", err)
	}
	if err := n2.Ops().RunOp(ctx, "v", 1, Op{Kind: OpClone, Name: "c1", UID: "u1c", Nodes: []string{"n3"}}); err == nil {
		t.Fatal("a copy cloned to a placed name")
	}

	// Not placed: the unclone removes the copy's clone and its record,
	// and a placement without every copy's record is refused.
	if err := n2.Ops().RunOp(ctx, "v", 1, Op{Kind: OpClone, Name: "c2", UID: "u2", Nodes: []string{"n3"}}); err != nil {
		t.Fatal(err)
	}
	if err := n2.Ops().RunOp(ctx, "v", 1, Op{Kind: OpUnclone, Name: "c2", UID: "u2", Nodes: []string{"n3"}}); err != nil {
		t.Fatal(err)
	}
	if stores["n3"].has("c2") {
		t.Fatal("unclone left the copy's clone")
	}
	if _, err := n2.Volumes().PlaceClone(ctx, spec("c2"), "u2", "", "local-c2", copies, Charge{}); !errors.Is(err, ErrVolumeExists) {
		t.Fatalf("a clone placed without the copy's record: %v", err)
	}
	if _, ok, err := n2.Volumes().Placement(ctx, "c2"); err != nil || ok {
		t.Fatalf("the undone clone is placed: %v %v", ok, err)
	}

	// A tenant's clone is the tenant's, admitted and charged in the Txn
	// that places it; past the quota nothing is placed or counted.
	tspec := spec("acme--c3")
	tspec.Tenant = "acme"
	if err := n2.Ops().RunOp(ctx, "v", 1, Op{Kind: OpClone, Name: "acme--c3", UID: "u3", Nodes: []string{"n3"}}); err != nil {
		t.Fatal(err)
	}
	if _, err := n2.Volumes().PlaceClone(ctx, tspec, "u3", "", "local-c3", copies, quotaCharge(1<<30, 0, 1<<40)); !errors.Is(err, errOverQuota) {
		t.Fatalf("a clone past the quota: %v", err)
	}
	if _, ok, _ := n2.Volumes().Placement(ctx, "acme--c3"); ok {
		t.Fatal("a clone past the quota is placed")
	}
	if u, _ := n2.Volumes().TenantUsage(ctx, "acme"); u != (Usage{}) {
		t.Fatalf("a clone past the quota counted: %+v", u)
	}
	if _, err := n2.Volumes().PlaceClone(ctx, tspec, "u3", "", "local-c3", copies, quotaCharge(1<<30, 1, 1<<40)); err != nil {
		t.Fatal(err)
	}
	if r := tc.first.record(t, "acme--c3"); r.Spec.Tenant != "acme" || r.Charge == nil || r.Charge.Volumes != 1 {
		t.Fatalf("the tenant's clone record: %+v", r)
	}
	if u, _ := n2.Volumes().TenantUsage(ctx, "acme"); u.Volumes != 1 || u.Capacity != 1<<30 {
		t.Fatalf("the tenant's use after its clone: %+v", u)
	}
	if err := n2.Volumes().DeleteVolume(ctx, "acme--c3"); err != nil {
		t.Fatal(err)
	}
	if u, _ := n2.Volumes().TenantUsage(ctx, "acme"); u.Volumes != 0 || u.Capacity != 0 {
		t.Fatalf("the tenant's use after deleting its clone: %+v", u)
	}
}
