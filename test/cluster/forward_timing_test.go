package clustertest

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/quiverstorage/quiver/internal/api"
	"github.com/quiverstorage/quiver/internal/forward"
	"github.com/quiverstorage/quiver/internal/nbdclient"
)

// TestRefusalTiming is acceptance 4 of issue 29 (defect 8): on every node
// (the primary, the other copy's, the node without a copy, which forwards
// to the primary), a wrong token for an existing volume and a volume that
// does not exist get the same refusal (reply type and message, the export
// name aside) in the same time. It alternates the two, QUIVER_REFUSAL_TRIES
// times each per node (default 100), and reports the medians. It fails on
// any difference of the refusal, and on a difference of the medians above
// refusalGross; the medians themselves are recorded in docs/cluster.md.
// A client's own hop mark (cluster's OpenHop) on the primary is refused as
// any name of four parts is: the primary does not take it for a node's.
func TestRefusalTiming(t *testing.T) {
	tries := envCount(t, "QUIVER_REFUSAL_TRIES", 100)
	c := startCluster(t)
	c.waitNodes(c.nodes[0], "n1 n2 n3 up", allUp("n1", "n2", "n3"))
	v, exports := c.failoverVolume(t, c.nodes[0], "tv", 1)
	prim, cp := c.byName(v.Primary), c.byName(copyNodes(v)[1])
	roles := map[*node]string{prim: "primary", cp: "copy", c.other(prim, cp): "no copy (forwards)"}
	token := exports[0][len("tv/d0/"):]
	for _, nd := range c.nodes {
		// The right token opens the disk on every node.
		conn, err := nbdclient.Dial(context.Background(), nd.ip+":10809", exports[0],
			nbdclient.Options{Dial: c.net.Dial, Timeout: 30 * time.Second})
		if err != nil {
			t.Fatalf("%s (%s): the attachment's token: %v", nd.name, roles[nd], err)
		}
		conn.Close()
	}
	// A client marks its open as a node's hop: refused like any other
	// name of four parts, not opened (and refused at once) as a node's.
	refusal := func(name string) string {
		_, err := nbdclient.Dial(context.Background(), prim.ip+":10809", name,
			nbdclient.Options{Dial: c.net.Dial, Timeout: 30 * time.Second})
		var r *nbdclient.Refusal
		if !errors.As(err, &r) {
			t.Fatalf("primary: %s: %v, want a refusal", name, err)
		}
		return fmt.Sprintf("%#x %s", r.Reply, r.Message)
	}
	forged := fmt.Sprintf("tv/d0/%s/hop1.%d.%s", randomToken(t), time.Now().Unix(), randomToken(t))
	if got, want := refusal(forged), refusal("tv/d0/"+randomToken(t)+"/x"); got != want {
		t.Errorf("primary: a client's hop mark refused with %q; want as any name of four parts, %q", got, want)
	}
	for _, nd := range c.nodes {
		var wrongs, unknowns []time.Duration
		refusals := map[string]int{}
		for i := range 2 * tries {
			tok := randomToken(t)
			for tok == token {
				tok = randomToken(t)
			}
			volume := "tv"
			if i%2 == 1 {
				volume = "absent"
			}
			start := time.Now()
			_, err := nbdclient.Dial(context.Background(), nd.ip+":10809", volume+"/d0/"+tok,
				nbdclient.Options{Dial: c.net.Dial, Timeout: 120 * time.Second})
			took := time.Since(start)
			var r *nbdclient.Refusal
			if !errors.As(err, &r) {
				t.Fatalf("%s (%s): %s/d0 with a wrong token: %v after %v, want a refusal", nd.name, roles[nd], volume, err,
					took.Round(time.Millisecond))
			}
			msg := strings.ReplaceAll(r.Message, `"`+volume+`/d0/<token>"`, `"<export>"`)
			refusals[fmt.Sprintf("%#x %s", r.Reply, msg)]++
			if volume == "tv" {
				wrongs = append(wrongs, took)
			} else {
				unknowns = append(unknowns, took)
			}
		}
		mw, mu := median(wrongs), median(unknowns)
		t.Logf("%s (%s): a wrong token refused in median %v (at most %v), an unknown volume in median %v (at most %v): difference %v; refusals: %v",
			nd.name, roles[nd], mw.Round(10*time.Microsecond), slicesMax(wrongs).Round(time.Millisecond),
			mu.Round(10*time.Microsecond), slicesMax(unknowns).Round(time.Millisecond),
			(mw - mu).Round(10*time.Microsecond), refusals)
		if len(refusals) != 1 {
			t.Errorf("%s (%s): a wrong token and an unknown volume are refused differently: %v", nd.name, roles[nd], refusals)
		}
		if d := (mw - mu).Abs(); d > refusalGross {
			t.Errorf("%s (%s): the medians differ by %v (wrong token %v, unknown volume %v)", nd.name, roles[nd], d, mw, mu)
		}
	}
}

