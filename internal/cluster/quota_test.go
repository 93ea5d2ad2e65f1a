package cluster

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"

	"github.com/quiverstorage/quiver/internal/api"
)

var errOverQuota = errors.New("over quota")

// quotaCharge admits a volume of capacity while the tenant holds fewer
// than maxVols volumes and at most maxCap bytes.
func quotaCharge(capacity, maxVols, maxCap int64) Charge {
	return Charge{Add: Usage{Volumes: 1, Capacity: capacity, NoIOPSLimit: 1}, Admit: func(u Usage) error {
		if u.Volumes+1 > maxVols || u.Capacity+capacity > maxCap {
			return fmt.Errorf("%d volumes, %d bytes in use: %w", u.Volumes, u.Capacity, errOverQuota)
		}
		return nil
	}}
}

// race makes tries calls at once, call i through nodes[i%len(nodes)], and
// returns how many succeeded; any error but errOverQuota fails the test.
func race(t *testing.T, tries int, nodes []*Node, call func(n *Node, i int) error) int {
	t.Helper()
	errs := make([]error, tries)
	var wg sync.WaitGroup
	for i := range tries {
		wg.Go(func() { errs[i] = call(nodes[i%len(nodes)], i) })
	}
	wg.Wait()
	made := 0
	for i, err := range errs {
		switch {
		case err == nil:
			made++
		case !errors.Is(err, errOverQuota):
			t.Fatalf("call %d: %v, want made or over quota", i, err)
		}
	}
	return made
}

// TestTenantQuotaRace: creates of one tenant sent at once through two
// nodes never pass its quota together, since each is admitted in the Txn
// that records it; deletes give the charge back, and a failed create too.
func TestTenantQuotaRace(t *testing.T) {
	tc := startCluster(t)
	stores := map[string]*memStore{"n2": newMemStore()}
	n2 := tc.join(t, tc.config(t, "n2"), stores["n2"])
	ctx := context.Background()
	never := func(bool, string) bool { return false }
	const quota, tries = 5, 24
	made := race(t, tries, []*Node{tc.first, n2}, func(n *Node, i int) error {
		spec := api.VolumeSpec{Name: fmt.Sprintf("acme--v%02d", i), Capacity: 1 << 20, Tenant: "acme"}
		_, _, err := n.Volumes().CreateCharged(ctx, spec, "", never, quotaCharge(1<<20, quota, 1<<40))
		return err
	})
	ps, err := n2.Volumes().Placements(ctx)
	if err != nil {
		t.Fatal(err)
	}
	u, err := tc.first.Volumes().TenantUsage(ctx, "acme")
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%d concurrent creates through 2 nodes against a quota of %d: %d made, %d placed, usage %+v", tries, quota, made, len(ps), u)
	if made != quota || len(ps) != quota || u.Volumes != quota || u.Capacity != quota<<20 || u.NoIOPSLimit != quota {
		t.Fatalf("made %d, placed %d, usage %+v; want exactly %d", made, len(ps), u, quota)
	}
	for name, p := range ps {
		if p.Spec.Tenant != "acme" {
			t.Fatalf("%s: tenant %q in its placement", name, p.Spec.Tenant)
		}
	}

	// At the quota, a retry of an idempotent create of a placed name is
	// answered with the volume, not refused by the quota it counts in.
	for name, p := range ps {
		again := func(same bool, _ string) bool { return same }
		_, created, err := n2.Volumes().CreateCharged(ctx, p.Spec, "", again, quotaCharge(1<<20, quota, 1<<40))
		if err != nil || created {
			t.Fatalf("idempotent retry of %s at the quota: created %v, %v", name, created, err)
		}
		break
	}
	if u, _ := tc.first.Volumes().TenantUsage(ctx, "acme"); u.Volumes != quota {
		t.Fatalf("usage after an idempotent retry: %+v", u)
	}
	// A delete gives its charge back, in the Txn that removes the record.
	var one string
	for name := range ps {
		one = name
		break
	}
	if err := n2.Volumes().DeleteVolume(ctx, one); err != nil {
		t.Fatal(err)
	}
	if u, _ := tc.first.Volumes().TenantUsage(ctx, "acme"); u.Volumes != quota-1 || u.Capacity != (quota-1)<<20 {
		t.Fatalf("usage after a delete: %+v", u)
	}
	// Capacity: one more volume fits by count but not by bytes.
	big := api.VolumeSpec{Name: "acme--big", Capacity: 2 << 20, Tenant: "acme"}
	if _, _, err := tc.first.Volumes().CreateCharged(ctx, big, "", never, quotaCharge(2<<20, quota, (quota)<<20)); !errors.Is(err, errOverQuota) {
		t.Fatalf("create over the capacity quota: %v", err)
	}
	if _, ok, _ := tc.first.Volumes().Placement(ctx, "acme--big"); ok {
		t.Fatal("a refused volume was recorded")
	}
	// A create whose copy fails is removed, and its charge with it.
	stores["n2"].setFail(errors.New("disk on fire"))
	all := api.VolumeSpec{Name: "acme--all", Capacity: 1 << 20, Tenant: "acme", Replicas: 2}
	if _, _, err := tc.first.Volumes().CreateCharged(ctx, all, "", never, quotaCharge(1<<20, quota, 1<<40)); !errors.Is(err, ErrCopyFailed) {
		t.Fatalf("create with a failing copy: %v", err)
	}
	if u, _ := tc.first.Volumes().TenantUsage(ctx, "acme"); u.Volumes != quota-1 {
		t.Fatalf("usage after a failed create: %+v, want %d volumes", u, quota-1)
	}
	// Another tenant's usage is its own; a volume of no tenant counts
	// nowhere.
	stores["n2"].setFail(nil)
	if _, _, err := n2.Volumes().CreateVolume(ctx, api.VolumeSpec{Name: "plain", Capacity: 1 << 20}, "", never); err != nil {
		t.Fatal(err)
	}
	if u, _ := tc.first.Volumes().TenantUsage(ctx, "other"); u != (Usage{}) {
		t.Fatalf("usage of another tenant: %+v", u)
	}
}

