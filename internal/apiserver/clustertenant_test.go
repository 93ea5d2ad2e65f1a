package apiserver

import (
	"context"
	"encoding/json"
	"net/http"
	"slices"
	"testing"

	"github.com/quiverstorage/quiver/internal/api"
	"github.com/quiverstorage/quiver/internal/auth"
	"github.com/quiverstorage/quiver/internal/pool"
)

// TestClusterTenantFindsSnapshots: a tenant's GET /v1/snapshots on a
// cluster node lists the snapshots of all its placed volumes, by its own
// names: of the volume this node holds, read here, and of the volume only
// the other node holds, asked of its primary for the tenant; never another
// tenant's. ?name= narrows it. Its GET /v1/pool counts its placed volumes
// on either node and shows its quota and use; neither is refused (403) as
// it was on a cluster node.
func TestClusterTenantFindsSnapshots(t *testing.T) {
	a, b, aURL, fa, fb := hopNodes(t, "the-cluster-key-0123456789")
	store := sharedStore(t, a, b)
	if _, err := store.SetQuota("t", auth.Quota{Volumes: 5}); err != nil {
		t.Fatal(err)
	}
	_, secret, err := store.Create("t", auth.RoleTenant, "")
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	mk := func(s *Server, name, tenant, snap string) {
		t.Helper()
		if _, _, err := s.pool.Create(ctx, pool.VolumeSpec{Name: name, Tenant: tenant, Capacity: 8 * mib,
			Disks: []pool.DiskSpec{{Name: "root", Size: 8 * mib}}}); err != nil {
			t.Fatal(err)
		}
		v, err := s.pool.Volume(name)
		if err != nil {
			t.Fatal(err)
		}
		if _, _, err := v.CreateSnapshot(ctx, snap, nil); err != nil {
			t.Fatal(err)
		}
	}
	mk(b, "t--w", "t", "s1") // only b holds it
	mk(a, "t--x", "t", "s2") // a holds it
	mk(b, "u--y", "u", "s1") // another tenant's, on b
	mk(a, "u--z", "u", "s2") // and on a
	for _, f := range []*fakeCluster{fa, fb} {
		f.mu.Lock()
		f.prim["t--w"], f.prim["u--y"], f.prim["t--x"], f.prim["u--z"] = "b", "b", "a", "a"
		f.listed = true
		f.mu.Unlock()
	}
	tc := &apiClient{t: t, base: aURL, token: secret}
	find := func(query string) []string {
		t.Helper()
		status, body := tc.do("GET", "/v1/snapshots"+query, nil)
		var l api.List[api.Snapshot]
		if status != http.StatusOK || json.Unmarshal(body, &l) != nil {
			t.Fatalf("the tenant's GET /v1/snapshots%s through a: %d %s", query, status, body)
		}
		var out []string
		for _, s := range l.Items {
			out = append(out, s.Volume+"@"+s.Name)
		}
		return out
	}
	if got, want := find(""), []string{"w@s1", "x@s2"}; !slices.Equal(got, want) {
		t.Errorf("the tenant's snapshots through a: %v, want %v", got, want)
	}
	if got, want := find("?name=s1"), []string{"w@s1"}; !slices.Equal(got, want) {
		t.Errorf("the tenant's snapshots named s1 through a: %v, want %v", got, want)
	}

	status, body := tc.do("GET", "/v1/pool", nil)
	var info api.PoolInfo
	if status != http.StatusOK || json.Unmarshal(body, &info) != nil {
		t.Fatalf("the tenant's GET /v1/pool through a: %d %s", status, body)
	}
	if info.Volumes != 2 || info.ProvisionedBytes != 16*mib || info.Tenant == nil || info.Tenant.Name != "t" ||
		info.Tenant.Quota.Volumes != 5 {
		t.Errorf("the tenant's pool through a: %d volumes, %d bytes provisioned, tenant %+v; want 2, 16 MiB, t with a quota of 5 volumes",
			info.Volumes, info.ProvisionedBytes, info.Tenant)
	}
}

