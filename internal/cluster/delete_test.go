package cluster

import (
	"context"
	"errors"
	"testing"

	"github.com/quiverstorage/quiver/internal/api"
)

// TestDeleteWithACopyNodeDown (issue 32, "Deletes that keep their
// promise"): a delete while a copy's node is down marks the volume
// deleting, listed so and refused for a new create of its name, deletes
// the copies it can reach, and finishes by itself when the node is back:
// the record goes, and the name is free for a volume without the old copy.
func TestDeleteWithACopyNodeDown(t *testing.T) {
	tc := startCluster(t)
	stores := map[string]*memStore{"n1": tc.firstStore}
	cfgs, nodes := map[string]Config{}, map[string]*Node{}
	for _, name := range []string{"n2", "n3"} {
		stores[name], cfgs[name] = newMemStore(), tc.config(t, name)
		nodes[name] = tc.join(t, cfgs[name], stores[name])
	}
	ctx := context.Background()
	never := func(bool, string) bool { return false }
	spec := api.VolumeSpec{Name: "web01", Capacity: 1 << 30, Replicas: 3}
	p, _, err := tc.first.Volumes().CreateVolume(ctx, spec, "", never)
	if err != nil || p.Primary != "n1" {
		t.Fatalf("create: %+v, %v; want n1 the primary", p, err)
	}
	oldUID := stores["n3"].uid("web01")
	// n3 goes down (a clean stop revokes its lease): its copy cannot be
	// reached.
	_ = nodes["n3"].Close()

	err = tc.first.Volumes().DeleteVolume(ctx, "web01")
	if !errors.Is(err, ErrDeletePending) {
		t.Fatalf("delete with n3 down: %v; want ErrDeletePending", err)
	}
	got, ok, err := tc.first.Volumes().Placement(ctx, "web01")
	if err != nil || !ok || !got.Deleting {
		t.Fatalf("after the delete: %+v %v %v; want it placed and deleting", got, ok, err)
	}
	ps, _ := tc.first.Volumes().Placements(ctx)
	if pl, ok := ps["web01"]; !ok || !pl.Deleting {
		t.Fatalf("placements list %+v: want web01 deleting", ps)
	}
	if stores["n1"].has("web01") || stores["n2"].has("web01") || !stores["n3"].has("web01") {
		t.Fatalf("copies left: n1 %v n2 %v n3 %v; want only n3's", stores["n1"].has("web01"), stores["n2"].has("web01"),
			stores["n3"].has("web01"))
	}
	if _, _, err := tc.first.Volumes().CreateVolume(ctx, api.VolumeSpec{Name: "web01", Capacity: 1 << 30, Replicas: 2}, "", never); !errors.Is(err, ErrVolumeDeleting) {
		t.Fatalf("create of a deleting volume's name: %v; want ErrVolumeDeleting", err)
	}

	// n3 is back: its copy goes, and the record with it, with nobody
	// asking again.
	tc.join(t, cfgs["n3"], stores["n3"])
	waitFor(t, "the record removed", func() bool {
		_, ok, err := tc.first.Volumes().Placement(ctx, "web01")
		return err == nil && !ok
	})
	if stores["n3"].has("web01") {
		t.Fatal("n3's copy left after the delete finished")
	}
	p2, created, err := tc.first.Volumes().CreateVolume(ctx, spec, "", never)
	if err != nil || !created || p2.UID == p.UID {
		t.Fatalf("create again: %+v %v %v", p2, created, err)
	}
	if uid := stores["n3"].uid("web01"); uid == "" || uid == oldUID {
		t.Fatalf("n3's copy of the new volume: %q, the old one was %q", uid, oldUID)
	}
}

// TestDeleteRefusedByThePrimary: a copy the primary cannot delete (a
// client has it attached) refuses the whole delete before any other copy
// goes: the volume is active again, every copy is still there, and the
// error says why.
func TestDeleteRefusedByThePrimary(t *testing.T) {
	tc := startCluster(t)
	stores := map[string]*memStore{"n1": tc.firstStore}
	for _, name := range []string{"n2", "n3"} {
		stores[name] = newMemStore()
		tc.join(t, tc.config(t, name), stores[name])
	}
	ctx := context.Background()
	never := func(bool, string) bool { return false }
	p, _, err := tc.first.Volumes().CreateVolume(ctx, api.VolumeSpec{Name: "web01", Capacity: 1 << 30, Replicas: 3}, "", never)
	if err != nil || p.Primary != "n1" {
		t.Fatalf("create: %+v, %v; want n1 the primary", p, err)
	}
	stores["n1"].setFail(errors.New("volume in use: attached by worker-1"))
	err = tc.first.Volumes().DeleteVolume(ctx, "web01")
	if !errors.Is(err, ErrDeleteRefused) {
		t.Fatalf("delete of an attached volume: %v; want ErrDeleteRefused", err)
	}
	got, ok, _ := tc.first.Volumes().Placement(ctx, "web01")
	if !ok || got.Deleting {
		t.Fatalf("after the refused delete: %+v %v; want it placed and active", got, ok)
	}
	for name, s := range stores {
		if !s.has("web01") {
			t.Errorf("%s lost its copy in a refused delete", name)
		}
	}
	stores["n1"].setFail(nil)
	if err := tc.first.Volumes().DeleteVolume(ctx, "web01"); err != nil {
		t.Fatalf("delete once detached: %v", err)
	}
	for name, s := range stores {
		if s.has("web01") {
			t.Errorf("%s still holds web01", name)
		}
	}
	if _, ok, _ := tc.first.Volumes().Placement(ctx, "web01"); ok {
		t.Fatal("placement left after the delete")
	}
}

// uid is the UID of the store's volume name ("" when it has none).
func (s *memStore) uid(name string) string { s.mu.Lock(); defer s.mu.Unlock(); return s.vols[name] }
