package clustertest

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/quiverstorage/quiver/internal/api"
	"github.com/quiverstorage/quiver/internal/client"
)

// TestClusterTenantSnapshots (docs/security.md, "Tenants on a cluster"): a
// tenant's token snapshots, clones and rolls back its replicated and
// unreplicated volumes through nodes that are not their primary; its
// snapshot and volume quotas are counted cluster-wide, and a snapshot or a
// clone past them is refused with nothing made on any node; another
// tenant's snapshot, clone and rollback of them, through a node that is not
// the primary, are refused as not found, with nothing changed.
func TestClusterTenantSnapshots(t *testing.T) {
	c := startCluster(t)
	ctx := context.Background()
	c.waitNodes(c.nodes[0], "n1 n2 n3 up", allUp("n1", "n2", "n3"))
	admin := c.nodes[0].api()
	if _, err := admin.SetTenant(ctx, "a", api.TenantSpec{Quota: api.Quota{Volumes: 3, Snapshots: 2}}); err != nil {
		t.Fatal(err)
	}
	tc := tenantClients(t, c, admin, "a", "b")
	as, bs := tc["a"], tc["b"]
	// Quota 2 snapshots: every node waits for it.
	for _, nd := range c.nodes {
		for start := time.Now(); ; time.Sleep(10 * time.Millisecond) {
			ts, err := nd.api().ListTenants(ctx)
			if err == nil && len(ts) > 0 && quotaOf(ts, "a").Snapshots == 2 {
				break
			} else if time.Since(start) > 5*time.Second {
				t.Fatalf("a's quota on %s for 5 s: %+v, %v", nd.name, ts, err)
			}
		}
	}

	rep, err := as["n1"].CreateVolume(ctx, api.VolumeSpec{Name: "web", Capacity: 4 * mib, Replicas: 2,
		Disks: []api.DiskSpec{{Name: "root", Size: 4 * mib}}})
	if err != nil {
		t.Fatal(err)
	}
	one, err := as["n2"].CreateVolume(ctx, api.VolumeSpec{Name: "db", Capacity: 4 * mib,
		Disks: []api.DiskSpec{{Name: "root", Size: 4 * mib}}})
	if err != nil {
		t.Fatal(err)
	}
	prim, cp := c.byName(rep.Primary), c.byName(copyNodes(rep)[1])
	spare := c.other(prim, cp)
	onePrim := c.byName(one.Primary)
	oneOther := c.other(onePrim)

	// Another tenant, through nodes that are not the primaries: not found,
	// and nothing made.
	for _, nd := range []*node{cp, spare} {
		for _, name := range []string{"web", "a--web"} {
			if _, err := bs[nd.name].CreateSnapshot(ctx, name, "evil"); client.Code(err) != api.CodeNotFound {
				t.Errorf("b snapshots %s through %s: %v, want NotFound", name, nd.name, err)
			}
			if _, err := bs[nd.name].Rollback(ctx, name, "evil", client.Force()); client.Code(err) != api.CodeNotFound {
				t.Errorf("b rolls %s back through %s: %v, want NotFound", name, nd.name, err)
			}
			if _, err := bs[nd.name].Clone(ctx, api.CloneSpec{Source: api.Source{Volume: name}, Names: []string{"stolen"}}); client.Code(err) != api.CodeNotFound {
				t.Errorf("b clones %s through %s: %v, want NotFound", name, nd.name, err)
			}
			if _, err := bs[nd.name].ListSnapshots(ctx, name); client.Code(err) != api.CodeNotFound {
				t.Errorf("b lists %s's snapshots through %s: %v, want NotFound", name, nd.name, err)
			}
		}
	}
	if _, err := admin.GetVolume(ctx, "b--stolen"); client.Code(err) != api.CodeNotFound {
		t.Errorf("b's clone of a's volume: %v, want NotFound", err)
	}
	for _, nd := range c.nodes {
		if _, err := os.Stat(filepath.Join(nd.pool, "volumes", "a--web", "snapshots", "evil")); err == nil {
			t.Errorf("b's snapshot of a's volume is on %s", nd.name)
		}
	}

	// a's own: a snapshot of each through a node that is not its primary.
	att, err := as[prim.name].Attach(ctx, "web", api.AttachmentSpec{Node: "w1"})
	if err != nil {
		t.Fatal(err)
	}
	c.qemuIO(t, att.URIs["root"], "write -P 0x44 0 1M", "flush")
	if err := as[prim.name].Detach(ctx, "web", att.ID); err != nil {
		t.Fatal(err)
	}
	if s, err := as[spare.name].CreateSnapshot(ctx, "web", "s1"); err != nil || s.Volume != "web" {
		t.Fatalf("a snapshots web through %s: %+v, %v", spare.name, s, err)
	}
	if _, err := as[oneOther.name].CreateSnapshot(ctx, "db", "s1"); err != nil {
		t.Fatalf("a snapshots db through %s (its primary is %s): %v", oneOther.name, onePrim.name, err)
	}
	// The third is past the snapshot quota, through any node: nothing made.
	for _, nd := range c.nodes {
		if _, err := as[nd.name].CreateSnapshot(ctx, "web", "s2"); client.Code(err) != api.CodeQuota {
			t.Fatalf("a's third snapshot through %s: %v, want %s", nd.name, err, api.CodeQuota)
		}
	}
	for _, nd := range []*node{prim, cp} {
		if _, err := os.Stat(filepath.Join(nd.pool, "volumes", "a--web", "snapshots", "s2")); err == nil {
			t.Errorf("the refused snapshot is on %s", nd.name)
		}
	}
	if l, err := as[spare.name].ListSnapshots(ctx, "web"); err != nil || len(l) != 1 || l[0].Name != "s1" || l[0].Volume != "web" {
		t.Fatalf("a's snapshots of web through %s: %+v, %v", spare.name, l, err)
	}
	if u := usedOf(t, admin, "a"); u.Snapshots != 2 || u.Volumes != 2 {
		t.Fatalf("a's use: %+v, want 2 snapshots, 2 volumes", u)
	}

	// Rollback through the other copy's node.
	c.qemuIO(t, mustAttach(t, as[prim.name], "web"), "write -P 0x55 0 1M", "flush")
	if _, err := as[cp.name].Rollback(ctx, "web", "s1", client.Force()); err != nil {
		t.Fatalf("a rolls web back through %s: %v", cp.name, err)
	}
	for _, nd := range []*node{prim, cp} {
		if !allBytes(fileBytes(t, nd, "a--web", "root", 0, mib), 0x44) {
			t.Errorf("a--web on %s is not rolled back", nd.name)
		}
	}

	// Clones: one fits the volume quota (3); it is a's, on every node.
	made, err := as[spare.name].Clone(ctx, api.CloneSpec{Source: api.Source{Volume: "web", Snapshot: "s1"}, Names: []string{"web2"}})
	if err != nil {
		t.Fatalf("a clones web@s1 through %s: %v", spare.name, err)
	}
	if len(made) != 1 || made[0].Name != "web2" || made[0].Tenant != "a" || made[0].Primary != prim.name || len(made[0].Copies) != 2 {
		t.Fatalf("a's clone: %+v", made)
	}
	for _, nd := range c.nodes {
		if v, err := as[nd.name].GetVolume(ctx, "web2"); err != nil || v.Tenant != "a" {
			t.Errorf("a's clone through %s: %+v, %v", nd.name, v, err)
		}
		if _, err := bs[nd.name].GetVolume(ctx, "web2"); client.Code(err) != api.CodeNotFound {
			t.Errorf("b gets a's clone through %s: %v", nd.name, err)
		}
	}
	if !allBytes(fileBytes(t, cp, "a--web2", "root", 0, mib), 0x44) {
		t.Error("a's clone on the other copy is not the snapshot")
	}
	// A fourth volume is past the quota: refused through any node, for a
	// replicated and an unreplicated source, with nothing placed.
	for _, tc := range []struct {
		via *node
		src string
	}{{cp, "web"}, {spare, "db"}, {onePrim, "db"}} {
		if _, err := as[tc.via.name].Clone(ctx, api.CloneSpec{Source: api.Source{Volume: tc.src}, Names: []string{"over"}}); client.Code(err) != api.CodeQuota {
			t.Errorf("a's clone of %s past the volume quota through %s: %v, want %s", tc.src, tc.via.name, err, api.CodeQuota)
		}
	}
	for _, nd := range c.nodes {
		if _, err := os.Stat(filepath.Join(nd.pool, "volumes", "a--over")); err == nil {
			t.Errorf("the refused clone is on %s", nd.name)
		}
	}
	if _, err := admin.GetVolume(ctx, "a--over"); client.Code(err) != api.CodeNotFound {
		t.Errorf("the refused clone: %v, want NotFound", err)
	}
	// A deleted snapshot gives its count back: a clone of the unreplicated
	// volume, through a node that does not hold it, once web2 is gone.
	if _, err := as[cp.name].DeleteVolume(ctx, "web2"); err != nil {
		t.Fatal(err)
	}
	if err := as[spare.name].DeleteSnapshot(ctx, "db", "s1"); err != nil {
		t.Fatal(err)
	}
	if u := usedOf(t, admin, "a"); u.Snapshots != 1 || u.Volumes != 2 {
		t.Fatalf("a's use after deletes: %+v, want 1 snapshot, 2 volumes", u)
	}
	made, err = as[oneOther.name].Clone(ctx, api.CloneSpec{Source: api.Source{Volume: "db"}, Names: []string{"db2"}})
	if err != nil {
		t.Fatalf("a clones db through %s: %v", oneOther.name, err)
	}
	if len(made) != 1 || made[0].Tenant != "a" || made[0].Primary != onePrim.name {
		t.Fatalf("a's clone of db: %+v", made)
	}
	if l, err := as[oneOther.name].ListVolumes(ctx, ""); err != nil || len(l) != 3 {
		t.Fatalf("a's volumes through %s: %+v, %v; want web, db, db2", oneOther.name, l, err)
	}
	if _, err := as[cp.name].CreateSnapshot(ctx, "db2", "x"); err != nil {
		t.Fatalf("a snapshots its clone db2 through %s: %v", cp.name, err)
	}
	if u := usedOf(t, admin, "a"); u.Snapshots != 2 || u.Volumes != 3 {
		t.Fatalf("a's use: %+v, want 2 snapshots, 3 volumes", u)
	}
	// Deleting a volume with its snapshots gives both back.
	if _, err := as[spare.name].DeleteVolume(ctx, "db2", client.Recursive()); err != nil {
		t.Fatal(err)
	}
	if u := usedOf(t, admin, "a"); u.Snapshots != 1 || u.Volumes != 2 {
		t.Fatalf("a's use after deleting db2: %+v, want 1 snapshot, 2 volumes", u)
	}
}

func quotaOf(ts []api.Tenant, name string) api.Quota {
	for _, tn := range ts {
		if tn.Name == name {
			return tn.Quota
		}
	}
	return api.Quota{}
}

func usedOf(t *testing.T, admin *client.Client, name string) api.Quota {
	t.Helper()
	ts, err := admin.ListTenants(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for _, tn := range ts {
		if tn.Name == name {
			return tn.Used
		}
	}
	t.Fatalf("tenant %s not listed", name)
	return api.Quota{}
}

// mustAttach attaches volume for "w1" through c and returns its root's URI;
// the attachment is left (a rollback with force goes past it).
func mustAttach(t *testing.T, c *client.Client, volume string) string {
	t.Helper()
	att, err := c.Attach(context.Background(), volume, api.AttachmentSpec{Node: "w1"})
	if err != nil {
		t.Fatal(err)
	}
	return att.URIs["root"]
}
