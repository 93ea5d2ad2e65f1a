package clustertest

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/quiverstorage/quiver/internal/api"
	"github.com/quiverstorage/quiver/internal/client"
)

// TestClusterTenants (issue 17 on a cluster, docs/security.md "Tenants on a
// cluster"): tenant a creates a volume through n1; every node answers it
// with tenant a, by a's own name, and tenant b sees it on no node and can
// get, attach or delete it on none. a's attachment is served by the
// primary and its writes reach both copies, and listed by every node
// (GET /v1/attachments) to a only. The quotas are counted cluster-wide:
// creates through other nodes are refused past the count and the capacity
// quota, and concurrent creates through the three nodes do not overshoot.
func TestClusterTenants(t *testing.T) {
	c := startCluster(t)
	ctx := context.Background()
	c.waitNodes(c.nodes[0], "n1 n2 n3 up", allUp("n1", "n2", "n3"))
	admin := c.nodes[0].api()
	if _, err := admin.SetTenant(ctx, "a", api.TenantSpec{Quota: api.Quota{Volumes: 2, Capacity: 3 << 20}}); err != nil {
		t.Fatal(err)
	}
	tc := tenantClients(t, c, admin, "a", "b")
	as, bs := tc["a"], tc["b"]

	v, err := as["n1"].CreateVolume(ctx, api.VolumeSpec{Name: "web", Capacity: 1 << 20, Replicas: 2,
		Disks: []api.DiskSpec{{Name: "root", Size: 1 << 20}}})
	if err != nil {
		t.Fatal(err)
	}
	if v.Name != "web" || v.Tenant != "a" {
		t.Fatalf("created %q of tenant %q, want web of a", v.Name, v.Tenant)
	}
	if pv, err := admin.GetVolume(ctx, "a--web"); err != nil || pv.Tenant != "a" {
		t.Fatalf("the admin's a--web: %+v, %v", pv, err)
	}
	for _, nd := range c.nodes {
		if got, err := as[nd.name].GetVolume(ctx, "web"); err != nil || got.Tenant != "a" || got.Name != "web" {
			t.Fatalf("a's web on %s: %q of %q, %v", nd.name, got.Name, got.Tenant, err)
		}
		if l, err := as[nd.name].ListVolumes(ctx, ""); err != nil || len(l) != 1 || l[0].Name != "web" {
			t.Fatalf("a's list on %s: %v, %v", nd.name, l, err)
		}
		if l, err := bs[nd.name].ListVolumes(ctx, ""); err != nil || len(l) != 0 {
			t.Fatalf("b's list on %s: %v, %v; want empty", nd.name, l, err)
		}
		for _, name := range []string{"web", "a--web"} {
			if _, err := bs[nd.name].GetVolume(ctx, name); client.Code(err) != api.CodeNotFound {
				t.Errorf("b gets %s on %s: %v, want NotFound", name, nd.name, err)
			}
			if _, err := bs[nd.name].Attach(ctx, name, api.AttachmentSpec{Node: "w1"}); client.Code(err) != api.CodeNotFound {
				t.Errorf("b attaches %s on %s: %v, want NotFound", name, nd.name, err)
			}
			if _, err := bs[nd.name].DeleteVolume(ctx, name); client.Code(err) != api.CodeNotFound {
				t.Errorf("b deletes %s on %s: %v, want NotFound", name, nd.name, err)
			}
		}
	}
	// a attaches through the other copy's node, which carries it to the
	// primary (b is refused everywhere), and its writes reach both copies.
	prim := c.byName(v.Primary)
	other := c.byName(copyNodes(v)[0])
	if other == prim {
		other = c.byName(copyNodes(v)[1])
	}
	att, err := as[other.name].Attach(ctx, "web", api.AttachmentSpec{Node: "w1"})
	if err != nil {
		t.Fatalf("a attaches through the copy's node %s: %v", other.name, err)
	}
	if !strings.HasPrefix(att.URIs["root"], "nbd://"+prim.ip+":") {
		t.Fatalf("a's attachment through %s: %v, want the primary %s's", other.name, att.URIs, prim.name)
	}
	c.qemuIO(t, att.URIs["root"], "write -P 0x5a 0 64k", "read -P 0x5a 0 64k")
	for _, nd := range []*node{prim, other} {
		if b := fileBytes(t, nd, "a--web", "root", 0, 64<<10); !allBytes(b, 0x5a) {
			t.Fatalf("the write through a's attachment is not on %s's copy", nd.name)
		}
	}
	// a's attachments across its volumes, from the primary, through every
	// node (the copies' replication attachments are not a's); b sees none.
	for _, nd := range c.nodes {
		if l, err := as[nd.name].FindAttachments(ctx, ""); err != nil || len(l) != 1 || l[0].ID != att.ID || l[0].Volume != "web" {
			t.Errorf("a's attachments through %s: %+v, %v; want only %s of web", nd.name, l, err, att.ID)
		}
		if l, err := bs[nd.name].FindAttachments(ctx, ""); err != nil || len(l) != 0 {
			t.Errorf("b's attachments through %s: %+v, %v; want none", nd.name, l, err)
		}
	}
	if err := as[prim.name].Detach(ctx, "web", att.ID); err != nil {
		t.Fatal(err)
	}

	// Quotas: 2 volumes, 3 MiB. The second volume through n2 fits; a
	// third through n3 is over the count, 3 MiB more over the capacity.
	if _, err := as["n2"].CreateVolume(ctx, api.VolumeSpec{Name: "db", Capacity: 1 << 20}); err != nil {
		t.Fatal(err)
	}
	if _, err := as["n3"].CreateVolume(ctx, api.VolumeSpec{Name: "x", Capacity: 1 << 20}); client.Code(err) != api.CodeQuota {
		t.Fatalf("third volume through n3: %v, want %s", err, api.CodeQuota)
	}
	if _, err := as["n3"].DeleteVolume(ctx, "db"); err != nil {
		t.Fatal(err)
	}
	if _, err := as["n2"].CreateVolume(ctx, api.VolumeSpec{Name: "huge", Capacity: 3 << 20}); client.Code(err) != api.CodeQuota {
		t.Fatalf("over the capacity quota through n2: %v, want %s", err, api.CodeQuota)
	}
	// One volume fits now: six creates at once, two through each node.
	var wg sync.WaitGroup
	var mu sync.Mutex
	made := 0
	for i := range 6 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			nd := c.nodes[i%3]
			_, err := as[nd.name].CreateVolume(ctx, api.VolumeSpec{Name: fmt.Sprintf("r%d", i), Capacity: 1 << 20})
			switch {
			case err == nil:
				mu.Lock()
				made++
				mu.Unlock()
			case client.Code(err) != api.CodeQuota:
				t.Errorf("create r%d through %s: %v", i, nd.name, err)
			}
		}()
	}
	wg.Wait()
	l, err := as["n3"].ListVolumes(ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("6 concurrent creates through 3 nodes with 1 volume left in the quota: %d made; a's volumes: %d", made, len(l))
	if made != 1 || len(l) != 2 {
		t.Fatalf("made %d, a holds %d volumes; want 1 made and 2 held (quota 2)", made, len(l))
	}
	for _, pl := range l {
		if pl.Tenant != "a" {
			t.Fatalf("volume %s of tenant %q", pl.Name, pl.Tenant)
		}
	}
	// The use the admin sees is the cluster's, on any node.
	ts, err := c.nodes[2].api().ListTenants(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, tn := range ts {
		if tn.Name == "a" && (tn.Used.Volumes != 2 || tn.Used.Capacity != 2<<20) {
			t.Fatalf("a's use seen on n3: %+v, want 2 volumes, 2 MiB", tn.Used)
		}
	}
}

// tenantClients makes a tenant token for each of tenants and returns, per
// tenant, a client per node holding it (tenantToken).
func tenantClients(t *testing.T, c *cluster, admin *client.Client, tenants ...string) map[string]map[string]*client.Client {
	t.Helper()
	out := map[string]map[string]*client.Client{}
	for _, tenant := range tenants {
		_, out[tenant] = tenantToken(t, c, admin, tenant)
	}
	return out
}

// tenantToken makes a token of role tenant for tenant through admin, waits
// until every node takes it (the store reaches them through etcd), and
// returns its secret and a client per node name holding it.
func tenantToken(t *testing.T, c *cluster, admin *client.Client, tenant string) (string, map[string]*client.Client) {
	t.Helper()
	ctx := context.Background()
	tk, err := admin.CreateToken(ctx, api.TokenSpec{Role: "tenant", Tenant: tenant})
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]*client.Client{}
	for _, nd := range c.nodes {
		cl, err := nd.proc.ClientWith(tk.Secret)
		if err != nil {
			t.Fatal(err)
		}
		for start := time.Now(); ; time.Sleep(10 * time.Millisecond) {
			if _, err := cl.Version(ctx); err == nil {
				break
			} else if time.Since(start) > 5*time.Second {
				t.Fatalf("tenant %s's token on %s for 5 s: %v", tenant, nd.name, err)
			}
		}
		out[nd.name] = cl
	}
	return tk.Secret, out
}
