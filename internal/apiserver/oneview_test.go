package apiserver

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"reflect"
	"slices"
	"testing"

	"github.com/quiverstorage/quiver/internal/api"
	"github.com/quiverstorage/quiver/internal/auth"
	"github.com/quiverstorage/quiver/internal/cluster"
	"github.com/quiverstorage/quiver/internal/pool"
)

// TestOneUIDFromEveryNode (issue 32, "One view from every node"): a
// placed volume with a copy on a and on b (each copy with a local UID of
// its own) answers the cluster record's UID through either node, in its
// GET and in the list.
func TestOneUIDFromEveryNode(t *testing.T) {
	a, b, aURL, fa, fb := hopNodes(t, "the-cluster-key-0123456789")
	if _, _, err := a.pool.Create(context.Background(), pool.VolumeSpec{Name: "v", Capacity: 8 * mib,
		Disks: []pool.DiskSpec{{Name: "root", Size: 8 * mib}}}); err != nil {
		t.Fatal(err)
	}
	for _, f := range []*fakeCluster{fa, fb} {
		f.mu.Lock()
		f.listed = true
		f.mu.Unlock()
	}
	va, _ := a.pool.Volume("v")
	vb, _ := b.pool.Volume("v")
	if va.Info().UID == vb.Info().UID {
		t.Fatalf("the copies on a and b have one local UID %s; the test needs two", va.Info().UID)
	}
	want, _, _ := fa.Placement(context.Background(), "v")
	sb := httptest.NewServer(b)
	t.Cleanup(sb.Close)
	for node, base := range map[string]string{"a": aURL, "b": sb.URL} {
		c := &apiClient{t: t, base: base}
		status, body := c.do("GET", "/v1/volumes/v", nil)
		var v api.Volume
		if status != http.StatusOK || json.Unmarshal(body, &v) != nil {
			t.Fatalf("get through %s: %d %s", node, status, body)
		}
		if v.UID != want.UID {
			t.Errorf("get through %s: UID %s, want the cluster's %s", node, v.UID, want.UID)
		}
		status, body = c.do("GET", "/v1/volumes", nil)
		var l api.List[api.Volume]
		if status != http.StatusOK || json.Unmarshal(body, &l) != nil || len(l.Items) != 1 {
			t.Fatalf("list through %s: %d %s", node, status, body)
		}
		if l.Items[0].UID != want.UID {
			t.Errorf("list through %s: UID %s, want the cluster's %s", node, l.Items[0].UID, want.UID)
		}
	}
}

// TestPoolClusterWide (issue 32): an admin's GET /v1/pool through either
// node of a cluster carries the cluster's pool, the same through both:
// the space each node reports, the copies on each, and every placed
// volume counted once (a deleting one among them) with its disks'
// sizes once, however many copies it has; the node's own fields stay its
// pool's. A tenant's answer has no cluster pool.
func TestPoolClusterWide(t *testing.T) {
	a, b, aURL, fa, fb := hopNodes(t, "the-cluster-key-0123456789")
	store := sharedStore(t, a, b)
	_, secret, err := store.Create("t", auth.RoleTenant, "")
	if err != nil {
		t.Fatal(err)
	}
	space := map[string]cluster.NodeInfo{
		"a": {TotalBytes: 100 << 30, FreeBytes: 60 << 30, Volumes: 2},
		"b": {TotalBytes: 50 << 30, FreeBytes: 10 << 30, Volumes: 3},
	}
	for _, f := range []*fakeCluster{fa, fb} {
		f.mu.Lock()
		f.prim["w"], f.prim["d"] = "a", "b" // each 8 MiB
		f.copies = map[string][]cluster.CopyInfo{"w": {{Node: "a", State: cluster.CopyInSync}, {Node: "b", State: cluster.CopyInSync}}}
		f.deleting = map[string]bool{"d": true}
		f.space, f.listed = space, true
		f.mu.Unlock()
	}
	sb := httptest.NewServer(b)
	t.Cleanup(sb.Close)
	want := api.ClusterPool{TotalBytes: 150 << 30, FreeBytes: 70 << 30, ProvisionedBytes: 3 * 8 * mib, Volumes: 3,
		Nodes: []api.PoolNode{
			{Name: "a", State: api.NodeUp, CapacityBytes: 100 << 30, FreeBytes: 60 << 30, Copies: 2},
			{Name: "b", State: api.NodeUp, CapacityBytes: 50 << 30, FreeBytes: 10 << 30, Copies: 3},
		}}
	for node, base := range map[string]string{"a": aURL, "b": sb.URL} {
		status, body := (&apiClient{t: t, base: base}).do("GET", "/v1/pool", nil)
		var info api.PoolInfo
		if status != http.StatusOK || json.Unmarshal(body, &info) != nil {
			t.Fatalf("GET /v1/pool through %s: %d %s", node, status, body)
		}
		if info.ClusterPool == nil {
			t.Fatalf("GET /v1/pool through %s: no cluster pool: %s", node, body)
		}
		if info.Cluster != "the-cluster" {
			t.Errorf("GET /v1/pool through %s: cluster %q, want the cluster's name, not a node's", node, info.Cluster)
		}
		got := *info.ClusterPool
		for i := range got.Nodes {
			if got.Nodes[i].Self != (got.Nodes[i].Name == node) {
				t.Errorf("through %s: node %s marked self %v", node, got.Nodes[i].Name, got.Nodes[i].Self)
			}
			got.Nodes[i].Self = false
		}
		if !reflect.DeepEqual(got, want) {
			t.Errorf("the cluster pool through %s:\n%+v\nwant\n%+v", node, got, want)
		}
		local := a.pool
		if node == "b" {
			local = b.pool
		}
		pi, _ := local.Info()
		if info.ID != pi.ID || info.Volumes != pi.Volumes || info.TotalBytes != pi.TotalBytes {
			t.Errorf("through %s: the node's own fields are %s/%d volumes/%d bytes, want its pool's %s/%d/%d",
				node, info.ID, info.Volumes, info.TotalBytes, pi.ID, pi.Volumes, pi.TotalBytes)
		}
	}
	status, body := (&apiClient{t: t, base: aURL, token: secret}).do("GET", "/v1/pool", nil)
	var info api.PoolInfo
	if status != http.StatusOK || json.Unmarshal(body, &info) != nil {
		t.Fatalf("the tenant's GET /v1/pool: %d %s", status, body)
	}
	if info.ClusterPool != nil || info.Tenant == nil {
		t.Errorf("the tenant's pool: cluster pool %+v, tenant %+v; want none and its own", info.ClusterPool, info.Tenant)
	}
}