// TestUpdateSpecQuotaRace: capacity grows of two volumes of one tenant
// sent at once through two nodes never pass its quota together (each is
// admitted in the Txn that records it); a refused grow changes neither the
// record nor the usage; the record's charge follows the spec, so a delete
// gives back what the volume counts after its updates.
func TestUpdateSpecQuotaRace(t *testing.T) {
	tc := startCluster(t)
	n2 := tc.join(t, tc.config(t, "n2"), newMemStore())
	ctx := context.Background()
	never := func(bool, string) bool { return false }
	const maxCap = 10 << 20
	for _, name := range []string{"acme--a", "acme--b"} {
		spec := api.VolumeSpec{Name: name, Capacity: 1 << 20, Tenant: "acme"}
		if _, _, err := tc.first.Volumes().CreateCharged(ctx, spec, "", never, quotaCharge(1<<20, 10, maxCap)); err != nil {
			t.Fatal(err)
		}
	}
	charge := func(spec api.VolumeSpec) Usage { return Usage{Volumes: 1, Capacity: spec.Capacity, NoIOPSLimit: 1} }
	grow := func(by int64) SpecChange {
		return SpecChange{Charge: charge, Admit: func(u Usage) error {
			if u.Capacity+by > maxCap {
				return fmt.Errorf("%d bytes in use: %w", u.Capacity, errOverQuota)
			}
			return nil
		}}
	}
	// Each call grows one volume by 1 MiB from what it holds now: 8 MiB
	// fit beside the 2 created.
	var mu [2]sync.Mutex
	made := race(t, 24, []*Node{tc.first, n2}, func(n *Node, i int) error {
		name := []string{"acme--a", "acme--b"}[i%2]
		// One grow per volume at a time, as its primary orders them; the
		// two volumes' grows race for the tenant's usage.
		mu[i%2].Lock()
		defer mu[i%2].Unlock()
		p, _, err := n.Volumes().Placement(ctx, name)
		if err != nil {
			return err
		}
		capacity := p.Spec.Capacity + 1<<20
		ch := grow(1 << 20)
		ch.Update = api.VolumeUpdate{Capacity: &capacity}
		_, err = n.Volumes().UpdateSpec(ctx, name, ch)
		return err
	})
	u, err := n2.Volumes().TenantUsage(ctx, "acme")
	if err != nil {
		t.Fatal(err)
	}
	var total int64
	for _, name := range []string{"acme--a", "acme--b"} {
		p, _, err := n2.Volumes().Placement(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		total += p.Spec.Capacity
	}
	t.Logf("24 grows of 1 MiB through 2 nodes, 8 MiB left in the quota: %d made, usage %+v, records %d bytes", made, u, total)
	if made != 8 || u.Capacity != maxCap || total != maxCap || u.Volumes != 2 {
		t.Fatalf("made %d, usage %+v, records hold %d bytes; want 8 made and %d bytes counted and recorded", made, u, total, maxCap)
	}
	// Labels and a lower capacity need no quota; the usage follows the
	// record's charge, and the undo of UpdateOf puts the spec back.
	small := int64(1 << 20)
	prev, err := tc.first.Volumes().UpdateSpec(ctx, "acme--a", SpecChange{Charge: charge,
		Update: api.VolumeUpdate{Capacity: &small, Labels: map[string]string{"k": "v"}}})
	if err != nil {
		t.Fatal(err)
	}
	p, _, _ := n2.Volumes().Placement(ctx, "acme--a")
	if u, _ := n2.Volumes().TenantUsage(ctx, "acme"); p.Spec.Labels["k"] != "v" || u.Capacity != maxCap-prev.Capacity+small {
		t.Fatalf("after a shrink of the record: labels %v, usage %+v", p.Spec.Labels, u)
	}
	if _, err := tc.first.Volumes().UpdateSpec(ctx, "acme--a", SpecChange{Charge: charge, Update: UpdateOf(prev)}); err != nil {
		t.Fatal(err)
	}
	p, _, _ = n2.Volumes().Placement(ctx, "acme--a")
	if u, _ := n2.Volumes().TenantUsage(ctx, "acme"); p.Spec.Labels != nil || p.Spec.Capacity != prev.Capacity || u.Capacity != maxCap {
		t.Fatalf("after the undo: spec %+v, usage %+v", p.Spec, u)
	}
	for _, name := range []string{"acme--a", "acme--b"} {
		if err := n2.Volumes().DeleteVolume(ctx, name); err != nil {
			t.Fatal(err)
		}
	}
	if u, _ := n2.Volumes().TenantUsage(ctx, "acme"); u != (Usage{}) {
		t.Fatalf("usage after deleting both: %+v, want none", u)
	}
}
