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

// TestVolumeDuCluster (issue 32): on a cluster `volume du` names the node
// whose copy measured each volume, each node's shared data and pool, and
// the volumes a node down left out; `du VOLUME` of such a volume says why
// it is not there.
func TestVolumeDuCluster(t *testing.T) {
	f, url := newFakeAPI(t)
	f.reply("GET /v1/usage", 200, api.SpaceUsage{Exact: true, SharedBytes: 64 << 20, PoolSizeBytes: 20 << 30, PoolUsedBytes: 3 << 30,
		Items: []api.ObjectUsage{
			{Volume: "a", Node: "n2", ProvisionedBytes: 1 << 30, AllocatedBytes: 256 << 20, UniqueBytes: 192 << 20},
			{Volume: "a", Snapshot: "s1", Node: "n2", ProvisionedBytes: 1 << 30, AllocatedBytes: 64 << 20},
			{Volume: "b", Node: "n1", ProvisionedBytes: 2 << 30, AllocatedBytes: 512 << 20, UniqueBytes: 512 << 20},
		},
		Nodes: []api.NodeSpaceUsage{
			{Node: "n1", Exact: true, PoolSizeBytes: 10 << 30, PoolUsedBytes: 1 << 30},
			{Node: "n2", Exact: true, SharedBytes: 64 << 20, PoolSizeBytes: 10 << 30, PoolUsedBytes: 2 << 30},
			{Node: "n3", Error: "node n3 is down", Missing: []string{"c"}},
		}})
	got := run(t, context.Background(), url, nil, "volume", "du")
	want := `NAME       NODE   PROVISIONED   ALLOCATED   UNIQUE
a          n2     1Gi           256Mi       192Mi
a@s1       n2     1Gi           64Mi        0
b          n1     2Gi           512Mi       512Mi
<shared>   n1     -             -           0
<shared>   n2     -             -           64Mi
<total>    -      3Gi           832Mi       768Mi

Each volume measured on its primary's copy; 3Gi provisioned, each volume once.
n1: 1Gi used of 10Gi (df)
n2: 2Gi used of 10Gi (df)
n3: did not answer (node n3 is down); left out: c
`
	if got.code != 0 || got.stdout != want {
		t.Fatalf("exit %d, stderr %q, stdout:\n%s\nwant:\n%s", got.code, got.stderr, got.stdout, want)
	}
	got = run(t, context.Background(), url, nil, "volume", "du", "a")
	if got.code != 0 || !strings.Contains(got.stdout, "<shared>   n2") || strings.Contains(got.stdout, "n1") {
		t.Fatalf("du a: exit %d, stdout:\n%s", got.code, got.stdout)
	}
	got = run(t, context.Background(), url, nil, "volume", "du", "c")
	if got.code != ExitError || !strings.Contains(got.stderr, `volume "c": not measured: its primary n3 did not answer (node n3 is down)`) {
		t.Fatalf("du c: exit %d, stderr %q", got.code, got.stderr)
	}
}

// TestVolumeListClusterState (issue 32): an admin's volume list on a
// cluster has a STATE column: deleting for a volume pending delete (it
// was listed like any other before), ready when every copy is in sync,
// else the copies that are not; "-" for the node's own volume that is not
// placed.
func TestVolumeListClusterState(t *testing.T) {
	f, url := newFakeAPI(t)
	ready, deleting, degraded, own := testVolumes[0], testVolumes[0], testVolumes[0], testVolumes[1]
	ready.Name, deleting.Name, degraded.Name = "ready", "gone", "slow"
	for _, v := range []*api.Volume{&ready, &deleting, &degraded} {
		v.Replicas, v.Primary, v.Term = 2, "n1", 1
		v.Copies = []api.Copy{{Node: "n1", State: api.CopyInSync}, {Node: "n2", State: api.CopyInSync}}
	}
	deleting.State = api.VolumeDeleting
	deleting.Copies = []api.Copy{{Node: "n1", State: api.CopyDeleted}, {Node: "n2", State: api.CopyInSync}}
	pct := 40.0
	degraded.Copies = []api.Copy{{Node: "n1", State: api.CopyInSync}, {Node: "n2", State: api.CopyResyncing, Progress: &pct}, {Node: "n3"}}
	f.reply("GET /v1/volumes", 200, api.List[api.Volume]{Items: []api.Volume{deleting, ready, degraded, own}})
	got := run(t, context.Background(), url, nil, "volume", "list")
	want := `NAME      STATE                             CAPACITY   DISKS                  SNAPSHOTS   LABELS           AGE
gone      deleting                          200Gi      root=40Gi,data=100Gi   2           app=web,tier=1   3h
ready     ready                             200Gi      root=40Gi,data=100Gi   2           app=web,tier=1   3h
slow      n2 resyncing 40%, n3 being made   200Gi      root=40Gi,data=100Gi   2           app=web,tier=1   3h
vdi-001   -                                 40Gi       root=40Gi              0           <none>           90s
`
	if got.code != 0 || got.stdout != want {
		t.Fatalf("exit %d, stderr %q, stdout:\n%s\nwant:\n%s", got.code, got.stderr, got.stdout, want)
	}
}
