package clustertest

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"

	"github.com/quiverstorage/quiver/internal/api"
	"github.com/quiverstorage/quiver/internal/client"
	"github.com/quiverstorage/quiver/internal/testserver"
)

// TestNodesInAndOut (issue 32, acceptance 2): the three-node cluster grows
// to five with `quiver node add` (each new node's etcd member a learner
// until it has caught up and promoted itself) and shrinks back to three with
// `quiver node remove --drain`, while the failover tests' writer writes two
// replicated volumes throughout: one placed on the first nodes, one placed
// on the two new nodes (the most free space, the fewest copies), so that
// each removal drains a primary and a copy away. Then every volume has its
// two copies in sync, every slot holds its last acknowledged write on the
// primary, the copies of every disk are identical, etcd has three voting
// members, and a removed node has stopped by itself and is refused when it
// starts again. On the way: a second add while the first added node has not
// started is refused (Busy), a removal of a node that is not drained is
// refused (NodeInUse) and one sent to the node removed (WrongNode), each
// changing nothing.
func TestNodesInAndOut(t *testing.T) {
	c := startCluster(t)
	ctx := context.Background()
	n1, n2, n3 := c.nodes[0], c.nodes[1], c.nodes[2]
	c.waitNodes(n1, "n1 n2 n3 up", allUp("n1", "n2", "n3"))

	old, oldExports := c.failoverVolume(t, n1, "old", 2)
	wOld, err := startWriter(ctx, c, oldExports, c.nbdAddrs(c.byName(old.Primary)), 2, 32)
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if wOld != nil {
			wOld.halt()
		}
	}()
	if err := wOld.waitFlushes(5, 60*time.Second); err != nil {
		t.Fatal(err)
	}

	// Grow: n4 through n1, n5 through n2.
	n4 := c.addNode(t, n1, 4, "zone-c", func() {
		// etcd takes one learner at a time: refused, nothing added.
		_, err := n2.api().AddNode(ctx, "n5", []string{c.peerURL(subnet + "15")})
		if client.Code(err) != api.CodeBusy || !strings.Contains(err.Error(), "has not joined yet") {
			t.Fatalf("add n5 while n4 has not started: %v, want %s", err, api.CodeBusy)
		}
		t.Logf("refused: %v", err)
	})
	n5 := c.addNode(t, n2, 5, "zone-d", nil)
	c.waitNodes(n1, "five nodes up", allUp("n1", "n2", "n3", "n4", "n5"))
	c.checkEtcdMembers(t, "n1", "n2", "n3", "n4", "n5")
	if err := wOld.waitFlushes(5, 60*time.Second); err != nil {
		t.Fatalf("writer of old after the growth: %v", err)
	}

	fresh, freshExports := c.volumeOf(t, n3, "fresh", 2, 3)
	if nodes := copyNodes(fresh); !slices.Contains(nodes, "n4") && !slices.Contains(nodes, "n5") {
		t.Fatalf("fresh placed on %v, want a copy on the new nodes n4 or n5", nodes)
	}
	t.Logf("fresh placed on %v, primary %s", copyNodes(fresh), fresh.Primary)
	// Through the first nodes, which stay: they forward to the primary.
	wFresh, err := startWriter(ctx, c, freshExports, []string{n3.ip + ":10809", n1.ip + ":10809", n2.ip + ":10809"}, 2, 32)
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if wFresh != nil {
			wFresh.halt()
		}
	}()
	if err := wFresh.waitFlushes(5, 60*time.Second); err != nil {
		t.Fatal(err)
	}

	// Refused, nothing changed: a node not drained, a node removing itself.
	_, err = n1.api().RemoveNode(ctx, "n4")
	if client.Code(err) != api.CodeNodeInUse || !strings.Contains(err.Error(), "not drained") {
		t.Fatalf("remove n4 without a drain: %v, want %s", err, api.CodeNodeInUse)
	}
	t.Logf("refused: %v", err)
	_, err = n4.api().RemoveNode(ctx, "n4")
	if client.Code(err) != api.CodeWrongNode {
		t.Fatalf("remove n4 sent to n4: %v, want %s", err, api.CodeWrongNode)
	}
	t.Logf("refused: %v", err)
	c.waitNodes(n1, "five nodes up", allUp("n1", "n2", "n3", "n4", "n5"))
	c.checkEtcdMembers(t, "n1", "n2", "n3", "n4", "n5")

	// Shrink: n4 through n1, n5 through n3, each drained first.
	c.removeNode(t, n1, n4, []*writer{wOld, wFresh})
	c.checkEtcdMembers(t, "n1", "n2", "n3", "n5")
	c.removeNode(t, n3, n5, []*writer{wOld, wFresh})
	c.checkEtcdMembers(t, "n1", "n2", "n3")
	c.waitNodes(n1, "n1 n2 n3 up and no other", allUp("n1", "n2", "n3"))

	for _, w := range []struct {
		w      **writer
		volume string
		v      api.Volume
	}{{&wOld, "old", old}, {&wFresh, "fresh", fresh}} {
		ww := *w.w
		if err := ww.waitFlushes(5, 60*time.Second); err != nil {
			t.Fatalf("writer of %s after the shrink: %v", w.volume, err)
		}
		ww.halt()
		*w.w = nil
		if err := ww.err(); err != nil {
			t.Fatalf("writer of %s: %v", w.volume, err)
		}
		got := c.waitVolume(t, n1, w.volume, "its copies in sync on n1-n3", func(v api.Volume) bool {
			if len(v.Copies) != w.v.Replicas {
				return false
			}
			for _, cc := range v.Copies {
				if cc.State != api.CopyInSync || (cc.Node != "n1" && cc.Node != "n2" && cc.Node != "n3") {
					return false
				}
			}
			return true
		})
		checked, flushed, err := ww.check(readImage(t, c.byName(got.Primary), w.volume))
		if err != nil {
			t.Fatalf("volume %s on its primary %s: %v", w.volume, got.Primary, err)
		}
		for _, d := range w.v.Disks {
			var sums []string
			for _, n := range copyNodes(got) {
				sums = append(sums, diskSum(t, c.byName(n), w.volume, d.Name))
			}
			if len(slices.Compact(slices.Clone(sums))) != 1 {
				t.Errorf("volume %s disk %s differs between the copies %v: %v", w.volume, d.Name, copyNodes(got), sums)
			}
		}
		t.Logf("volume %s: %s at term %d; %d slots hold their last acknowledged write (%d flushed); copies identical",
			w.volume, formatCopies(got), got.Term, checked, flushed)
	}
}

