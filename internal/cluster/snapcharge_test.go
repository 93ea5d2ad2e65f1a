package cluster

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/quiverstorage/quiver/internal/api"
)

// TestSnapshotChargeRace: snapshot charges of one tenant sent at once
// through two nodes never pass its snapshot quota together; a give-back
// never goes below zero; the removal of a volume's record gives its
// snapshots back with its own charge; a volume without a tenant counts
// nothing.
func TestSnapshotChargeRace(t *testing.T) {
	tc := startCluster(t)
	n2 := tc.join(t, tc.config(t, "n2"), newMemStore())
	ctx := context.Background()
	never := func(bool, string) bool { return false }
	for _, name := range []string{"acme--a", "acme--b"} {
		spec := api.VolumeSpec{Name: name, Capacity: 1 << 20, Tenant: "acme"}
		if _, _, err := tc.first.Volumes().CreateCharged(ctx, spec, "", never, quotaCharge(1<<20, 10, 1<<40)); err != nil {
			t.Fatal(err)
		}
	}
	const quota, tries = 4, 16
	admit := func(u Usage) error {
		if u.Snapshots+1 > quota {
			return fmt.Errorf("%d snapshots: %w", u.Snapshots, errOverQuota)
		}
		return nil
	}
	made := race(t, tries, []*Node{tc.first, n2}, func(n *Node, i int) error {
		return n.Volumes().ChargeSnapshots(ctx, []string{"acme--a", "acme--b"}[i%2], 1, admit)
	})
	u, err := n2.Volumes().TenantUsage(ctx, "acme")
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%d concurrent snapshot charges through 2 nodes against a quota of %d: %d made, usage %+v", tries, quota, made, u)
	if made != quota || u.Snapshots != quota {
		t.Fatalf("made %d, usage %+v; want exactly %d", made, u, quota)
	}
	a, _, err := tc.first.Volumes().snapCharge(ctx, "acme--a")
	if err != nil {
		t.Fatal(err)
	}
	// More give-backs than charges of b: its count stops at zero.
	b, _, _ := tc.first.Volumes().snapCharge(ctx, "acme--b")
	for range b + 2 {
		if err := n2.Volumes().ChargeSnapshots(ctx, "acme--b", -1, nil); err != nil {
			t.Fatal(err)
		}
	}
	if u, _ := n2.Volumes().TenantUsage(ctx, "acme"); u.Snapshots != a {
		t.Fatalf("after b's give-backs: %+v, want %d snapshots (a's)", u, a)
	}
	// Deleting a gives back its volume and its snapshots.
	if err := tc.first.Volumes().DeleteVolume(ctx, "acme--a"); err != nil {
		t.Fatal(err)
	}
	if u, _ := n2.Volumes().TenantUsage(ctx, "acme"); u.Snapshots != 0 || u.Volumes != 1 {
		t.Fatalf("after deleting a: %+v, want 0 snapshots and 1 volume", u)
	}
	if c, _, _ := tc.first.Volumes().snapCharge(ctx, "acme--a"); c != 0 {
		t.Fatalf("a's count left: %d", c)
	}
	// Without a tenant: nothing counted; a volume not placed: not found.
	if _, _, err := tc.first.Volumes().CreateCharged(ctx, api.VolumeSpec{Name: "plain", Capacity: 1 << 20}, "", never, Charge{}); err != nil {
		t.Fatal(err)
	}
	if err := tc.first.Volumes().ChargeSnapshots(ctx, "plain", 1, admit); err != nil {
		t.Fatal(err)
	}
	if c, _, _ := tc.first.Volumes().snapCharge(ctx, "plain"); c != 0 {
		t.Fatalf("a volume without a tenant counted %d snapshots", c)
	}
	if err := tc.first.Volumes().ChargeSnapshots(ctx, "nope", 1, admit); !errors.Is(err, ErrVolumeNotFound) {
		t.Fatalf("a volume not placed: %v", err)
	}
}
