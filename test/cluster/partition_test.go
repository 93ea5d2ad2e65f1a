package clustertest

import (
	"context"
	"fmt"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/quiverstorage/quiver/internal/api"
	"github.com/quiverstorage/quiver/internal/testfs"
)

// partition cuts nd off from the other nodes, inside nd's namespace: with
// etcdOnly, from everything but NBD (so from etcd), so its NBD connections
// to its copies still work; else from every address on the
// bridge but the hub's, where the test's client is. It returns the undo.
func (c *cluster) partition(t *testing.T, nd *node, etcdOnly bool) func() {
	t.Helper()
	var rules [][]string
	for _, o := range c.nodes {
		if o == nd {
			continue
		}
		if etcdOnly {
			// Both directions of every connection but NBD's (etcd's peer
			// streams carry messages both ways on one connection).
			for _, dir := range []string{"--dport", "--sport"} {
				rules = append(rules, []string{"OUTPUT", "-d", o.ip, "-p", "tcp", dir, "10809", "-j", "ACCEPT"},
					[]string{"INPUT", "-s", o.ip, "-p", "tcp", dir, "10809", "-j", "ACCEPT"})
			}
		}
		rules = append(rules, []string{"OUTPUT", "-d", o.ip, "-j", "DROP"}, []string{"INPUT", "-s", o.ip, "-j", "DROP"})
	}
	ipt := func(op string, r []string) error {
		args := append([]string{"netns", "exec", nd.ns, "iptables", "-w", op}, r...)
		out, err := exec.Command("ip", args...).CombinedOutput()
		if err != nil {
			return fmt.Errorf("iptables %s %s: %v: %s", op, strings.Join(r, " "), err, out)
		}
		return nil
	}
	for _, r := range rules {
		if err := ipt("-A", r); err != nil {
			t.Fatal(err)
		}
	}
	done := false
	undo := func() {
		if done {
			return
		}
		done = true
		for _, r := range rules {
			if err := ipt("-D", r); err != nil {
				t.Error(err)
			}
		}
	}
	t.Cleanup(undo)
	return undo
}

