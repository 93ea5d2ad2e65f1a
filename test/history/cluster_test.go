package historytest

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/quiverstorage/quiver/internal/api"
	"github.com/quiverstorage/quiver/internal/client"
	"github.com/quiverstorage/quiver/internal/testfs"
	"github.com/quiverstorage/quiver/internal/testserver"
)

const (
	apiToken     = "api-token-of-the-test-0123456789"
	clusterToken = "cluster-token-of-the-test-0123"
	leaseTTL     = 3 * time.Second
	// resyncRate throttles every resync, so that one lasts long enough for
	// the I/O-error fault to land in it (a copy of a disk's 8 MiB: 1 s).
	resyncRate = "8Mi"
)

// node is one storage node: a namespace, an address, a pool on its own
// loop-mounted XFS (mnt) and a server in it.
type node struct {
	name, ns, ip  string
	mnt, pool     string
	etcd          string // the embedded etcd member's data, off the pool's filesystem
	args          []string
	proc          *testserver.Process
	logs          []string // the logs of its earlier processes
	ready         bool     // its current process served (waitReady), and was not killed since
	restartsCount int
}

func (n *node) api() *client.Client { return n.proc.API }

type cluster struct {
	t     *testing.T
	net   *network
	dir   string
	token string // the cluster token's file
	nodes []*node
}

