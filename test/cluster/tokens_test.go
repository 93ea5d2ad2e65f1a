package clustertest

import (
	"context"
	"testing"
	"time"

	"github.com/quiverstorage/quiver/internal/api"
	"github.com/quiverstorage/quiver/internal/client"
)

// TestClusterTokens (issue 17 on a cluster): the token store lives in etcd.
// A token made through one node's API works on every node; revoked through
// another node, it is refused everywhere within 1 s. A tenant token is
// served on a cluster node what its role allows (docs/security.md,
// "Tenants on a cluster"; TestClusterTenants).
func TestClusterTokens(t *testing.T) {
	c := startCluster(t)
	ctx := context.Background()
	c.waitNodes(c.nodes[0], "n1 n2 n3 up", allUp("n1", "n2", "n3"))
	tk, err := c.nodes[0].api().CreateToken(ctx, api.TokenSpec{Role: "monitor", Description: "made on n1"})
	if err != nil {
		t.Fatal(err)
	}
	clients := map[string]*client.Client{}
	for _, nd := range c.nodes {
		cl, err := nd.proc.ClientWith(tk.Secret)
		if err != nil {
			t.Fatal(err)
		}
		clients[nd.name] = cl
		// The other nodes learn the token from their watch of etcd: a
		// moment after it is made, under load.
		for start := time.Now(); ; time.Sleep(10 * time.Millisecond) {
			_, err := cl.ListNodes(ctx)
			if err == nil {
				break
			}
			if time.Since(start) > 5*time.Second {
				t.Fatalf("token made on n1, used on %s for 5 s: %v", nd.name, err)
			}
		}
	}
	if _, err := c.nodes[2].api().CreateToken(ctx, api.TokenSpec{Role: "tenant", Tenant: "acme"}); err != nil {
		t.Fatal(err)
	}
	for start := time.Now(); ; time.Sleep(10 * time.Millisecond) {
		list, err := c.nodes[1].api().ListTokens(ctx)
		if err == nil && len(list) == 2 {
			break
		}
		if time.Since(start) > 5*time.Second {
			t.Fatalf("tokens listed on n2 5 s after one made on n1 and one on n3: %v (%v)", list, err)
		}
	}

	start := time.Now()
	if err := c.nodes[1].api().RevokeToken(ctx, tk.ID); err != nil {
		t.Fatal(err)
	}
	for _, nd := range c.nodes {
		for {
			_, err := clients[nd.name].ListNodes(ctx)
			if client.Code(err) == api.CodeUnauthorized {
				break
			}
			if since := time.Since(start); since > time.Second {
				t.Fatalf("token revoked on n2 still works on %s %v later (%v)", nd.name, since, err)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	t.Logf("revoked through n2; refused on every node %v after the revocation was sent", time.Since(start).Round(time.Millisecond))

	ten, err := c.nodes[0].api().CreateToken(ctx, api.TokenSpec{Role: "tenant", Tenant: "beta"})
	if err != nil {
		t.Fatal(err)
	}
	tc, err := c.nodes[1].proc.ClientWith(ten.Secret)
	if err != nil {
		t.Fatal(err)
	}
	// n2 learns the token from its watch: wait for it.
	for start := time.Now(); ; time.Sleep(10 * time.Millisecond) {
		if _, err := tc.Version(ctx); err == nil {
			break
		} else if time.Since(start) > 5*time.Second {
			t.Fatalf("tenant token on n2 for 5 s: %v", err)
		}
	}
	// Every route a tenant's role allows is served to it on a cluster
	// (the unlisted ones are refused: TestTenantOnClusterRefusesUnlisted);
	// beta has no volume, so no attachment, on any node.
	if atts, err := tc.FindAttachments(ctx, ""); err != nil || len(atts) != 0 {
		t.Fatalf("a tenant's attachments on a cluster without its volumes: %v, %v; want none", atts, err)
	}
	if _, err := tc.ListNodes(ctx); client.Code(err) != api.CodeForbidden {
		t.Fatalf("a tenant lists the nodes: %v, want %s", err, api.CodeForbidden)
	}
}