// TestFailoverPartition is acceptance 2 of issue 15: the primary of a
// replicas=2 volume is cut off from the other nodes and from etcd while the
// test's client still reaches it (odd cycles: from their etcd ports only, so
// it can still write its copy, whose term fencing must refuse it once the
// copy is promoted). The old primary must acknowledge nothing after its
// lease can have expired (the cut plus one TTL); the other copy is promoted
// at term+1; the client goes on through another node; and a history check
// over the acknowledged-writes log finds every acknowledged write on the new
// primary, each slot holding an intact record written there and no older
// than the last one acknowledged. QUIVER_FAILOVER_PARTITION_CYCLES sets the
// count (default 10).
func TestFailoverPartition(t *testing.T) {
	testfs.RequireTool(t, "iptables")
	cycles := envCount(t, "QUIVER_FAILOVER_PARTITION_CYCLES", 10)
	c := startCluster(t)
	c.waitNodes(c.nodes[0], "n1 n2 n3 up", allUp("n1", "n2", "n3"))
	ttl, err := time.ParseDuration(leaseTTL)
	if err != nil {
		t.Fatal(err)
	}
	var failovers, lastAcks []time.Duration
	for i := range cycles {
		etcdOnly := i%2 == 1
		name := fmt.Sprintf("part%d", i)
		v, exports := c.failoverVolume(t, c.nodes[i%3], name, 2)
		prim, cp := c.byName(v.Primary), c.byName(copyNodes(v)[1])
		w, err := startWriter(context.Background(), c, exports, c.nbdAddrs(prim), 2, 32)
		if err != nil {
			t.Fatal(err)
		}
		if err := w.waitFlushes(10, 60*time.Second); err != nil {
			w.halt()
			t.Fatalf("cycle %d before the cut: %v", i, err)
		}
		heal := c.partition(t, prim, etcdOnly)
		cut := time.Now()
		got := c.waitVolume(t, cp, name, "the copy promoted", func(x api.Volume) bool { return x.Primary == cp.name })
		err = w.waitFlushes(20, 90*time.Second)
		first, _ := w.firstAckAfter(cut)
		last := w.lastAckBefore(cut)
		w.halt()
		if err == nil {
			err = w.err()
		}
		if err != nil {
			t.Fatalf("cycle %d: the client failed: %v", i, err)
		}
		if got.Term != v.Term+1 {
			t.Fatalf("cycle %d: promoted at term %d, want %d", i, got.Term, v.Term+1)
		}
		promoted, ok := promotedAt(cp, name)
		if !ok {
			t.Fatalf("cycle %d: no promotion of %s in %s's log", i, name, cp.name)
		}
		var latest, latestAt time.Duration
		for di, a := range last {
			if a.at.IsZero() {
				continue
			}
			latest, latestAt = max(latest, a.sent.Sub(cut)), max(latestAt, a.at.Sub(cut))
			// The old primary decides to acknowledge when a request is
			// done, and the answer may then wait behind later requests
			// in the NBD server's reply batch: the client can see it
			// late. What it may never do is answer a request that came
			// after its lease can have expired, or after the promotion.
			if !a.sent.Before(promoted) {
				t.Fatalf("cycle %d: disk %d: the cut-off primary %s acknowledged a request sent at %s, after %s was promoted at %s; connections: %v",
					i, di, prim.name, a.sent.UTC().Format("15:04:05.000"), cp.name, promoted.UTC().Format("15:04:05.000"), w.connects(di))
			}
			// Within its lease: one TTL after the cut, plus the time an
			// etcd leader cut off with it may still renew leases (until
			// it steps down, about two election timeouts; docs/cluster.md).
			if a.sent.After(cut.Add(ttl + leaderGrace)) {
				t.Fatalf("cycle %d: disk %d: the cut-off primary %s acknowledged a request sent %v after the cut at %s, past its lease (%v + %v); connections: %v",
					i, di, prim.name, a.sent.Sub(cut), cut.UTC().Format("15:04:05.000"), ttl, leaderGrace, w.connects(di))
			}
		}
		checked, flushed, err := w.check(readImage(t, cp, name))
		if err != nil {
			t.Fatalf("cycle %d: history check on the new primary %s: %v", i, cp.name, err)
		}
		failovers = append(failovers, first.Sub(cut))
		lastAcks = append(lastAcks, latest)
		t.Logf("cycle %d: cut %s off (%s); the last request it acknowledged was sent %v after the cut (lease %v; answer seen at %v), %v before %s's promotion; %s primary at term %d; client acknowledged again %v after the cut; history: %d slots hold their last acknowledged write (%d flushed)",
			i, prim.name, map[bool]string{true: "etcd only", false: "everything but the client"}[etcdOnly],
			latest.Round(time.Millisecond), ttl, latestAt.Round(time.Millisecond), promoted.Sub(cut.Add(latest)).Round(time.Millisecond), cp.name, cp.name, got.Term, first.Sub(cut).Round(time.Millisecond), checked, flushed)
		heal()
		c.waitNodes(cp, "n1 n2 n3 up", allUp("n1", "n2", "n3"))
	}
	t.Logf("partition: last request the old primary acknowledged, sent after the cut by: median %v, at most %v; client's next acknowledgement: median %v",
		median(lastAcks).Round(time.Millisecond), slicesMax(lastAcks).Round(time.Millisecond), median(failovers).Round(time.Millisecond))
}

func slicesMax(ds []time.Duration) time.Duration {
	var m time.Duration
	for _, d := range ds {
		m = max(m, d)
	}
	return m
}

// leaderGrace is how long after a cut an etcd leader on the cut-off side may
// still renew leases: it steps down once it has not heard from a quorum for
// an election timeout (1 s by default), and renews without asking its peers
// while it ticks (etcd's EtcdServer.isActive).
const leaderGrace = 2 * time.Second

// promotedAt finds when nd promoted itself to primary of volume, in its log.
func promotedAt(nd *node, volume string) (time.Time, bool) {
	for _, line := range strings.Split(nd.proc.Log.String(), "\n") {
		if !strings.Contains(line, `msg="promoted to primary`) || !strings.Contains(line, " volume="+volume+" ") {
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
