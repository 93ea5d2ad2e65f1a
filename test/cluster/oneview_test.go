package clustertest

import (
	"context"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/quiverstorage/quiver/internal/api"
	"github.com/quiverstorage/quiver/internal/testfs"
)

// TestOneViewFromEveryNode (issue 32, "One view from every node"): an
// admin's pool info and volume du asked of each of three nodes (the
// primary of a two-copy volume, its other copy's node, the node without a
// copy) give the same cluster-wide answer: the three nodes' space, the
// placed volumes counted once each, and each volume measured on its
// primary's copy, named as such; the CLI through the node without a copy
// shows both. The node's own fields of pool info stay its own pool's.
func TestOneViewFromEveryNode(t *testing.T) {
	testfs.RequireTool(t, "qemu-io")
	c := startCluster(t)
	ctx := context.Background()
	prim, other, spare, uri := c.oneDiskReplicated(t, "ov2", 8*mib)
	c.qemuIO(t, uri, "write -P 0x33 0 2M", "flush")
	one, err := spare.api().CreateVolume(ctx, api.VolumeSpec{Name: "ov1", Capacity: 4 * mib,
		Disks: []api.DiskSpec{{Name: "root", Size: 4 * mib}}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := other.api().CreateSnapshot(ctx, "ov2", "s1"); err != nil {
		t.Fatal(err)
	}

	// pool info: stable is what does not move with the filesystem's free
	// space (other tests write beside these pools).
	stable := func(cp api.ClusterPool) api.ClusterPool {
		cp.FreeBytes = 0
		cp.Nodes = slices.Clone(cp.Nodes)
		for i := range cp.Nodes {
			cp.Nodes[i].FreeBytes, cp.Nodes[i].Self = 0, false
		}
		return cp
	}
	var first *api.ClusterPool
	for _, nd := range c.nodes {
		info, err := nd.api().Pool(ctx)
		if err != nil {
			t.Fatalf("pool info through %s: %v", nd.name, err)
		}
		if abs, _ := filepath.Abs(nd.pool); info.Path != abs || info.Cluster != "alpha" {
			t.Errorf("pool info through %s: path %s, cluster %q; want its own pool %s in alpha", nd.name, info.Path, info.Cluster, abs)
		}
		cp := info.ClusterPool
		if cp == nil || cp.Unavailable != "" {
			t.Fatalf("pool info through %s: cluster pool %+v", nd.name, cp)
		}
		copies := 0
		for _, n := range cp.Nodes {
			copies += n.Copies
			if n.State != api.NodeUp || n.CapacityBytes <= 0 || n.Self != (n.Name == nd.name) {
				t.Errorf("pool info through %s: node %+v", nd.name, n)
			}
		}
		if cp.Volumes != 2 || cp.ProvisionedBytes != 12*mib || len(cp.Nodes) != 3 || copies != 3 || cp.TotalBytes <= 0 {
			t.Errorf("pool info through %s: %+v; want 2 volumes of 12 MiB in all, 3 copies on 3 nodes", nd.name, *cp)
		}
		if first == nil {
			first = cp
		} else if a, b := stable(*first), stable(*cp); !reflect.DeepEqual(a, b) {
			t.Errorf("pool info through %s: %+v; through %s: %+v", nd.name, b, c.nodes[0].name, a)
		}
	}

	// volume du: every node answers the same items, each measured on its
	// primary's copy.
	var items []api.ObjectUsage
	for _, nd := range c.nodes {
		u, err := nd.api().SpaceUsage(ctx, "")
		if err != nil {
			t.Fatalf("du through %s: %v", nd.name, err)
		}
		for _, n := range u.Nodes {
			if n.Error != "" || len(n.Missing) > 0 {
				t.Errorf("du through %s: node %+v", nd.name, n)
			}
		}
		got := map[string]api.ObjectUsage{}
		for _, it := range u.Items {
			got[it.Volume+"@"+it.Snapshot] = it
		}
		if v := got["ov2@"]; v.Node != prim.name || v.AllocatedBytes < 2*mib {
			t.Errorf("du through %s: ov2 %+v; want it measured on its primary %s with 2 MiB", nd.name, v, prim.name)
		}
		if s := got["ov2@s1"]; s.Node != prim.name {
			t.Errorf("du through %s: ov2@s1 %+v; want it measured on %s", nd.name, s, prim.name)
		}
		if v := got["ov1@"]; v.Node != one.Primary || v.ProvisionedBytes != 4*mib {
			t.Errorf("du through %s: ov1 %+v; want it measured on its primary %s", nd.name, v, one.Primary)
		}
		if items == nil {
			items = u.Items
		} else if !reflect.DeepEqual(items, u.Items) {
			t.Errorf("du through %s: %+v; through %s: %+v", nd.name, u.Items, c.nodes[0].name, items)
		}
	}

	out := c.cli(spare, "volume", "du", "ov2")
	if !strings.Contains(out, "ov2@s1") || !strings.Contains(out, prim.name+":") || !strings.Contains(out, "NODE") {
		t.Errorf("quiver volume du ov2 through %s:\n%s", spare.name, out)
	}
	out = c.cli(spare, "pool", "info")
	for _, want := range []string{"Cluster:      alpha", "Volumes:      2", "n1", "n2", "n3 (this)", "This node's pool:"} {
		if spare.name != "n3" {
			want = strings.Replace(want, "n3 (this)", spare.name+" (this)", 1)
		}
		if !strings.Contains(out, want) {
			t.Errorf("quiver pool info through %s lacks %q:\n%s", spare.name, want, out)
		}
	}
}
