package clustertest

import (
	"context"
	"encoding/json"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/quiverstorage/quiver/internal/api"
	"github.com/quiverstorage/quiver/internal/client"
	"github.com/quiverstorage/quiver/internal/testfs"
	"github.com/quiverstorage/quiver/internal/testserver"
)

// TestNodeReplace (issue 32, "Nodes in and out"): a node that dies for good
// is replaced by a new one with `quiver node replace OLD NEW`. Three nodes
// hold a 2-copy volume written throughout by the failover tests' writer; a
// fourth joins (`quiver node add`); the volume's primary is killed
// (SIGKILL), its copy fails over; `quiver node replace` through a live node
// runs as a job that rebuilds the dead node's copy on the new node (at
// once: --rebuild-after is its default 10 minutes) and removes the dead
// node. Then the volume has its two copies in sync, one on the new node,
// byte-identical; every slot holds its last acknowledged write (written
// before the kill and after it), and a range written once before the kill
// and one written once after the replace hold their bytes on both copies; etcd's voting members are the three live
// nodes; the node list forgets the dead one; its pool is refused when it
// starts again; the audit log of the node asked records the replace. A
// replace of a live node is refused first, with nothing changed.
func TestNodeReplace(t *testing.T) {
	testfs.RequireTool(t, "qemu-io")
	c := startCluster(t)
	ctx := context.Background()
	n1 := c.nodes[0]
	c.waitNodes(n1, "n1 n2 n3 up", allUp("n1", "n2", "n3"))

	v, exports := c.failoverVolume(t, n1, "rp", 2)
	dead := c.byName(v.Primary)
	survivor := c.byName(copyNodes(v)[1])
	w, err := startWriter(ctx, c, exports, c.nbdAddrs(dead), 2, 32)
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if w != nil {
			w.halt()
		}
	}()
	if err := w.waitFlushes(5, 60*time.Second); err != nil {
		t.Fatal(err)
	}
	// Beyond the writer's slots: 1 MiB written once, before the kill.
	uri := func(nd *node) string { return "nbd://" + nd.ip + ":10809/" + exports[0] }
	c.qemuIO(t, uri(dead), "write -P 0x5a 1M 1M", "flush")
	n4 := c.addNode(t, n1, 4, "zone-c", nil)
	c.waitNodes(n1, "four nodes up", allUp("n1", "n2", "n3", "n4"))
	c.checkEtcdMembers(t, "n1", "n2", "n3", "n4")
	t.Logf("rp on %v, primary %s; n4 joined", copyNodes(v), v.Primary)

	// Refused while the node is up, nothing changed.
	_, err = survivor.api().StartReplace(ctx, dead.name, "n4")
	if client.Code(err) != api.CodeNodeInUse || !strings.Contains(err.Error(), "node remove "+dead.name+" --drain") {
		t.Fatalf("replace of %s while it is up: %v, want %s naming the drain", dead.name, err, api.CodeNodeInUse)
	}
	t.Logf("refused: %v", err)

	dead.proc.Kill()
	killed := time.Now()
	live := slices.DeleteFunc(slices.Clone(c.nodes), func(n *node) bool { return n == dead })
	c.waitNodes(survivor, dead.name+" down", func(ns []api.Node) bool {
		s := states(ns)
		return s[dead.name] == api.NodeDown && s["n4"] == api.NodeUp
	})
	if err := w.waitFlushes(5, 60*time.Second); err != nil {
		t.Fatalf("writer after the kill of %s: %v", dead.name, err)
	}

	// Through a node that holds no copy: any live node takes it.
	via := live[0]
	if via == survivor {
		via = live[1]
	}
	start := time.Now()
	full := []string{"netns", "exec", c.net.Hub, quiverBin, "--server", "http://" + via.ip + ":7480",
		"--token-file", c.tokenFile(apiToken), "node", "replace", dead.name, "n4", "-o", "json"}
	// Bounded: a replace that waits for a rebuild that never comes fails
	// the test instead of hanging it.
	cctx, ccancel := context.WithTimeout(ctx, 60*time.Second)
	defer ccancel()
	raw, err := exec.CommandContext(cctx, "ip", full...).Output()
	if err != nil {
		var stderr string
		if ee, ok := err.(*exec.ExitError); ok {
			stderr = string(ee.Stderr)
		}
		t.Fatalf("quiver node replace %s n4: %v\n%s%s", dead.name, err, raw, stderr)
	}
	var job api.Job
	if err := json.Unmarshal(raw, &job); err != nil {
		t.Fatalf("quiver node replace -o json: %v\n%s", err, raw)
	}
	t.Logf("replaced %s by n4 in %v (%v after the kill): job %s %s %s, %d/%d volumes %v, %d/%d bytes", dead.name,
		time.Since(start).Round(time.Millisecond), time.Since(killed).Round(time.Millisecond), job.ID, job.Kind, job.State,
		job.ItemsDone, job.ItemsTotal, job.Result, job.BytesDone, job.BytesTotal)
	if job.Kind != "replace" || job.State != api.JobSucceeded || !slices.Equal(job.Result, []string{"rp"}) ||
		job.BytesTotal != 8<<20 || job.BytesDone != job.BytesTotal {
		t.Fatalf("replace job %+v: want succeeded, rp rebuilt, 8 MiB of 8 MiB", job)
	}

	c.nodes = live // checkEtcdMembers asks the first node's member
	c.checkEtcdMembers(t, names(live)...)
	c.waitNodes(via, dead.name+" forgotten", func(ns []api.Node) bool {
		return !slices.ContainsFunc(ns, func(n api.Node) bool { return n.Name == dead.name }) && allUp(names(live)...)(ns)
	})
	if err := w.waitFlushes(5, 60*time.Second); err != nil {
		t.Fatalf("writer after the replace: %v", err)
	}
	// And 1 MiB written once after it, through a node that forwards.
	c.qemuIO(t, uri(via), "write -P 0x6b 2M 1M", "flush")
	ww := w
	w = nil
	ww.halt()
	if err := ww.err(); err != nil {
		t.Fatalf("writer: %v", err)
	}
	got := c.waitVolume(t, via, "rp", "two copies in sync, one on n4", func(v api.Volume) bool {
		if len(v.Copies) != 2 || !slices.Contains(copyNodes(v), "n4") || !slices.Contains(copyNodes(v), survivor.name) {
			return false
		}
		for _, cc := range v.Copies {
			if cc.State != api.CopyInSync {
				return false
			}
		}
		return true
	})
	checked, flushed, err := ww.check(readImage(t, c.byName(got.Primary), "rp"))
	if err != nil {
		t.Fatalf("rp on its primary %s: %v", got.Primary, err)
	}
	for _, nd := range []*node{survivor, n4} {
		for _, r := range []struct {
			off     int64
			pattern byte
		}{{1 << 20, 0x5a}, {2 << 20, 0x6b}} {
			b := fileBytes(t, nd, "rp", "d0", r.off, 1<<20)
			if i := slices.IndexFunc(b, func(x byte) bool { return x != r.pattern }); i >= 0 {
				t.Errorf("rp d0 on %s: byte %d of the 1 MiB at %d is %#x, want %#x", nd.name, i, r.off, b[i], r.pattern)
			}
		}
	}
	for _, d := range v.Disks {
		if a, b := diskSum(t, survivor, "rp", d.Name), diskSum(t, n4, "rp", d.Name); a != b {
			t.Errorf("rp disk %s differs: %s %s, n4 %s", d.Name, survivor.name, a, b)
		}
	}
	t.Logf("rp: %s at term %d; %d slots hold their last acknowledged write (%d flushed); copies identical",
		formatCopies(got), got.Term, checked, flushed)

	events, err := via.api().ListEvents(ctx, client.EventQuery{Since: start})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.ContainsFunc(events, func(e api.Event) bool {
		return e.Route == "POST /v1/nodes/{node}/replace" && e.Names["node"] == dead.name && e.Names["new"] == "n4" &&
			e.Status == 202
	}) {
		t.Fatalf("audit log of %s: no event of the replace in %+v", via.name, events)
	}

	// The dead node's pool, started again: refused.
	again := &node{name: dead.name, ns: dead.ns, ip: dead.ip, domain: dead.domain, pool: dead.pool, args: dead.args}
	c.spawn(again)
	select {
	case <-again.proc.Exited():
	case <-time.After(60 * time.Second):
		t.Fatalf("the replaced node %s started again and runs:\n%s", dead.name, testserver.Tail(again.proc.Log.String(), 30))
	}
	if err := again.proc.EndedByItself(); err == nil || !strings.Contains(again.proc.Log.String(), "removed from") {
		t.Fatalf("the replaced node %s started again: %v; want a non-zero exit saying it was removed:\n%s", dead.name, err,
			testserver.Tail(again.proc.Log.String(), 20))
	}
	t.Logf("%s refused at start: %s", dead.name, lastLine(again.proc.Log.String()))
}

func names(nodes []*node) []string {
	var out []string
	for _, n := range nodes {
		out = append(out, n.name)
	}
	slices.Sort(out)
	return out
}
