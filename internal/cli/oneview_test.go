package cli

import (
	"context"
	"strings"
	"testing"

	"github.com/quiverstorage/quiver/internal/api"
)

// TestPoolInfoCluster (issue 32): on a cluster `pool info` prints the
// cluster's totals and a line per node before the answering node's own
// pool; -o json carries both.
func TestPoolInfoCluster(t *testing.T) {
	f, url := newFakeAPI(t)
	f.reply("GET /v1/pool", 200, api.PoolInfo{ID: "p1", Path: "/srv/quiver", TotalBytes: 100 << 30, FreeBytes: 60 << 30,
		Volumes: 2, Cluster: "alpha",
		ClusterPool: &api.ClusterPool{TotalBytes: 150 << 30, FreeBytes: 75 << 30, ProvisionedBytes: 30 << 30, Volumes: 3,
			Nodes: []api.PoolNode{
				{Name: "n1", State: api.NodeUp, CapacityBytes: 100 << 30, FreeBytes: 60 << 30, Copies: 2, Self: true},
				{Name: "n2", State: api.NodeUp, Drain: api.NodeDrained, CapacityBytes: 50 << 30, FreeBytes: 15 << 30},
				{Name: "n3", State: api.NodeDown, Copies: 4},
			}}})
	got := run(t, context.Background(), url, nil, "pool", "info")
	if got.code != 0 {
		t.Fatalf("exit %d, stderr %q", got.code, got.stderr)
	}
	want := `Cluster:      alpha
Nodes:        3 (2 up)
Total:        150Gi (the nodes' pools, as each reports it)
Free:         75Gi (50%)
Provisioned:  30Gi (each volume once, whatever its copies; 0.20x the cluster's size)
Volumes:      3

NODE        STATE         CAPACITY   FREE   COPIES
n1 (this)   up            100Gi      60Gi   2
n2          up, drained   50Gi       15Gi   0
n3          down          -          -      4

This node's pool:
ID:               p1
Path:             /srv/quiver
`
	if !strings.HasPrefix(got.stdout, want) {
		t.Errorf("pool info on a cluster:\n%s\nwant it to begin with:\n%s", got.stdout, want)
	}
	if !strings.Contains(got.stdout, "Volumes:          2\n") {
		t.Errorf("pool info on a cluster lacks the node's own volume count:\n%s", got.stdout)
	}
	got = run(t, context.Background(), url, nil, "pool", "info", "-o", "json")
	for _, want := range []string{`"clusterPool": {`, `"totalBytes": 161061273600`, `"name": "n3"`, `"copies": 4`, `"id": "p1"`} {
		if !strings.Contains(got.stdout, want) {
			t.Errorf("pool info -o json lacks %s:\n%s", want, got.stdout)
		}
	}
}
