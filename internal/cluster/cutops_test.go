package cluster

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/quiverstorage/quiver/internal/api"
)

// refusingStore is a memStore whose copy refuses every operation of its
// primary.
type refusingStore struct{ *memStore }

func (refusingStore) ApplyOp(context.Context, string, Op) error {
	return errors.New("test: no space left")
}

// TestChangesAtTheCut: the etcd side of a change at the cut. RunOpEach
// answers each copy's outcome; a copy that failed is recorded diverged (out
// of the in-sync set, whole), even one out of sync already; only the
// primary at its term may do that or record the new disk set.
func TestChangesAtTheCut(t *testing.T) {
	tc := startCluster(t) // n1: the etcd member, not placed on here
	stores := map[string]*memStore{"n2": newMemStore(), "n3": newMemStore(), "n4": newMemStore()}
	stores["n2"].free, stores["n3"].free, stores["n4"].free = 90<<30, 80<<30, 70<<30
	n2 := tc.join(t, tc.config(t, "n2"), stores["n2"])
	n3 := tc.join(t, tc.config(t, "n3"), stores["n3"])
	tc.join(t, tc.config(t, "n4"), refusingStore{stores["n4"]})
	ctx := context.Background()
	never := func(bool, string) bool { return false }
	p, _, err := tc.first.Volumes().CreateVolume(ctx, api.VolumeSpec{Name: "v", Capacity: 1 << 30, Replicas: 3,
		Disks: []api.DiskSpec{{Name: "root", Size: 1 << 20}}}, "", never)
	if err != nil {
		t.Fatal(err)
	}
	if p.Primary != "n2" || len(p.Copies) != 3 {
		t.Fatalf("placed %+v: want primary n2, three copies", p)
	}
	if _, err := n2.Primaries().HoldPrimary(ctx, "v"); err != nil {
		t.Fatal(err)
	}

	each, err := n2.Ops().RunOpEach(ctx, "v", 1, Op{Kind: OpGrowDisk, Name: "root", Nodes: []string{"n3", "n4"}})
	if err != nil {
		t.Fatal(err)
	}
	if each["n3"] != nil || each["n4"] == nil || !strings.Contains(each["n4"].Error(), "no space left") {
		t.Fatalf("outcomes %v: want n3 ok, n4 refused", each)
	}
	// An operation sent at a term that is not the primary's is refused by
	// every copy.
	late, err := n2.Ops().RunOpEach(ctx, "v", 7, Op{Kind: OpGrowDisk, Name: "root", Nodes: []string{"n3"}})
	if err != nil || late["n3"] == nil {
		t.Fatalf("an operation at term 7: %v %v; want refused", late, err)
	}

	if err := n3.Copies().MarkDiverged("v", "n4", 1, errors.New("test")); err == nil {
		t.Fatal("a copy that is not the primary recorded another diverged")
	}
	if err := n2.Copies().MarkDiverged("v", "n4", 1, each["n4"]); err != nil {
		t.Fatal(err)
	}
	// n3 left the in-sync set earlier (a failed write), then failed a
	// change at the cut: whole too.
	if err := n2.Copies().MarkOutOfSync("v", "n3", 1, errors.New("test: write failed")); err != nil {
		t.Fatal(err)
	}
	if err := n2.Copies().MarkDiverged("v", "n3", 1, errors.New("test: rollback failed")); err != nil {
		t.Fatal(err)
	}
	role, err := n2.Primaries().Role(ctx, "v")
	if err != nil {
		t.Fatal(err)
	}
	if len(role.Targets) != 0 || len(role.Behind) != 2 {
		t.Fatalf("role %+v: want no copy in sync, two behind", role)
	}
	for _, b := range role.Behind {
		if !b.Whole || b.State != CopyDegraded {
			t.Errorf("copy %+v: want degraded and whole", b)
		}
	}

	disks := []api.DiskSpec{{Name: "root", Size: 2 << 20}, {Name: "data", Size: 1 << 20}}
	if err := n3.Volumes().UpdateDisks(ctx, "v", 1, 2<<30, disks); !errors.Is(err, ErrNotPrimary) || errors.Is(err, ErrNoSession) {
		t.Fatalf("disks recorded by a node that is not the primary: %v", err)
	}
	if err := n2.Volumes().UpdateDisks(ctx, "v", 2, 2<<30, disks); !errors.Is(err, ErrNotPrimary) || errors.Is(err, ErrNoSession) {
		t.Fatalf("disks recorded at another term: %v", err)
	}
	if r := tc.first.record(t, "v"); len(r.Spec.Disks) != 1 || r.Spec.Capacity != 1<<30 {
		t.Fatalf("spec after refused updates: %+v", r.Spec)
	}
	if err := n2.Volumes().UpdateDisks(ctx, "v", 1, 2<<30, disks); err != nil {
		t.Fatal(err)
	}
	r := tc.first.record(t, "v")
	if len(r.Spec.Disks) != 2 || r.Spec.Disks[0] != disks[0] || r.Spec.Disks[1] != disks[1] || r.Spec.Capacity != 2<<30 {
		t.Fatalf("spec %+v: want disks %v, capacity 2 GiB", r.Spec, disks)
	}
}