// volumeOf makes a volume of disks 4 MiB disks and replicas copies through
// via, attached for a worker, and returns it with its disks' exports.
func (c *cluster) volumeOf(t *testing.T, via *node, name string, disks, replicas int) (api.Volume, []string) {
	t.Helper()
	ctx := context.Background()
	spec := api.VolumeSpec{Name: name, Capacity: int64(disks) * 4 << 20, Replicas: replicas}
	for i := range disks {
		spec.Disks = append(spec.Disks, api.DiskSpec{Name: fmt.Sprintf("d%d", i), Size: 4 << 20})
	}
	v, err := via.api().CreateVolume(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	att, err := c.byName(v.Primary).api().Attach(ctx, name, api.AttachmentSpec{Node: "worker-1"})
	if err != nil {
		t.Fatal(err)
	}
	var exports []string
	for _, d := range spec.Disks {
		exports = append(exports, name+"/"+d.Name+"/"+att.Token)
	}
	return v, exports
}

// peerURL is the etcd peer URL of a node at ip.
func (c *cluster) peerURL(ip string) string { return c.etcdScheme() + "://" + ip + ":2380" }

// addNode adds node number i (domain) through via with `quiver node add`,
// calls between (if any) before it starts, starts it with the flags the
// command printed and waits until it serves.
func (c *cluster) addNode(t *testing.T, via *node, i int, domain string, between func()) *node {
	t.Helper()
	nd := &node{name: fmt.Sprintf("n%d", i), domain: domain, pool: filepath.Join(c.dir, fmt.Sprintf("pool%d", i))}
	nd.ns, nd.ip = c.net.AddNode(i)
	var added api.NodeAdded
	out := c.cli(via, "node", "add", nd.name, "--peer-url", c.peerURL(nd.ip), "-o", "json")
	if err := json.Unmarshal([]byte(out), &added); err != nil {
		t.Fatalf("quiver node add -o json: %v\n%s", err, out)
	}
	t.Logf("added %s (member %s): %s", nd.name, added.MemberID, strings.Join(added.Flags, " "))
	if !strings.Contains(added.InitialCluster, nd.name+"="+c.peerURL(nd.ip)) || added.InitialClusterState != "existing" {
		t.Fatalf("quiver node add answered %+v", added)
	}
	if between != nil {
		between()
	}
	nd.args = append([]string{"--cluster-name", "alpha", "--nbd-listen", nd.ip + ":10809",
		"--etcd-listen-client", fmt.Sprintf("%s://%s:2379,%[1]s://127.0.0.1:2379", c.etcdScheme(), nd.ip)}, added.Flags...)
	nd.args = append(nd.args, c.etcdFlags(nd.name)...)
	c.nodes = append(c.nodes, nd)
	c.spawn(nd)
	c.waitReady(nd)
	return nd
}

// removeNode removes nd through via with `quiver node remove --drain`
// while the writers go on, and checks that nd stopped by itself, is gone
// from the node list, and is refused when it starts again on its pool.
func (c *cluster) removeNode(t *testing.T, via, nd *node, ws []*writer) {
	t.Helper()
	start := time.Now()
	full := []string{"netns", "exec", c.net.Hub, quiverBin, "--server", "http://" + via.ip + ":7480",
		"--token-file", c.tokenFile(apiToken), "node", "remove", nd.name, "--drain", "-o", "json"}
	raw, err := exec.Command("ip", full...).Output()
	if err != nil {
		var stderr string
		if ee, ok := err.(*exec.ExitError); ok {
			stderr = string(ee.Stderr)
		}
		t.Fatalf("quiver node remove %s --drain: %v\n%s%s", nd.name, err, raw, stderr)
	}
	var rm api.NodeRemoved
	if err := json.Unmarshal(raw, &rm); err != nil {
		t.Fatalf("quiver node remove -o json: %v\n%s", err, raw)
	}
	t.Logf("removed %s in %v: %+v", nd.name, time.Since(start).Round(time.Millisecond), rm)
	if rm.Name != nd.name || rm.NodeID == "" || rm.MemberID == "" {
		t.Fatalf("quiver node remove answered %+v: want the node id and its etcd member", rm)
	}
	for _, w := range ws {
		if err := w.waitFlushes(5, 60*time.Second); err != nil {
			t.Fatalf("writer after the removal of %s: %v", nd.name, err)
		}
	}
	select {
	case <-nd.proc.Exited():
	case <-time.After(30 * time.Second):
		t.Fatalf("the removed node %s still runs:\n%s", nd.name, testserver.Tail(nd.proc.Log.String(), 30))
	}
	if err := nd.proc.EndedByItself(); err == nil || !strings.Contains(nd.proc.Log.String(), "removed from") {
		t.Fatalf("the removed node %s ended with %v; want a non-zero exit saying it was removed:\n%s", nd.name, err,
			testserver.Tail(nd.proc.Log.String(), 20))
	}
	t.Logf("%s stopped by itself: %s", nd.name, lastLine(nd.proc.Log.String()))
	c.nodes = slices.DeleteFunc(c.nodes, func(n *node) bool { return n == nd })
	c.waitNodes(via, nd.name+" gone", func(ns []api.Node) bool {
		return !slices.ContainsFunc(ns, func(n api.Node) bool { return n.Name == nd.name })
	})

	// The same node, on its pool, started again: refused.
	again := &node{name: nd.name, ns: nd.ns, ip: nd.ip, domain: nd.domain, pool: nd.pool, args: nd.args}
	c.spawn(again)
	select {
	case <-again.proc.Exited():
	case <-time.After(60 * time.Second):
		t.Fatalf("the removed node %s started again and runs:\n%s", nd.name, testserver.Tail(again.proc.Log.String(), 30))
	}
	if err := again.proc.EndedByItself(); err == nil || !strings.Contains(again.proc.Log.String(), "removed from") {
		t.Fatalf("the removed node %s started again: %v; want a non-zero exit saying it was removed:\n%s", nd.name, err,
			testserver.Tail(again.proc.Log.String(), 20))
	}
	t.Logf("%s refused at start: %s", nd.name, lastLine(again.proc.Log.String()))
}

// checkEtcdMembers checks that etcd's voting members are names, and that
// none is a learner.
func (c *cluster) checkEtcdMembers(t *testing.T, names ...string) {
	t.Helper()
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{c.etcdURL(c.nodes[0])}, DialTimeout: 10 * time.Second, TLS: c.etcdTLS(),
		Logger: zap.NewNop(), DialOptions: []grpc.DialOption{grpc.WithContextDialer(func(ctx context.Context, addr string) (net.Conn, error) {
			return c.net.Dial(ctx, "tcp", addr)
		})}})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, err := cli.MemberList(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, m := range resp.Members {
		name := m.Name
		if m.IsLearner {
			name += " (learner)"
		}
		got = append(got, name)
	}
	slices.Sort(got)
	if !slices.Equal(got, names) {
		t.Fatalf("etcd members %v, want %v", got, names)
	}
}