// TestClusterAdminFindsSnapshots (issue 32, "One view from every node"):
// an admin's GET /v1/snapshots through either node lists the snapshots of
// every placed volume (the one only b holds asked of its primary, a
// tenant's by its pool name) and of the asked node's own volume that is
// not placed; ?name= narrows it.
func TestClusterAdminFindsSnapshots(t *testing.T) {
	a, b, aURL, fa, fb := hopNodes(t, "the-cluster-key-0123456789")
	ctx := context.Background()
	mk := func(s *Server, name, tenant, snap string) {
		t.Helper()
		if _, _, err := s.pool.Create(ctx, pool.VolumeSpec{Name: name, Tenant: tenant, Capacity: 8 * mib,
			Disks: []pool.DiskSpec{{Name: "root", Size: 8 * mib}}}); err != nil {
			t.Fatal(err)
		}
		v, err := s.pool.Volume(name)
		if err != nil {
			t.Fatal(err)
		}
		if _, _, err := v.CreateSnapshot(ctx, snap, nil); err != nil {
			t.Fatal(err)
		}
	}
	mk(b, "t--w", "t", "s1") // placed, only b holds it
	mk(a, "x", "", "s2")     // placed, a holds it
	mk(a, "own", "", "s1")   // a's own, not placed
	for _, f := range []*fakeCluster{fa, fb} {
		f.mu.Lock()
		f.prim["t--w"], f.prim["x"] = "b", "a"
		f.listed = true
		f.mu.Unlock()
	}
	c := &apiClient{t: t, base: aURL}
	find := func(query string) []string {
		t.Helper()
		status, body := c.do("GET", "/v1/snapshots"+query, nil)
		var l api.List[api.Snapshot]
		if status != http.StatusOK || json.Unmarshal(body, &l) != nil {
			t.Fatalf("the admin's GET /v1/snapshots%s through a: %d %s", query, status, body)
		}
		var out []string
		for _, s := range l.Items {
			out = append(out, s.Volume+"@"+s.Name)
		}
		return out
	}
	if got, want := find(""), []string{"own@s1", "t--w@s1", "x@s2"}; !slices.Equal(got, want) {
		t.Errorf("the admin's snapshots through a: %v, want %v", got, want)
	}
	if got, want := find("?name=s1"), []string{"own@s1", "t--w@s1"}; !slices.Equal(got, want) {
		t.Errorf("the admin's snapshots named s1 through a: %v, want %v", got, want)
	}
}

// TestClusterTenantDeletingVolume (issue 32): a tenant's volume being
// deleted still counts in its GET /v1/pool, as its volume list shows it
// and its use counts it until the last copy is gone; its snapshots are
// left out of the tenant's GET /v1/snapshots (they go with its copies).
func TestClusterTenantDeletingVolume(t *testing.T) {
	a, b, aURL, fa, fb := hopNodes(t, "the-cluster-key-0123456789")
	store := sharedStore(t, a, b)
	_, secret, err := store.Create("t", auth.RoleTenant, "")
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for _, name := range []string{"t--w", "t--d"} {
		if _, _, err := b.pool.Create(ctx, pool.VolumeSpec{Name: name, Tenant: "t", Capacity: 8 * mib,
			Disks: []pool.DiskSpec{{Name: "root", Size: 8 * mib}}}); err != nil {
			t.Fatal(err)
		}
		v, _ := b.pool.Volume(name)
		if _, _, err := v.CreateSnapshot(ctx, "s1", nil); err != nil {
			t.Fatal(err)
		}
	}
	for _, f := range []*fakeCluster{fa, fb} {
		f.mu.Lock()
		f.prim["t--w"], f.prim["t--d"] = "b", "b"
		f.deleting = map[string]bool{"t--d": true}
		f.listed = true
		f.mu.Unlock()
	}
	tc := &apiClient{t: t, base: aURL, token: secret}
	status, body := tc.do("GET", "/v1/volumes", nil)
	var vols api.List[api.Volume]
	if status != http.StatusOK || json.Unmarshal(body, &vols) != nil || len(vols.Items) != 2 {
		t.Fatalf("the tenant's volumes through a: %d %s; want w and d (deleting)", status, body)
	}
	status, body = tc.do("GET", "/v1/pool", nil)
	var info api.PoolInfo
	if status != http.StatusOK || json.Unmarshal(body, &info) != nil {
		t.Fatalf("the tenant's GET /v1/pool through a: %d %s", status, body)
	}
	if info.Volumes != len(vols.Items) || info.ProvisionedBytes != 16*mib {
		t.Errorf("the tenant's pool through a: %d volumes, %d bytes provisioned; want %d and 16 MiB, as its list",
			info.Volumes, info.ProvisionedBytes, len(vols.Items))
	}
	status, body = tc.do("GET", "/v1/snapshots", nil)
	var snaps api.List[api.Snapshot]
	if status != http.StatusOK || json.Unmarshal(body, &snaps) != nil {
		t.Fatalf("the tenant's GET /v1/snapshots through a: %d %s", status, body)
	}
	if len(snaps.Items) != 1 || snaps.Items[0].Volume != "w" {
		t.Errorf("the tenant's snapshots through a: %s; want w's only", body)
	}
}
