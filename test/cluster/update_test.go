package clustertest

import (
	"context"
	"maps"
	"testing"

	"github.com/quiverstorage/quiver/internal/api"
	"github.com/quiverstorage/quiver/internal/client"
)

// TestClusterVolumeUpdate: PATCH /v1/volumes/{volume} (capacity, labels,
// QoS) on a cluster reaches every copy of a replicated volume, and the
// record the nodes without a copy answer from, whichever node is asked
// (before, only the asked node's own copy changed); a tenant's changes are
// counted in its cluster-wide usage and refused past its quota with
// nothing changed anywhere; a one-copy volume on another node is updated
// there. docs/cluster.md, "Changes at the cut".
func TestClusterVolumeUpdate(t *testing.T) {
	c := startCluster(t)
	ctx := context.Background()
	c.waitNodes(c.nodes[0], "n1 n2 n3 up", allUp("n1", "n2", "n3"))
	admin := c.nodes[0].api()
	if _, err := admin.SetTenant(ctx, "a", api.TenantSpec{Quota: api.Quota{Capacity: 4 << 20, IOPS: 1000}}); err != nil {
		t.Fatal(err)
	}
	as := tenantClients(t, c, admin, "a")["a"]
	v, err := as["n1"].CreateVolume(ctx, api.VolumeSpec{Name: "vm", Capacity: 1 << 20, Replicas: 2,
		QoS: &api.QoS{RWIOPS: 300}, Disks: []api.DiskSpec{{Name: "root", Size: 1 << 20}}})
	if err != nil {
		t.Fatal(err)
	}
	holders := copyNodes(v)
	var outside *node // the node without a copy: it carries the change to the primary
	for _, nd := range c.nodes {
		if nd.name != holders[0] && nd.name != holders[1] {
			outside = nd
		}
	}
	t.Logf("vm: primary %s, copies %v; updated through %s", v.Primary, holders, outside.name)

	// want checks what every node's admin answers for pool name a--<name>:
	// a node with a copy its copy's manifest, the others etcd's record.
	want := func(step, name string, capacity int64, labels map[string]string, iops int64) {
		t.Helper()
		for _, nd := range c.nodes {
			got, err := nd.api().GetVolume(ctx, "a--"+name)
			if err != nil {
				t.Fatalf("%s: %s on %s: %v", step, name, nd.name, err)
			}
			var gotIOPS int64
			if got.QoS != nil {
				gotIOPS = got.QoS.RWIOPS
			}
			if got.Capacity != capacity || !maps.Equal(got.Labels, labels) || gotIOPS != iops {
				t.Errorf("%s: %s on %s: capacity %d, labels %v, rw IOPS %d; want %d, %v, %d", step, name, nd.name,
					got.Capacity, got.Labels, gotIOPS, capacity, labels, iops)
			}
		}
	}
	used := func(step string, capacity, iops int64) {
		t.Helper()
		ts, err := c.nodes[2].api().ListTenants(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for _, tn := range ts {
			if tn.Name == "a" && (tn.Used.Capacity != capacity || tn.Used.IOPS != iops) {
				t.Errorf("%s: a's use %+v, want capacity %d, IOPS %d", step, tn.Used, capacity, iops)
			}
		}
	}
	used("created", 1<<20, 300)

	capacity := int64(2 << 20)
	gold := map[string]string{"tier": "gold"}
	got, err := as[outside.name].UpdateVolume(ctx, "vm", api.VolumeUpdate{Capacity: &capacity, Labels: gold,
		QoS: &api.QoS{RWIOPS: 500}})
	if err != nil {
		t.Fatalf("update through %s: %v", outside.name, err)
	}
	if got.Capacity != capacity || got.Name != "vm" {
		t.Fatalf("the update's answer: %q capacity %d", got.Name, got.Capacity)
	}
	want("updated", "vm", capacity, gold, 500)
	used("updated", 2<<20, 500)

	// Refused, each with nothing changed on any node nor in the usage:
	// past the capacity quota, past the IOPS quota, no IOPS limit (which
	// exceeds any IOPS quota), a smaller capacity.
	over, small := int64(5<<20), int64(1<<20)
	for _, tc := range []struct {
		what string
		u    api.VolumeUpdate
		code string
	}{
		{"capacity over the quota", api.VolumeUpdate{Capacity: &over}, api.CodeQuota},
		{"IOPS over the quota", api.VolumeUpdate{QoS: &api.QoS{RWIOPS: 2000}}, api.CodeQuota},
		{"no IOPS limit", api.VolumeUpdate{QoS: &api.QoS{}}, api.CodeQuota},
		{"a smaller capacity", api.VolumeUpdate{Capacity: &small, Labels: map[string]string{}}, api.CodeInvalid},
	} {
		for _, nd := range c.nodes {
			if _, err := as[nd.name].UpdateVolume(ctx, "vm", tc.u); client.Code(err) != tc.code {
				t.Errorf("%s through %s: %v, want %s", tc.what, nd.name, err, tc.code)
			}
		}
		want(tc.what+" refused", "vm", capacity, gold, 500)
	}
	used("after the refusals", 2<<20, 500)

	// Labels removed, the IOPS limit lowered, through a copy's node that is
	// not the primary when there is one (carried to the primary).
	via := c.byName(v.Primary)
	for _, h := range holders {
		if h != v.Primary {
			via = c.byName(h)
		}
	}
	if _, err := as[via.name].UpdateVolume(ctx, "vm", api.VolumeUpdate{Labels: map[string]string{},
		QoS: &api.QoS{RWIOPS: 200}}); err != nil {
		t.Fatalf("update through %s: %v", via.name, err)
	}
	want("labels removed", "vm", capacity, nil, 200)
	used("IOPS lowered", 2<<20, 200)

	// A volume of one copy, updated through every node in turn; the
	// quota counts both volumes.
	one, err := as["n2"].CreateVolume(ctx, api.VolumeSpec{Name: "one", Capacity: 1 << 20, QoS: &api.QoS{RWIOPS: 100}})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("one: on %v", copyNodes(one))
	for i, nd := range c.nodes {
		capacity := int64(1<<20) + int64(i+1)<<18
		if _, err := as[nd.name].UpdateVolume(ctx, "one", api.VolumeUpdate{Capacity: &capacity}); err != nil {
			t.Fatalf("one's update through %s: %v", nd.name, err)
		}
		want("one updated through "+nd.name, "one", capacity, nil, 100)
	}
	used("two volumes", 2<<20+7<<18, 300)
	three := int64(3 << 20) // 3 MiB + 1.75 MiB > 4 MiB
	if _, err := as[outside.name].UpdateVolume(ctx, "vm", api.VolumeUpdate{Capacity: &three}); client.Code(err) != api.CodeQuota {
		t.Errorf("vm to 3 MiB beside one's 1.75 MiB: %v, want %s", err, api.CodeQuota)
	}
	for _, name := range []string{"vm", "one"} {
		if _, err := as["n3"].DeleteVolume(ctx, name); err != nil {
			t.Fatal(err)
		}
	}
	used("deleted", 0, 0)
}