// TestUsageClusterWide (issue 32): an admin's GET /v1/usage through either
// node measures each placed volume on its primary's copy, whichever node
// holds another copy (here each node holds a copy of both volumes, only
// the primary's with data), and says which node measured it; a node's own
// volume that is not placed is its own. With the primary of a volume down,
// the other volumes still answer and the down node is named with the
// volume left out.
func TestUsageClusterWide(t *testing.T) {
	a, b, aURL, fa, fb := hopNodes(t, "the-cluster-key-0123456789")
	ctx := context.Background()
	mk := func(s *Server, name string) {
		t.Helper()
		if _, _, err := s.pool.Create(ctx, pool.VolumeSpec{Name: name, Capacity: 8 * mib,
			Disks: []pool.DiskSpec{{Name: "root", Size: 8 * mib}}}); err != nil {
			t.Fatal(err)
		}
	}
	mk(a, "v") // b has v, its primary's copy
	mk(a, "w")
	mk(b, "w")
	mk(a, "own") // a's alone, not placed
	data := func(n int64) []byte { return bytes.Repeat([]byte{0x5a}, int(n)) }
	writeDisk(t, b.pool, "v", "root", 0, data(mib))
	writeDisk(t, a.pool, "w", "root", 0, data(2*mib))
	writeDisk(t, a.pool, "own", "root", 0, data(mib/2))
	for _, f := range []*fakeCluster{fa, fb} {
		f.mu.Lock()
		f.prim["w"] = "a"
		f.listed = true
		f.mu.Unlock()
	}
	sb := httptest.NewServer(b)
	t.Cleanup(sb.Close)
	usage := func(base string) api.SpaceUsage {
		t.Helper()
		status, body := (&apiClient{t: t, base: base}).do("GET", "/v1/usage", nil)
		var u api.SpaceUsage
		if status != http.StatusOK || json.Unmarshal(body, &u) != nil {
			t.Fatalf("GET /v1/usage through %s: %d %s", base, status, body)
		}
		return u
	}
	// measured maps each volume (not snapshot) to the node that measured
	// it and the bytes its images occupy there.
	type measure struct {
		node string
		size int64
	}
	measured := func(u api.SpaceUsage) map[string]measure {
		out := map[string]measure{}
		for _, it := range u.Items {
			if it.Snapshot == "" {
				out[it.Volume] = measure{it.Node, it.AllocatedBytes}
			}
		}
		return out
	}
	for node, base := range map[string]string{"a": aURL, "b": sb.URL} {
		u := usage(base)
		m := measured(u)
		if m["v"].node != "b" || m["v"].size < mib || m["w"].node != "a" || m["w"].size < 2*mib {
			t.Errorf("through %s: v measured %+v, w %+v; want v on b with 1 MiB, w on a with 2 MiB", node, m["v"], m["w"])
		}
		if own, ok := m["own"]; ok != (node == "a") || (ok && own.node != "a") {
			t.Errorf("through %s: a's own volume measured %+v (%v)", node, own, ok)
		}
		var names []string
		for _, n := range u.Nodes {
			names = append(names, n.Node)
			if n.Error != "" || len(n.Missing) > 0 {
				t.Errorf("through %s: node %+v", node, n)
			}
		}
		if !slices.Equal(names, []string{"a", "b"}) {
			t.Errorf("through %s: nodes %v, want a and b", node, names)
		}
	}

	fa.mu.Lock()
	fa.addrs["b"] = "" // b is down, as a sees it
	fa.mu.Unlock()
	u := usage(aURL)
	m := measured(u)
	if _, ok := m["v"]; ok || m["w"].node != "a" {
		t.Errorf("with b down: %+v; want w on a and v left out", m)
	}
	if len(u.Nodes) != 2 || u.Nodes[1].Node != "b" || u.Nodes[1].Error == "" || !slices.Equal(u.Nodes[1].Missing, []string{"v"}) {
		t.Errorf("with b down: nodes %+v; want b named with v missing", u.Nodes)
	}
}