// refusalGross is the difference of the median refusal times that fails
// TestRefusalTiming, below the 5 ms of acceptance 4. Both refusals are
// held to the same time from the client's open on the node it asked, so
// the medians differ by what the machine varies by (0.2 ms at most in the
// runs of docs/cluster.md); a forwarding node whose primary held its
// refusal too answered a wrong token 3.8 to 6.6 ms later.
const refusalGross = 2 * time.Millisecond

func randomToken(t *testing.T) string {
	b := make([]byte, 32)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(b)
}

// TestForwardedPartition is acceptance 5 of issue 29 (defect 9): a client
// of a replicas=2 volume of four disks writes through the node without a
// copy, which forwards to the primary; the primary is cut off from
// everything (its link to the bridge goes down: etcd, the other nodes and
// the test). Every disk must be acknowledged again once a copy is promoted,
// without waiting for the requests at the old primary to time out
// (2L+10 s), and every acknowledged write must be on the new primary. The
// times are logged; the test fails if a disk's first acknowledgement after
// the cut comes later than L+3 s (acceptance 5) or the history check fails.
func TestForwardedPartition(t *testing.T) {
	c := startCluster(t)
	c.waitNodes(c.nodes[0], "n1 n2 n3 up", allUp("n1", "n2", "n3"))
	ttl, err := time.ParseDuration(leaseTTL)
	if err != nil {
		t.Fatal(err)
	}
	const name, disks = "fp", 4
	v, exports := c.failoverVolume(t, c.nodes[0], name, disks)
	prim, cp := c.byName(v.Primary), c.byName(copyNodes(v)[1])
	fwd := c.other(prim, cp)
	w, err := startForwardedWriter(c, exports, fwd.ip+":10809", 2, 32)
	if err != nil {
		t.Fatal(err)
	}
	defer w.close()
	if err := w.waitFlushes(10, 60*time.Second); err != nil {
		w.halt()
		t.Fatalf("before the cut: %v", err)
	}
	// The etcd leader goes elsewhere first: a new leader extends every
	// lease, so a cut of the leader's node promotes a copy only after
	// about 2L (an etcd matter, not forwarding's: docs/cluster.md).
	if c.etcdLeader(t) == prim {
		c.moveEtcdLeader(t, fwd)
	}
	heal := c.cutLink(t, prim)
	cut := time.Now()
	c.waitVolume(t, cp, name, "the copy promoted", func(x api.Volume) bool { return x.Primary == cp.name })
	err = w.waitFlushes(20, 120*time.Second)
	w.halt()
	if err == nil {
		err = w.err()
	}
	if err != nil {
		t.Fatalf("the client failed: %v", err)
	}
	promoted, ok := promotedAt(cp, name)
	if !ok {
		t.Fatalf("no promotion of %s in %s's log", name, cp.name)
	}
	firsts := w.firstAckPerDisk(cut)
	var latest time.Duration
	for di, at := range firsts {
		if at.IsZero() {
			t.Fatalf("disk %d: no acknowledgement after the cut", di)
		}
		latest = max(latest, at.Sub(cut))
	}
	checked, flushed, err := w.check(readImage(t, cp, name))
	if err != nil {
		t.Fatalf("history check on the new primary %s: %v", cp.name, err)
	}
	var each []string
	for di, at := range firsts {
		each = append(each, fmt.Sprintf("d%d %v", di, at.Sub(cut).Round(time.Millisecond)))
	}
	t.Logf("cut %s off; %s promoted %v after the cut; first acknowledgement through %s after the cut: %s (the last disk %v after the cut, %v after the promotion; L = %v); history: %d slots hold their last acknowledged write (%d flushed)",
		prim.name, cp.name, promoted.Sub(cut).Round(time.Millisecond), fwd.name, strings.Join(each, ", "),
		latest.Round(time.Millisecond), (latest - promoted.Sub(cut)).Round(time.Millisecond), ttl, checked, flushed)
	if latest > ttl+3*time.Second {
		t.Errorf("a disk was acknowledged again %v after the cut, want under L + 3 s = %v", latest.Round(time.Millisecond), ttl+3*time.Second)
	}
	heal()
}