// startCluster starts three nodes with embedded etcd members, each pool on
// an XFS of its own (a power cut is that XFS shut down, test/shutdown's
// way), the etcd members' data beside them on the test's directory.
func startCluster(t *testing.T) *cluster {
	c := &cluster{t: t, net: newNetwork(t), dir: t.TempDir()}
	c.token = filepath.Join(c.dir, "cluster-token")
	if err := os.WriteFile(c.token, []byte(clusterToken+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	var initial []string
	for i := range 3 {
		nd := &node{name: fmt.Sprintf("n%d", i+1), mnt: testfs.MountXFS(t, 300<<20),
			etcd: filepath.Join(c.dir, fmt.Sprintf("etcd%d", i+1))}
		nd.pool = filepath.Join(nd.mnt, "pool")
		nd.ns, nd.ip = c.net.AddNode(i + 1)
		initial = append(initial, fmt.Sprintf("%s=http://%s:2380", nd.name, nd.ip))
		c.nodes = append(c.nodes, nd)
	}
	for i, nd := range c.nodes {
		nd.args = []string{"--listen", nd.ip + ":7480", "--node-name", nd.name,
			"--cluster-token-file", c.token, "--node-lease-ttl", leaseTTL.String(),
			"--node-report-interval", "1s", "--resync-rate", resyncRate,
			"--cluster-name", "alpha", "--initial-cluster", strings.Join(initial, ","),
			"--etcd-data-dir", nd.etcd, "--nbd-listen", nd.ip + ":10809",
			"--failure-domain", fmt.Sprintf("zone-%d", i),
			"--etcd-listen-client", fmt.Sprintf("http://%s:2379,http://127.0.0.1:2379", nd.ip),
			// Plaintext etcd between the namespaces (a node refuses it
			// beyond loopback without this).
			"--etcd-insecure"}
		c.spawn(nd)
	}
	for _, nd := range c.nodes {
		c.waitReady(nd)
	}
	return c
}

// spawn starts nd's server and returns at once; the test's end kills it.
func (c *cluster) spawn(nd *node) {
	t := c.t
	t.Helper()
	p, err := testserver.Spawn(quiverBin, testserver.Options{Pool: nd.pool, Token: apiToken, Args: nd.args,
		Wrap: []string{"ip", "netns", "exec", nd.ns}, Dial: c.net.Dial})
	if err != nil {
		t.Fatal(err)
	}
	nd.proc, nd.ready = p, false
	t.Cleanup(func() {
		p.Kill()
		if err := p.CheckLog(); err != nil {
			t.Errorf("%s: %v", nd.name, err)
		}
	})
}

func (c *cluster) waitReady(nd *node) {
	c.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	if err := nd.proc.WaitReady(ctx); err != nil {
		c.t.Fatalf("%s: %v", nd.name, err)
	}
	nd.ready = true
}

// kill SIGKILLs nd's server.
func (c *cluster) kill(nd *node) {
	nd.proc.Kill()
	nd.logs = append(nd.logs, nd.proc.Log.String())
	nd.ready = false
}

// restart starts nd's server again on its pool and waits for it to serve.
func (c *cluster) restart(nd *node) {
	c.t.Helper()
	c.spawn(nd)
	c.waitReady(nd)
	nd.restartsCount++
}

func (c *cluster) byName(name string) *node {
	for _, nd := range c.nodes {
		if nd.name == name {
			return nd
		}
	}
	c.t.Fatalf("no node %q", name)
	return nil
}

// up returns a node that is up, other than the excluded ones.
func (c *cluster) up(exclude ...*node) *node {
	for _, nd := range c.nodes {
		if nd.ready && !contains(exclude, nd) {
			return nd
		}
	}
	c.t.Fatal("no node up")
	return nil
}

func contains(ns []*node, n *node) bool {
	for _, x := range ns {
		if x == n {
			return true
		}
	}
	return false
}

// volume reads the volume's record from any node that answers (from
// first, when given and up).
func (c *cluster) volume(name string, first *node) (api.Volume, error) {
	var err error
	order := append([]*node{first}, c.nodes...)
	for _, nd := range order {
		if nd == nil || !nd.ready {
			continue
		}
		var v api.Volume
		if v, err = getVolume(nd, name); err == nil {
			return v, nil
		}
	}
	return api.Volume{}, err
}

// getVolume reads the volume's record from nd.
func getVolume(nd *node, name string) (api.Volume, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	return nd.api().GetVolume(ctx, name)
}

// waitVolume polls the volume until ok accepts it or limit passes; it
// returns the last record read and whether ok accepted it.
func (c *cluster) waitVolume(name string, limit time.Duration, ok func(api.Volume) bool) (api.Volume, bool) {
	deadline := time.Now().Add(limit)
	for {
		v, err := c.volume(name, nil)
		if err == nil && ok(v) {
			return v, true
		}
		if time.Now().After(deadline) {
			return v, false
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// waitAllUp waits until every node's etcd lease is alive in the node list.
func (c *cluster) waitAllUp(limit time.Duration) bool {
	deadline := time.Now().Add(limit)
	for time.Now().Before(deadline) {
		nd := c.up()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		nodes, err := nd.api().ListNodes(ctx)
		cancel()
		n := 0
		for _, x := range nodes {
			if x.State == api.NodeUp {
				n++
			}
		}
		if err == nil && n == len(c.nodes) {
			return true
		}
		time.Sleep(200 * time.Millisecond)
	}
	return false
}

func copyState(v api.Volume, nodeName string) string {
	for _, cp := range v.Copies {
		if cp.Node == nodeName {
			return cp.State
		}
	}
	return ""
}

func formatCopies(v api.Volume) string {
	var parts []string
	for _, cp := range v.Copies {
		s := cp.Node + "=" + cp.State
		if cp.Reason != "" {
			s += " (" + cp.Reason + ")"
		}
		parts = append(parts, s)
	}
	return fmt.Sprintf("primary %s term %d; %s", v.Primary, v.Term, strings.Join(parts, ", "))
}

// etcdLeader asks each up node's etcd member whether it leads
// (maintenance/status of etcd's JSON gateway).
func (c *cluster) etcdLeader() *node {
	hc := &http.Client{Timeout: 3 * time.Second, Transport: &http.Transport{
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			return c.net.Dial(ctx, network, addr)
		}}}
	deadline := time.Now().Add(30 * time.Second)
	for {
		for _, nd := range c.nodes {
			if !nd.ready {
				continue
			}
			resp, err := hc.Post("http://"+nd.ip+":2379/v3/maintenance/status", "application/json", bytes.NewReader([]byte("{}")))
			if err != nil {
				continue
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			var st struct {
				Header struct {
					MemberID string `json:"member_id"`
				} `json:"header"`
				Leader string `json:"leader"`
			}
			if json.Unmarshal(body, &st) == nil && st.Leader != "" && st.Leader == st.Header.MemberID {
				return nd
			}
		}
		if time.Now().After(deadline) {
			c.t.Fatal("no etcd member says it leads")
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// promotedAt finds when nd promoted itself to primary of volume at term, in
// its log.
func promotedAt(nd *node, volume string, term uint64) (time.Time, bool) {
	for _, line := range strings.Split(nd.proc.Log.String(), "\n") {
		if !strings.Contains(line, `msg="promoted to primary`) || !strings.Contains(line, " volume="+volume+" ") ||
			!strings.Contains(line, fmt.Sprintf(" term=%d", term)) {
			continue
		}
		f := strings.Fields(line)
		if len(f) == 0 || !strings.HasPrefix(f[0], "time=") {
			continue
		}
		if ts, err := time.Parse(time.RFC3339Nano, strings.TrimPrefix(f[0], "time=")); err == nil {
			return ts, true
		}
	}
	return time.Time{}, false
}

// image reads a disk image of volume in nd's pool.
func image(nd *node, volume, disk string) ([]byte, error) {
	return os.ReadFile(filepath.Join(nd.pool, "volumes", volume, "disks", disk+".img"))
}
