package cluster

import (
	"context"
	"errors"
	"testing"

	"github.com/quiverstorage/quiver/internal/api"
)

// TestNotPrimaryAtTerm (issue 29): a change asked of a node that is not the
// volume's primary at the term it gives is ErrNotPrimary (the API's 409
// NotPrimary, the client goes to the primary of the moment), never
// ErrNoSession (503: this node lost etcd), which it is not.
func TestNotPrimaryAtTerm(t *testing.T) {
	tc := startCluster(t)
	n2 := tc.join(t, tc.config(t, "n2"), newMemStore())
	tc.join(t, tc.config(t, "n3"), newMemStore())
	ctx := context.Background()
	never := func(bool, string) bool { return false }
	p, _, err := tc.first.Volumes().CreateVolume(ctx, api.VolumeSpec{Name: "v", Capacity: 1 << 30, Replicas: 2}, "", never)
	if err != nil {
		t.Fatal(err)
	}
	nodes := map[string]*Node{"n1": tc.first, "n2": n2}
	prim, other := nodes[p.Primary], nodes[p.Copies[1].Node]
	if err := prim.Copies().MarkOutOfSync("v", other.Name(), 1, errors.New("test: copy failed")); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name string
		call func() error
	}{
		{"MarkOutOfSync by a copy", func() error {
			return other.Copies().MarkOutOfSync("v", prim.Name(), 1, errors.New("test"))
		}},
		{"MarkOutOfSync at another term", func() error {
			return prim.Copies().MarkOutOfSync("v", other.Name(), 2, errors.New("test"))
		}},
		{"MarkInSync at another term", func() error { return prim.Copies().MarkInSync("v", other.Name(), 2) }},
		{"MarkInSync by a copy", func() error { return other.Copies().MarkInSync("v", other.Name(), 1) }},
		{"SetCopyState at another term", func() error {
			return prim.Copies().SetCopyState("v", other.Name(), 2, CopyResyncing, "", &Progress{})
		}},
		{"UpdateDisks by a copy", func() error {
			return other.Volumes().UpdateDisks(ctx, "v", 1, 1<<30, []api.DiskSpec{{Name: "root", Size: 1 << 20}})
		}},
		{"ReplaceCopy at another term", func() error {
			_, err := prim.Copies().ReplaceCopy(ctx, "v", other.Name(), "", 2)
			return err
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			err := c.call()
			if !errors.Is(err, ErrNotPrimary) || errors.Is(err, ErrNoSession) {
				t.Fatalf("%v: want ErrNotPrimary, not ErrNoSession", err)
			}
		})
	}
	if rec := tc.first.record(t, "v"); rec.Primary != prim.Name() || rec.Term != 1 || len(rec.InSync) != 1 {
		t.Fatalf("record after the refused changes: %+v", rec)
	}
}
