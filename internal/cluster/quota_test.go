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
		_, _, err := n.CreateCharged(ctx, spec, "", never, quotaCharge(1<<20, quota, 1<<40))
		return err
	})
	ps, err := n2.Placements(ctx)
	if err != nil {
		t.Fatal(err)
	}
	u, err := tc.first.TenantUsage(ctx, "acme")
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
		_, created, err := n2.CreateCharged(ctx, p.Spec, "", again, quotaCharge(1<<20, quota, 1<<40))
		if err != nil || created {
			t.Fatalf("idempotent retry of %s at the quota: created %v, %v", name, created, err)
		}
		break
	}
	if u, _ := tc.first.TenantUsage(ctx, "acme"); u.Volumes != quota {
		t.Fatalf("usage after an idempotent retry: %+v", u)
	}
	// A delete gives its charge back, in the Txn that removes the record.
	var one string
	for name := range ps {
		one = name
		break
	}
	if err := n2.DeleteVolume(ctx, one); err != nil {
		t.Fatal(err)
	}
	if u, _ := tc.first.TenantUsage(ctx, "acme"); u.Volumes != quota-1 || u.Capacity != (quota-1)<<20 {
		t.Fatalf("usage after a delete: %+v", u)
	}
	// Capacity: one more volume fits by count but not by bytes.
	big := api.VolumeSpec{Name: "acme--big", Capacity: 2 << 20, Tenant: "acme"}
	if _, _, err := tc.first.CreateCharged(ctx, big, "", never, quotaCharge(2<<20, quota, (quota)<<20)); !errors.Is(err, errOverQuota) {
		t.Fatalf("create over the capacity quota: %v", err)
	}
	if _, ok, _ := tc.first.Placement(ctx, "acme--big"); ok {
		t.Fatal("a refused volume was recorded")
	}
	// A create whose copy fails is removed, and its charge with it.
	stores["n2"].setFail(errors.New("disk on fire"))
	all := api.VolumeSpec{Name: "acme--all", Capacity: 1 << 20, Tenant: "acme", Replicas: 2}
	if _, _, err := tc.first.CreateCharged(ctx, all, "", never, quotaCharge(1<<20, quota, 1<<40)); !errors.Is(err, ErrCopyFailed) {
		t.Fatalf("create with a failing copy: %v", err)
	}
	if u, _ := tc.first.TenantUsage(ctx, "acme"); u.Volumes != quota-1 {
		t.Fatalf("usage after a failed create: %+v, want %d volumes", u, quota-1)
	}
	// Another tenant's usage is its own; a volume of no tenant counts
	// nowhere.
	if _, _, err := n2.CreateVolume(ctx, api.VolumeSpec{Name: "plain", Capacity: 1 << 20}, "", never); err != nil {
		t.Fatal(err)
	}
	if u, _ := tc.first.TenantUsage(ctx, "other"); u != (Usage{}) {
		t.Fatalf("usage of another tenant: %+v", u)
	}
}
