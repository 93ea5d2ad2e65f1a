package clustertest

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"

	"github.com/quiverstorage/quiver/internal/api"
	qcluster "github.com/quiverstorage/quiver/internal/cluster"
	"github.com/quiverstorage/quiver/internal/nbdclient"
	"github.com/quiverstorage/quiver/internal/replica"
)

// TestReplicationCredentials (issue 29, defect 7 and acceptance 3): etcd
// holds no credential that opens a disk, and a copy accepts writes only
// from its primary's current replication session. An attacker who reads
// etcd (as through an external etcd's client port) finds no token; one
// who holds a copy's replication attachment token (what etcd held before)
// is refused by the copy; forged, replayed and older-term credentials are
// refused, and the copy stays unchanged and in sync. A session signed with
// the cluster's key (a node's) opens, and fences the primary's: the
// primary's next write records the copy out of sync, and its resync brings
// the copy back equal to the primary.
func TestReplicationCredentials(t *testing.T) {
	c := startCluster(t)
	ctx := context.Background()
	const mib = 1 << 20
	v, err := c.nodes[0].api().CreateVolume(ctx, api.VolumeSpec{Name: "sess", Capacity: 16 * mib, Replicas: 2,
		Disks: []api.DiskSpec{{Name: "root", Size: 8 * mib}}})
	if err != nil {
		t.Fatal(err)
	}
	prim, cp := c.byName(v.Primary), c.byName(copyNodes(v)[1])
	att, err := prim.api().Attach(ctx, "sess", api.AttachmentSpec{Node: "worker-1"})
	if err != nil {
		t.Fatal(err)
	}
	uri := fmt.Sprintf("nbd://%s:10809/sess/root/%s", prim.ip, att.Token)
	c.qemuIO(t, uri, "write -P 0xab 0 1M", "flush")

	// etcd: every value, read as an attacker on its client port would.
	kvs := c.etcdDump(t)
	secrets := map[string]string{att.Token: "the client's attachment on " + prim.name}
	var copyToken string
	for _, nd := range []*node{prim, cp} {
		for _, a := range poolAttachments(t, nd, "sess") {
			secrets[a.Token] = fmt.Sprintf("attachment %s (node %s) on %s", a.ID, a.Node, nd.name)
			if nd == cp && strings.HasPrefix(a.Node, "replica-") {
				copyToken = a.Token
			}
		}
	}
	if copyToken == "" {
		t.Fatalf("%s holds no replication attachment of sess", cp.name)
	}
	for k, val := range kvs {
		for s, what := range secrets {
			if s != "" && strings.Contains(val, s) {
				t.Errorf("etcd key %s holds the token of %s", k, what)
			}
		}
	}
	if val, ok := kvs["/quiver/attach/sess"]; !ok || !strings.HasPrefix(val, "qvsealed1:") {
		t.Errorf("attach/sess in etcd: %q; want it sealed", val)
	}

	// Every attempt below must leave the copy as it is.
	before := fileBytes(t, cp, "sess", "root", 2*mib, mib)
	attempt := func(what, export string) {
		t.Helper()
		dctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		start := time.Now()
		conn, err := nbdclient.Dial(dctx, cp.ip+":10809", export, nbdclient.Options{Dial: c.net.Dial, Timeout: 20 * time.Second})
		if err == nil {
			werr := conn.WriteAt(make([]byte, 4096), 2*mib, true)
			conn.Close()
			if werr == nil {
				t.Errorf("%s: the copy on %s took a write", what, cp.name)
			}
			return
		}
		t.Logf("%s: refused in %v: %v", what, time.Since(start).Round(time.Millisecond), err)
	}
	attempt("the copy's replication token, straight to the copy", "sess/root/"+copyToken)

	key := qcluster.DeriveReplicationKey(clusterToken, "alpha")
	var alive struct {
		Instance string `json:"instance"`
	}
	if err := json.Unmarshal([]byte(kvs["/quiver/alive/"+cp.name]), &alive); err != nil || alive.Instance == "" {
		t.Fatalf("alive/%s: %q, %v", cp.name, kvs["/quiver/alive/"+cp.name], err)
	}
	good := replica.Credential{Volume: "sess", Disk: "root", Primary: prim.name, Copy: cp.name, Instance: alive.Instance,
		Term: v.Term, Epoch: replica.NewEpoch()}
	forged := func(change func(*replica.Credential), k []byte) string {
		cr := good
		change(&cr)
		return cr.Export(k)
	}
	attempt("a credential signed with another key", forged(func(*replica.Credential) {},
		qcluster.DeriveReplicationKey("another-cluster-token-0123", "alpha")))
	attempt("a credential for another instance of the copy's node", forged(func(c *replica.Credential) {
		c.Instance = "an-earlier-process"
	}, key))
	attempt("a credential of another term", forged(func(c *replica.Credential) { c.Term++ }, key))
	attempt("a credential of another node as primary", forged(func(c *replica.Credential) { c.Primary = cp.name }, key))
	attempt("a credential older than the primary's session", forged(func(c *replica.Credential) { c.Epoch = 1 }, key))
	if got := fileBytes(t, cp, "sess", "root", 2*mib, mib); string(got) != string(before) {
		t.Fatal("the copy changed")
	}
	copyStates(t, prim, "sess", api.CopyInSync)
	if t.Failed() {
		return
	}

	// A client stays connected to the primary: its handle's Set keeps
	// its sessions to the copy.
	client, err := nbdclient.Dial(ctx, prim.ip+":10809", "sess/root/"+att.Token, nbdclient.Options{Dial: c.net.Dial,
		Timeout: 30 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	if err := client.WriteAt(fill(0x11, mib), 3*mib, false); err != nil {
		t.Fatal(err)
	}
	if err := client.Flush(); err != nil {
		t.Fatal(err)
	}

	// A session signed with the cluster's key opens (once: its replay
	// does not) and fences the primary's own.
	ctrl := good
	ctrl.Epoch = replica.NewEpoch()
	conn, err := nbdclient.Dial(ctx, cp.ip+":10809", ctrl.Export(key), nbdclient.Options{Dial: c.net.Dial,
		Timeout: 10 * time.Second})
	if err != nil {
		t.Fatalf("a session signed with the cluster's key: %v", err)
	}
	conn.Close()
	attempt("a replay of that session's credential", ctrl.Export(key))
	if err := client.WriteAt(fill(0xcd, mib), mib, false); err != nil {
		t.Fatalf("a write after the copy's session was replaced: %v", err)
	}
	if err := client.Flush(); err != nil {
		t.Fatal(err)
	}
	c.waitVolume(t, prim, "sess", "the copy fenced, then resynced", func(v api.Volume) bool {
		for _, cc := range v.Copies {
			if cc.State != api.CopyInSync {
				return false
			}
		}
		return true
	})
	if !allBytes(fileBytes(t, cp, "sess", "root", mib, mib), 0xcd) {
		t.Fatal("the copy lacks the write acknowledged after its session was replaced")
	}
	ps := fileSum(t, filepath.Join(prim.pool, "volumes", "sess", "disks", "root.img"))
	if cs := fileSum(t, filepath.Join(cp.pool, "volumes", "sess", "disks", "root.img")); cs != ps {
		t.Fatalf("copy %s in sync with another image than the primary's", cp.name)
	}
	if !strings.Contains(prim.proc.Log.String(), "copy out of sync") {
		t.Errorf("the primary's log does not show the copy recorded out of sync when its session was replaced")
	}
	if n := strings.Count(cp.proc.Log.String(), "replication session refused"); n < 6 {
		t.Errorf("the copy logged %d refused sessions, want one per attempt", n)
	}
}

func fill(b byte, n int) []byte {
	p := make([]byte, n)
	for i := range p {
		p[i] = b
	}
	return p
}

// poolAttachment is what the test reads of a pool's attachments.json.
type poolAttachment struct {
	ID    string `json:"id"`
	Node  string `json:"node"`
	Token string `json:"token"`
}

// poolAttachments reads a volume's attachments from a node's pool.
func poolAttachments(t *testing.T, nd *node, volume string) []poolAttachment {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(nd.pool, "volumes", volume, "attachments.json"))
	if err != nil {
		t.Fatal(err)
	}
	var f struct {
		Attachments []poolAttachment `json:"attachments"`
	}
	if err := json.Unmarshal(b, &f); err != nil {
		t.Fatalf("%s's attachments.json: %v", nd.name, err)
	}
	return f.Attachments
}

// etcdDump reads every key and value of the cluster's etcd, through n1's
// client port.
func (c *cluster) etcdDump(t *testing.T) map[string]string {
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
	resp, err := cli.Get(ctx, "", clientv3.WithPrefix())
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, kv := range resp.Kvs {
		out[string(kv.Key)] = string(kv.Value)
	}
	return out
}
