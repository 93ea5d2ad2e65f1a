package clustertest

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestClusterAdminToken (docs/cluster.md, "Admin token"): three nodes
// started together without --token-file each make an admin token at first
// start; once joined, every node's admin.token is the same, the cluster's,
// 0600, and it works on every node. Before, only the node whose tokens
// became the cluster's had a working admin.token: the others' were
// silently dead (401).
func TestClusterAdminToken(t *testing.T) {
	c := startClusterWith(t, func(_ int, nd *node) { nd.poolToken = true })
	ctx := context.Background()
	var secret string
	for _, nd := range c.nodes {
		file := filepath.Join(nd.pool, "admin.token")
		fi, err := os.Stat(file)
		if err != nil {
			t.Fatal(err)
		}
		if fi.Mode().Perm() != 0o600 {
			t.Errorf("%s: mode %v, want 0600", file, fi.Mode().Perm())
		}
		b, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		s := strings.TrimSpace(string(b))
		if secret == "" {
			secret = s
		}
		if s != secret {
			t.Errorf("%s's admin.token differs from n1's", nd.name)
		}
	}
	for _, nd := range c.nodes {
		cl, err := nd.proc.ClientWith(secret)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := cl.ListTokens(ctx); err != nil {
			t.Errorf("the admin.token on %s: %v", nd.name, err)
		}
	}
}
