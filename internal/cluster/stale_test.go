package cluster

import (
	"context"
	"errors"
	"testing"

	"github.com/quiverstorage/quiver/internal/api"
)

// TestStaleCopy: the stale-copy decision deletes only a cluster-made copy
// of a volume whose record exists, places it elsewhere and has an in-sync
// copy elsewhere, with nobody using it; every other case keeps it, and says
// whether to look again.
func TestStaleCopy(t *testing.T) {
	inSync := copyRecord{State: CopyInSync}
	base := func() volumeRecord {
		return volumeRecord{Copies: []string{"n2", "n3"}, Primary: "n2", Term: 3, InSync: []string{"n2", "n3"}}
	}
	copies := map[string]copyRecord{"n2": inSync, "n3": inSync}
	lc := LocalCopy{Name: "v", UID: "u1", Replicas: 2}
	with := func(f func(*volumeRecord)) *volumeRecord { r := base(); f(&r); return &r }
	for _, tc := range []struct {
		name   string
		lc     LocalCopy
		rec    *volumeRecord
		err    error
		copies map[string]copyRecord
		del    bool
		retry  bool
	}{
		{name: "stale", lc: lc, rec: with(func(*volumeRecord) {}), copies: copies, del: true},
		{name: "one in-sync copy elsewhere is enough", lc: lc, copies: map[string]copyRecord{"n2": inSync},
			rec: with(func(r *volumeRecord) { r.InSync = []string{"n2"} }), del: true},
		{name: "etcd error", lc: lc, err: errors.New("context deadline exceeded"), copies: copies, retry: true},
		{name: "record unreadable", lc: lc, err: errors.New("etcd key /quiver/volumes/v: invalid character"), retry: true},
		{name: "not in etcd", lc: lc, rec: nil, copies: copies},
		{name: "quarantined", lc: LocalCopy{Name: "v", Replicas: 2}, rec: with(func(*volumeRecord) {}), copies: copies},
		{name: "made with one copy", lc: LocalCopy{Name: "v", UID: "u1", Replicas: 1},
			rec: with(func(*volumeRecord) {}), copies: copies},
		{name: "volume being deleted", lc: lc, rec: with(func(r *volumeRecord) { r.State = volumeDeleting }), copies: copies},
		{name: "recorded primary", lc: lc, rec: with(func(r *volumeRecord) { r.Primary = "n1" }), copies: copies},
		{name: "placed here", lc: lc, rec: with(func(r *volumeRecord) { r.Copies = []string{"n1", "n2"} }), copies: copies},
		{name: "placed here, rebuilding", lc: lc, copies: map[string]copyRecord{"n2": inSync, "n1": {State: CopyRebuilding}},
			rec: with(func(r *volumeRecord) { r.Copies = []string{"n2", "n1"}; r.InSync = []string{"n2"} })},
		{name: "a drain removes it", lc: lc, rec: with(func(r *volumeRecord) { r.Removing = []string{"n1"} }), copies: copies},
		{name: "no copy in sync in the record", lc: lc, rec: with(func(r *volumeRecord) { r.InSync = nil }),
			copies: copies, retry: true},
		{name: "in-sync set names only this node", lc: lc, rec: with(func(r *volumeRecord) { r.InSync = []string{"n1"} }),
			copies: copies, retry: true},
		{name: "in sync in the record, not in its copy record", lc: lc, rec: with(func(*volumeRecord) {}),
			copies: map[string]copyRecord{"n2": {State: CopyDegraded}, "n3": {State: CopyResyncing}}, retry: true},
		{name: "in sync but out of the placement", lc: lc, copies: copies,
			rec: with(func(r *volumeRecord) { r.InSync = []string{"n4"} }), retry: true},
		{name: "attached", lc: LocalCopy{Name: "v", UID: "u1", Replicas: 2, InUse: "worker-1 (attachment a1, 1 connections)"},
			rec: with(func(*volumeRecord) {}), copies: copies, retry: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			v := staleCopy("n1", tc.lc, tc.rec, tc.err, tc.copies)
			if v.Delete != tc.del || v.Retry != tc.retry || v.Reason == "" {
				t.Fatalf("verdict %+v: want delete %v, retry %v, and a reason", v, tc.del, tc.retry)
			}
		})
	}
}

// TestCollectStale runs the check on a node against etcd: a local copy of a
// volume placed on two other nodes is kept while etcd cannot be read (a
// cancelled read) and deleted once it can; a local volume etcd does not
// know and the placed copies stay.
func TestCollectStale(t *testing.T) {
	tc := startCluster(t) // n1: least free bytes, never placed here
	stores := map[string]*memStore{"n2": newMemStore(), "n3": newMemStore()}
	stores["n2"].free, stores["n3"].free = 90<<30, 80<<30
	n2 := tc.join(t, tc.config(t, "n2"), stores["n2"])
	tc.join(t, tc.config(t, "n3"), stores["n3"])
	ctx := context.Background()
	if _, _, err := tc.first.Volumes().CreateVolume(ctx, api.VolumeSpec{Name: "two", Capacity: 1 << 30, Replicas: 2}, "",
		func(bool, string) bool { return false }); err != nil {
		t.Fatal(err)
	}
	local := tc.first.store.(*memStore)
	local.mu.Lock()
	local.vols["two"], local.vols["mine"] = "stale-uid", "mine-uid"
	local.mu.Unlock()

	cancelled, cancel := context.WithCancel(ctx)
	cancel()
	tc.first.Copies().collectStaleOnce(cancelled, map[string]string{})
	if !local.has("two") {
		t.Fatal("the stale copy was deleted while etcd could not be read")
	}
	tc.first.Copies().collectStaleOnce(ctx, map[string]string{})
	if local.has("two") {
		t.Fatal("the stale copy of a volume placed on n2 and n3, both in sync, is still here")
	}
	if !local.has("mine") {
		t.Fatal("a volume etcd does not know was deleted")
	}
	n2.Copies().collectStaleOnce(ctx, map[string]string{})
	if !stores["n2"].has("two") {
		t.Fatal("n2 deleted its placed copy")
	}
	if got := tc.first.staleDeleted.Load(); got != 1 {
		t.Fatalf("stale copies deleted: %d, want 1", got)
	}
}
