package clustertest

import (
	"context"
	"crypto/tls"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
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
	leaseTTL     = "3s"
)

// node is one storage node: a namespace, an address and a server in it.
type node struct {
	name, ns, ip, domain, pool string
	args                       []string
	proc                       *testserver.Process
	// tls, when set, is how the test's clients reach the node's API over
	// HTTPS (a node started with --tls-cert).
	tls *tls.Config
	// poolToken starts the node without --token-file: its admin token is
	// the one in its pool's admin.token (made at first start).
	poolToken bool
}

func (n *node) api() *client.Client { return n.proc.API }

type cluster struct {
	t      *testing.T
	net    *network
	dir    string
	tokens map[string]string // token files by content
	// certs holds the etcd certificates (etcdtls_test.go; "" in
	// plaintext).
	certs string
	nodes []*node
}

func (c *cluster) tokenFile(token string) string {
	if f, ok := c.tokens[token]; ok {
		return f
	}
	f := filepath.Join(c.dir, fmt.Sprintf("token-%d", len(c.tokens)))
	if err := os.WriteFile(f, []byte(token+"\n"), 0o600); err != nil {
		c.t.Fatal(err)
	}
	c.tokens[token] = f
	return f
}

// spawn starts a server for nd in its namespace and returns at once; it is
// killed at the end of the test unless stopped before.
func (c *cluster) spawn(nd *node) {
	t := c.t
	t.Helper()
	args := append([]string{"--listen", nd.ip + ":7480", "--node-name", nd.name,
		"--cluster-token-file", c.tokenFile(clusterToken), "--node-lease-ttl", leaseTTL,
		"--node-report-interval", "1s"}, nd.args...)
	if nd.domain != "" {
		args = append(args, "--failure-domain", nd.domain)
	}
	token := apiToken
	if nd.poolToken {
		token = ""
	}
	p, err := testserver.Spawn(quiverBin, testserver.Options{Pool: nd.pool, Token: token, AdminTokenFromPool: nd.poolToken,
		Args: args, Wrap: []string{"ip", "netns", "exec", nd.ns}, Dial: c.net.Dial, TLS: nd.tls})
	if err != nil {
		t.Fatal(err)
	}
	nd.proc = p
	t.Cleanup(func() {
		p.Kill()
		if err := p.CheckLog(); err != nil {
			t.Errorf("%s: %v", nd.name, err)
		}
		if t.Failed() {
			t.Logf("%s log:\n%s", nd.name, testserver.Tail(p.Log.String(), 60))
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
}

// startCluster starts three nodes with embedded etcd members, n1 and n2 in
// failure domain zone-a and n3 in zone-b.
func startCluster(t *testing.T) *cluster { return startClusterWith(t, nil) }

// startClusterWith is startCluster with tweak called on each node (0-based
// i) before it starts: more flags, another pool.
func startClusterWith(t *testing.T, tweak func(i int, nd *node)) *cluster {
	c := &cluster{t: t, net: newNetwork(t), dir: t.TempDir(), tokens: map[string]string{}}
	c.makeEtcdCerts()
	scheme := c.etcdScheme()
	var initial []string
	for i, domain := range []string{"zone-a", "zone-a", "zone-b"} {
		nd := &node{name: fmt.Sprintf("n%d", i+1), domain: domain, pool: filepath.Join(c.dir, fmt.Sprintf("pool%d", i+1))}
		nd.ns, nd.ip = c.net.AddNode(i + 1)
		initial = append(initial, fmt.Sprintf("%s=%s://%s:2380", nd.name, scheme, nd.ip))
		c.nodes = append(c.nodes, nd)
	}
	for _, nd := range c.nodes {
		nd.args = []string{"--cluster-name", "alpha", "--initial-cluster", strings.Join(initial, ","),
			"--nbd-listen", nd.ip + ":10809",
			"--etcd-listen-client", fmt.Sprintf("%s://%s:2379,%[1]s://127.0.0.1:2379", scheme, nd.ip)}
		nd.args = append(nd.args, c.etcdFlags(nd.name)...)
	}
	for i, nd := range c.nodes {
		if tweak != nil {
			tweak(i, nd)
		}
		c.spawn(nd)
	}
	for _, nd := range c.nodes {
		c.waitReady(nd)
	}
	return c
}

func (c *cluster) byName(name string) *node {
	for _, nd := range c.nodes {
		if nd.name == name {
			return nd
		}
	}
	c.t.Fatalf("no node %s", name)
	return nil
}

// waitNodes polls the node list from nd until want accepts it.
func (c *cluster) waitNodes(nd *node, what string, want func([]api.Node) bool) []api.Node {
	c.t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		nodes, err := nd.api().ListNodes(context.Background())
		if err == nil && want(nodes) {
			return nodes
		}
		if time.Now().After(deadline) {
			c.t.Fatalf("node list from %s: want %s, have %+v (err %v)", nd.name, what, nodes, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

func states(nodes []api.Node) map[string]string {
	m := map[string]string{}
	for _, n := range nodes {
		m[n.Name] = n.State
	}
	return m
}

func allUp(names ...string) func([]api.Node) bool {
	return func(nodes []api.Node) bool {
		s := states(nodes)
		if len(s) != len(names) {
			return false
		}
		for _, n := range names {
			if s[n] != api.NodeUp {
				return false
			}
		}
		return true
	}
}

// cli runs the quiver CLI in the hub namespace against nd; an error fails
// the test.
func (c *cluster) cli(nd *node, args ...string) string {
	c.t.Helper()
	out, err := c.cliErr(nd, args...)
	if err != nil {
		c.t.Fatalf("quiver %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return out
}

// cliErr is cli that returns the error.
func (c *cluster) cliErr(nd *node, args ...string) (string, error) {
	full := append([]string{"netns", "exec", c.net.Hub, quiverBin, "--server", "http://" + nd.ip + ":7480",
		"--token-file", c.tokenFile(apiToken)}, args...)
	out, err := exec.Command("ip", full...).CombinedOutput()
	return string(out), err
}

func TestCluster(t *testing.T) {
	c := startCluster(t)
	n1, n2, n3 := c.nodes[0], c.nodes[1], c.nodes[2]
	ctx := context.Background()

	t.Run("node list", func(t *testing.T) {
		nodes := c.waitNodes(n1, "n1 n2 n3 up", allUp("n1", "n2", "n3"))
		for i, n := range nodes {
			nd := c.nodes[i]
			if n.Name != nd.name || n.Address != nd.ip+":7480" || n.FailureDomain != nd.domain || n.CapacityBytes <= 0 ||
				n.FreeBytes <= 0 || n.Self != (nd == n1) {
				t.Errorf("node %d: %+v", i, n)
			}
		}
		m, err := n1.api().Metrics(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if up, down, self := m.Sum("quiver_cluster_nodes", map[string]string{"state": "up"}),
			m.Sum("quiver_cluster_nodes", map[string]string{"state": "down"}), m.Sum("quiver_cluster_node_up", nil); up != 3 || down != 0 || self != 1 {
			t.Errorf("metrics: nodes up %v, down %v, this node up %v; want 3, 0, 1", up, down, self)
		}
		out := c.cli(n2, "node", "list")
		t.Logf("quiver node list:\n%s", out)
		if !strings.Contains(out, "n2 (this)") || strings.Count(out, " up ") != 3 || !strings.Contains(out, "zone-b") {
			t.Errorf("node list table:\n%s", out)
		}
	})

	t.Run("replicas 2 on distinct nodes and domains", func(t *testing.T) {
		spec := api.VolumeSpec{Name: "web01", Capacity: 128 << 20, Replicas: 2,
			Disks: []api.DiskSpec{{Name: "root", Size: 64 << 20}, {Name: "data", Size: 32 << 20}}}
		v, err := n2.api().CreateVolume(ctx, spec)
		if err != nil {
			t.Fatal(err)
		}
		var holders []string
		for _, cp := range v.Copies {
			if cp.State != api.CopyInSync {
				t.Errorf("copy %+v not in sync", cp)
			}
			holders = append(holders, cp.Node)
		}
		if v.Replicas != 2 || len(holders) != 2 || holders[0] == holders[1] || v.Primary != holders[0] || v.Term != 1 {
			t.Fatalf("volume %+v", v)
		}
		// Two failure domains: n3 (zone-b) holds one copy.
		if !slices.Contains(holders, "n3") {
			t.Errorf("copies on %v: want one in zone-b (n3)", holders)
		}
		for _, nd := range c.nodes {
			local, err := nd.api().ListVolumes(ctx, "")
			if err != nil {
				t.Fatal(err)
			}
			// One view: every node lists the volume (an admin's list is
			// the cluster's), but only its copies' nodes hold its files.
			has := slices.ContainsFunc(local, func(v api.Volume) bool { return v.Name == "web01" })
			_, statErr := os.Stat(filepath.Join(nd.pool, "volumes", "web01", "disks", "root.img"))
			if want := slices.Contains(holders, nd.name); !has || (statErr == nil) != want {
				t.Errorf("%s: lists web01 %v, root.img %v; want listed, and the file %v", nd.name, has, statErr, want)
			}
			// Any node answers for the volume, with its placement.
			got, err := nd.api().GetVolume(ctx, "web01")
			if err != nil || !slices.Equal(copyNodes(got), holders) || len(got.Disks) != 2 {
				t.Errorf("GET web01 from %s: %+v, %v", nd.name, got, err)
			}
		}
		out := c.cli(n1, "volume", "get", "web01")
		if !strings.Contains(out, "Copies:") || !strings.Contains(out, "(primary, in-sync)") {
			t.Errorf("volume get:\n%s", out)
		}
		nodes := c.waitNodes(n1, "2 volumes counted", func(ns []api.Node) bool {
			total := 0
			for _, n := range ns {
				total += n.Volumes
			}
			return total == 2
		})
		t.Logf("nodes: %+v", nodes)
	})

	t.Run("writes reach both copies, a dead copy degrades the volume", func(t *testing.T) { replicatedWrites(t, c) })

	t.Run("more replicas than nodes refused", func(t *testing.T) {
		_, err := n1.api().CreateVolume(ctx, api.VolumeSpec{Name: "big", Capacity: 64 << 20, Replicas: 4})
		if client.Code(err) != api.CodeNotEnoughNodes {
			t.Fatalf("replicas 4 of 3: %v", err)
		}
		t.Logf("refused: %v", err)
		for _, nd := range c.nodes {
			if _, err := nd.api().GetVolume(ctx, "big"); !client.IsNotFound(err) {
				t.Errorf("%s: GET big after the refusal: %v", nd.name, err)
			}
		}
	})

	t.Run("node down and back", func(t *testing.T) {
		n3.proc.Kill()
		c.waitNodes(n1, "n3 down", func(ns []api.Node) bool { return states(ns)["n3"] == api.NodeDown })
		_, err := n1.api().CreateVolume(ctx, api.VolumeSpec{Name: "three", Capacity: 64 << 20, Replicas: 3})
		if client.Code(err) != api.CodeNotEnoughNodes || !strings.Contains(err.Error(), "down: n3") {
			t.Fatalf("replicas 3 with n3 down: %v", err)
		}
		c.spawn(n3) // the same pool: the same node
		c.waitReady(n3)
		c.waitNodes(n1, "n1 n2 n3 up", allUp("n1", "n2", "n3"))
	})

	t.Run("delete removes every copy", func(t *testing.T) {
		if _, err := n3.api().DeleteVolume(ctx, "web01"); err != nil {
			t.Fatal(err)
		}
		for _, nd := range c.nodes {
			if _, err := nd.api().GetVolume(ctx, "web01"); !client.IsNotFound(err) {
				t.Errorf("%s: GET web01 after delete: %v", nd.name, err)
			}
			if _, err := os.Stat(filepath.Join(nd.pool, "volumes", "web01")); err == nil {
				t.Errorf("%s still holds web01", nd.name)
			}
		}
	})

	t.Run("refused at start", func(t *testing.T) { joinRefused(t, c) })
}

func copyNodes(v api.Volume) []string {
	var out []string
	for _, cp := range v.Copies {
		out = append(out, cp.Node)
	}
	return out
}

// joinRefused starts a fourth node wrongly, each time on a fresh pool: it
// must exit non-zero at start with a message naming the conflict, and the
// cluster must keep its three members, all up.
func joinRefused(t *testing.T, c *cluster) {
	ns, ip := c.net.AddNode(spareNode)
	etcd := c.etcdURL(c.nodes[0])
	n4 := c.etcdFlags("n4")
	type refusal struct {
		name string
		args []string
		want string
	}
	cases := []refusal{
		{"etcd unreachable", []string{"--node-name", "n4", "--etcd-endpoints", c.etcdScheme() + "://" + subnet + "99:2379",
			"--etcd-dial-timeout", "2s"}, "did not answer within 2s"},
		{"a taken node name", []string{"--node-name", "n1", "--etcd-endpoints", etcd}, `node name "n1" is taken`},
		{"another cluster", []string{"--node-name", "n4", "--cluster-name", "beta", "--etcd-endpoints", etcd},
			`holds cluster "alpha", not "beta"`},
		{"a wrong token", []string{"--node-name", "n4", "--etcd-endpoints", etcd,
			"--cluster-token-file", c.tokenFile("not-the-cluster-token-0123")}, "is not the cluster's"},
	}
	for i := range cases {
		cases[i].args = append(cases[i].args, n4...)
	}
	if c.certs != "" {
		// The members' client URLs without TLS.
		cases = append(cases, refusal{"plaintext etcd", []string{"--node-name", "n4", "--etcd-endpoints", "http://" + c.nodes[0].ip + ":2379"},
			"etcd in plaintext beyond loopback"})
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			nd := &node{name: "n4", ns: ns, ip: ip, pool: filepath.Join(c.dir, "pool4-"+strings.ReplaceAll(tc.name, " ", "-")),
				args: append([]string{"--cluster-name", "alpha"}, tc.args...)}
			c.spawn(nd) // the later --node-name, --cluster-name and --cluster-token-file win
			select {
			case <-nd.proc.Exited():
			case <-time.After(60 * time.Second):
				t.Fatalf("still running after 60 s:\n%s", testserver.Tail(nd.proc.Log.String(), 30))
			}
			err := nd.proc.EndedByItself()
			log := nd.proc.Log.String()
			if err == nil || !strings.Contains(err.Error(), "exit status") || !strings.Contains(log, tc.want) {
				t.Fatalf("exit: %v; want a non-zero exit and %q in the log:\n%s", err, tc.want, testserver.Tail(log, 20))
			}
			t.Logf("refused: %s", lastLine(log))
			if _, err := os.Stat(filepath.Join(nd.pool, "cluster", "node.json")); err == nil {
				t.Error("the refused node kept an identity")
			}
			c.waitNodes(c.nodes[0], "n1 n2 n3 up and no n4", allUp("n1", "n2", "n3"))
		})
	}
}

func lastLine(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return lines[len(lines)-1]
}

// qemuIO runs qemu-io commands on uri from the hub namespace and fails the
// test unless each of them succeeded.
func (c *cluster) qemuIO(t *testing.T, uri string, cmds ...string) {
	t.Helper()
	args := []string{"netns", "exec", c.net.Hub, "qemu-io", "-f", "raw"}
	for _, cmd := range cmds {
		args = append(args, "-c", cmd)
	}
	out, err := exec.Command("ip", append(args, uri)...).CombinedOutput()
	if err != nil || strings.Contains(string(out), "failed") || strings.Contains(string(out), "error") {
		t.Fatalf("qemu-io %v: %v\n%s", cmds, err, out)
	}
}

// fileBytes reads length bytes at off of a disk image in a node's pool.
func fileBytes(t *testing.T, nd *node, volume, disk string, off, length int64) []byte {
	t.Helper()
	f, err := os.Open(filepath.Join(nd.pool, "volumes", volume, "disks", disk+".img"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	b := make([]byte, length)
	if _, err := f.ReadAt(b, off); err != nil {
		t.Fatal(err)
	}
	return b
}

func allBytes(b []byte, v byte) bool {
	for _, x := range b {
		if x != v {
			return false
		}
	}
	return true
}

// replicatedWrites writes through the primary of a replicas=2 volume with
// qemu-io: the write is on both copies' images once acknowledged. Then the
// copy's node is killed: the next write and flush still succeed, the copy
// is degraded, and only the primary holds the new data.
func replicatedWrites(t *testing.T, c *cluster) {
	testfs.RequireTool(t, "qemu-io")
	ctx := context.Background()
	const mib = 1 << 20
	v, err := c.nodes[0].api().CreateVolume(ctx, api.VolumeSpec{Name: "rep", Capacity: 64 * mib, Replicas: 2,
		Disks: []api.DiskSpec{{Name: "root", Size: 32 * mib}}})
	if err != nil {
		t.Fatal(err)
	}
	nodes := copyNodes(v)
	prim := c.byName(v.Primary)
	cp := c.byName(nodes[1])
	att, err := prim.api().Attach(ctx, "rep", api.AttachmentSpec{Node: "worker-1"})
	if err != nil {
		t.Fatal(err)
	}
	// Only the primary attaches clients and changes every copy at one cut;
	// the copy's node carries such requests to it and returns its answer
	// (docs/cluster.md, "Any node's API").
	if a2, err := cp.api().Attach(ctx, "rep", api.AttachmentSpec{Node: "worker-2"}); err != nil ||
		!strings.HasPrefix(a2.URIs["root"], "nbd://"+prim.ip+":") {
		t.Errorf("attach through the copy's node: %+v, %v; want the primary's", a2, err)
	} else if err := cp.api().Detach(ctx, "rep", a2.ID); err != nil {
		t.Errorf("detach through the copy's node: %v", err)
	}
	if _, err := cp.api().Rollback(ctx, "rep", "s1"); client.Code(err) != api.CodeNotFound {
		t.Errorf("rollback to a missing snapshot through the copy's node: %v, want the primary's NotFound", err)
	}
	uri := fmt.Sprintf("nbd://%s:10809/rep/root/%s", prim.ip, att.Token)
	c.qemuIO(t, uri, "write -P 0xab 0 1M", "flush")
	for _, nd := range []*node{prim, cp} {
		if !allBytes(fileBytes(t, nd, "rep", "root", 0, mib), 0xab) {
			t.Fatalf("%s's copy lacks the acknowledged write", nd.name)
		}
	}

	cp.proc.Kill()
	start := time.Now()
	c.qemuIO(t, uri, "write -P 0xcd 1M 1M", "flush")
	t.Logf("write and flush with the copy on %s killed: %v", cp.name, time.Since(start).Round(time.Millisecond))
	if !allBytes(fileBytes(t, prim, "rep", "root", mib, mib), 0xcd) {
		t.Fatal("the primary lacks the write acknowledged while degraded")
	}
	if !allBytes(fileBytes(t, cp, "rep", "root", mib, mib), 0) {
		t.Fatal("the dead copy changed")
	}
	got, err := prim.api().GetVolume(ctx, "rep")
	if err != nil {
		t.Fatal(err)
	}
	for _, cc := range got.Copies {
		want := api.CopyInSync
		if cc.Node == cp.name {
			want = api.CopyDegraded
		}
		if cc.State != want {
			t.Errorf("copy %+v: want %s", cc, want)
		}
	}
	t.Logf("copies: %s", formatCopies(got))

	c.spawn(cp)
	c.waitReady(cp)
	if err := prim.api().Detach(ctx, "rep", att.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := c.nodes[0].api().DeleteVolume(ctx, "rep"); err != nil {
		t.Fatal(err)
	}
	for _, nd := range []*node{prim, cp} {
		if _, err := os.Stat(filepath.Join(nd.pool, "volumes", "rep")); err == nil {
			t.Errorf("%s still holds rep", nd.name)
		}
	}
}

func formatCopies(v api.Volume) string {
	var parts []string
	for _, cc := range v.Copies {
		parts = append(parts, fmt.Sprintf("%s=%s (%s)", cc.Node, cc.State, cc.Reason))
	}
	return strings.Join(parts, ", ")
}