// moveEtcdLeader makes to's etcd member the leader (etcd's MoveLeader,
// through the JSON gateway of the leader of the moment).
func (c *cluster) moveEtcdLeader(t *testing.T, to *node) {
	t.Helper()
	hc := c.etcdHTTP(10 * time.Second)
	post := func(nd *node, path string, in, out any) {
		t.Helper()
		body, _ := json.Marshal(in)
		resp, err := hc.Post(c.etcdURL(nd)+path, "application/json", bytes.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("etcd %s: %s: %s", path, resp.Status, b)
		}
		if out != nil {
			if err := json.Unmarshal(b, out); err != nil {
				t.Fatalf("etcd %s: %v: %s", path, err, b)
			}
		}
	}
	var members struct {
		Members []struct {
			ID   string `json:"ID"`
			Name string `json:"name"`
		} `json:"members"`
	}
	leader := c.etcdLeader(t)
	post(leader, "/v3/cluster/member/list", struct{}{}, &members)
	id := ""
	for _, m := range members.Members {
		if m.Name == to.name {
			id = m.ID
		}
	}
	if id == "" {
		t.Fatalf("no etcd member named %s: %+v", to.name, members)
	}
	post(leader, "/v3/maintenance/transfer-leadership", map[string]string{"targetID": id}, nil)
	for deadline := time.Now().Add(30 * time.Second); c.etcdLeader(t) != to; time.Sleep(100 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("etcd leader still not %s", to.name)
		}
	}
}

// cutLink takes nd's link to the bridge down: nd is cut off from every
// other node, etcd and the test. It returns the undo.
func (c *cluster) cutLink(t *testing.T, nd *node) func() {
	t.Helper()
	host := ""
	for i, o := range c.nodes {
		if o == nd {
			host = c.net.HostLink(i + 1)
		}
	}
	run(t, "ip", "-n", c.net.Hub, "link", "set", host, "down")
	done := false
	undo := func() {
		if !done {
			done = true
			run(t, "ip", "-n", c.net.Hub, "link", "set", host, "up")
		}
	}
	t.Cleanup(undo)
	return undo
}

// startForwardedWriter is startWriter with every disk's connection to the
// one node at addr, and a request timeout (2 min) longer than a forwarding
// node's own (2L+10 s): the client waits for that node's answer rather than
// sending again on a new connection, so that the times measured are the
// forwarding node's.
func startForwardedWriter(c *cluster, exports []string, addr string, workers, slots int) (*writer, error) {
	w := &writer{slots: slots, workers: workers, history: map[[2]int]*slotHistory{}, stop: make(chan struct{})}
	for _, ex := range exports {
		dc := &diskClient{}
		d, err := forward.Open(context.Background(), ex, func(context.Context) (string, error) { return addr, nil },
			forward.Options{Dial: c.net.Dial, RequestTimeout: 2 * time.Minute, RetryFor: 3 * time.Minute,
				DialTimeout: time.Second,
				OnConnect: func(addr string) {
					dc.mu.Lock()
					dc.connects = append(dc.connects, connectEvent{time.Now(), addr})
					dc.mu.Unlock()
				}})
		if err != nil {
			w.close()
			return nil, fmt.Errorf("open %s: %w", redact(ex), err)
		}
		dc.d = d
		w.disks = append(w.disks, dc)
	}
	for di := range w.disks {
		for j := range workers {
			w.wg.Add(1)
			go w.work(di, j)
		}
	}
	return w, nil
}

// firstAckPerDisk is, per disk, the time of its first acknowledgement
// after t (zero: none).
func (w *writer) firstAckPerDisk(t time.Time) []time.Time {
	w.mu.Lock()
	defer w.mu.Unlock()
	out := make([]time.Time, len(w.disks))
	for _, a := range w.acks {
		if a.at.After(t) && out[a.disk].IsZero() {
			out[a.disk] = a.at
		}
	}
	return out
}
