package drtest

import (
	"encoding/json"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/quiverstorage/quiver/internal/api"
	"github.com/quiverstorage/quiver/internal/testfs"
	"github.com/quiverstorage/quiver/internal/testserver"
)

// link is a TCP relay on loopback to addr that can be cut: while down it
// closes every connection, new and open.
type link struct {
	ln   net.Listener
	to   atomic.Pointer[string] // where it relays to (set before use)
	down atomic.Bool
	// rate, when set, bounds what goes to the target (bytes a second);
	// sent counts it.
	rate, sent atomic.Int64
	mu         sync.Mutex
	open       []net.Conn
}

// relay copies from c to up, at most l.rate bytes a second when set.
func (l *link) relay(up, c net.Conn) {
	defer up.Close()
	buf := make([]byte, 32<<10)
	for {
		n, err := c.Read(buf)
		if n > 0 {
			if _, werr := up.Write(buf[:n]); werr != nil {
				return
			}
			l.sent.Add(int64(n))
			if r := l.rate.Load(); r > 0 {
				time.Sleep(time.Duration(int64(n) * int64(time.Second) / r))
			}
		}
		if err != nil {
			return
		}
	}
}

func newLink(t *testing.T, addr string) *link {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	l := &link{ln: ln}
	l.to.Store(&addr)
	t.Cleanup(func() { ln.Close(); l.cut() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			if l.down.Load() {
				c.Close()
				continue
			}
			up, err := net.Dial("tcp", *l.to.Load())
			if err != nil {
				c.Close()
				continue
			}
			l.mu.Lock()
			l.open = append(l.open, c, up)
			l.mu.Unlock()
			go l.relay(up, c)
			go func() { _, _ = io.Copy(c, up); c.Close() }()
		}
	}()
	return l
}

func (l *link) cut() {
	l.down.Store(true)
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, c := range l.open {
		c.Close()
	}
	l.open = nil
}

// TestScheduledDR: `quiver dr enable` with an RPO of 10 s ships points by
// itself, the first at once and the next when the last is half the RPO
// old; `quiver dr status` and the metrics show the lag. With the link to
// the target cut, cycles fail, the lag passes the RPO (status and metric
// say so) and the target keeps its last point; with the link back, the
// next cycle catches up and the target's point equals the source's.
func TestScheduledDR(t *testing.T) {
	for _, tool := range []string{"qemu-io", "qemu-img"} {
		testfs.RequireTool(t, tool)
	}
	dir := t.TempDir()
	b := testserver.StartT(t, bin, testserver.Options{Pool: filepath.Join(dir, "b"), NBDTCP: true, Token: tokenB})
	l := newLink(t, b.APIAddr)
	tokFile := filepath.Join(dir, "b.token")
	cfg, _ := json.Marshal(map[string]any{"sites": []map[string]any{{"name": "b", "url": "http://" + l.ln.Addr().String(), "tokenFile": tokFile}}})
	cfgFile := filepath.Join(dir, "dr.json")
	for f, data := range map[string][]byte{tokFile: []byte(tokenB + "\n"), cfgFile: cfg} {
		if err := os.WriteFile(f, data, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	a := testserver.StartT(t, bin, testserver.Options{Pool: filepath.Join(dir, "a"), NBDTCP: true, Args: []string{"--dr-config", cfgFile}})
	run := func(args ...string) (string, error) {
		out, err := exec.Command(bin, args...).CombinedOutput()
		return string(out), err
	}
	onA := func(args ...string) string {
		t.Helper()
		out, err := run(append([]string{"--server", "http://" + a.APIAddr}, args...)...)
		if err != nil {
			t.Fatalf("site A: quiver %s: %v\n%s", strings.Join(args, " "), err, out)
		}
		return out
	}
	onB := func(args ...string) string {
		t.Helper()
		out, err := run(append([]string{"--server", "http://" + b.APIAddr, "--token-file", tokFile}, args...)...)
		if err != nil {
			t.Fatalf("site B: quiver %s: %v\n%s", strings.Join(args, " "), err, out)
		}
		return out
	}
	qemu := func(name string, args ...string) {
		t.Helper()
		if out, err := exec.Command(name, args...).CombinedOutput(); err != nil {
			t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
		}
	}
	onA("volume", "create", "vm", "--capacity", "64Mi", "--disk", "root=16Mi", "--disk", "data=8Mi", "--disk", "logs=4Mi")
	qemu("qemu-io", "-f", "raw", "-c", "write -P 0x11 0 6M", a.URI("vm/root"))
	qemu("qemu-io", "-f", "raw", "-c", "write -P 0x22 1M 2M", a.URI("vm/data"))
	onB("dr", "target", "accept", "db", "vm-dr")

	for _, bad := range []struct {
		args []string
		want string
	}{
		{[]string{"--site", "nowhere", "--relationship", "db", "--rpo", "1m"}, "no such DR site"},
		{[]string{"--site", "b", "--relationship", "db", "--rpo", "1s"}, "between 10s and 24h"},
		{[]string{"--site", "b", "--relationship", "Bad_Name", "--rpo", "1m"}, "relationship"},
	} {
		if out, err := run(append([]string{"--server", "http://" + a.APIAddr, "dr", "enable", "vm"}, bad.args...)...); err == nil ||
			!strings.Contains(out, bad.want) {
			t.Fatalf("dr enable %v: %v\n%s", bad.args, err, out)
		}
	}
	onA("dr", "enable", "vm", "--site", "b", "--relationship", "db", "--rpo", "10s")
	if out := onA("volume", "get", "vm"); !strings.Contains(out, "to b as relationship db, RPO 10s") {
		t.Fatalf("volume get does not show the DR policy:\n%s", out)
	}

	status := func() api.DRStatus {
		t.Helper()
		var list api.List[api.DRStatus]
		if err := json.Unmarshal([]byte(onA("-o", "json", "dr", "status")), &list); err != nil || len(list.Items) != 1 {
			t.Fatalf("dr status: %v %+v", err, list)
		}
		return list.Items[0]
	}
	waitFor := func(what string, limit time.Duration, ok func(api.DRStatus) bool) api.DRStatus {
		t.Helper()
		deadline := time.Now().Add(limit)
		for {
			st := status()
			if ok(st) {
				return st
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: not within %v: %+v", what, limit, st)
			}
			time.Sleep(200 * time.Millisecond)
		}
	}
	metric := func(name string) string {
		t.Helper()
		resp, err := http.Get("http://" + a.APIAddr + "/metrics")
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		for _, line := range strings.Split(string(body), "\n") {
			if strings.HasPrefix(line, name+"{") && strings.Contains(line, `volume="vm"`) {
				return line[strings.LastIndexByte(line, ' ')+1:]
			}
		}
		t.Fatalf("no %s for vm in the metrics", name)
		return ""
	}
	first := waitFor("the first point, at once", 20*time.Second, func(s api.DRStatus) bool { return s.Cycles >= 1 })
	qemu("qemu-io", "-f", "raw", "-c", "write -P 0x33 2M 64k", a.URI("vm/logs"))
	written := time.Now()
	second := waitFor("the next point, at half the RPO", 20*time.Second, func(s api.DRStatus) bool { return s.Cycles >= 2 })
	if !second.LastPointAt.After(written) || second.LastSent == 0 || second.LastSent > 1<<20 || second.Missed {
		t.Fatalf("the second point (the first %+v): %+v, want a small delta taken after the write", first, second)
	}
	if m := metric("quiver_dr_rpo_missed"); m != "0" {
		t.Fatalf("quiver_dr_rpo_missed %s while the RPO holds", m)
	}
	// The alert rules shipped in deploy/ name metrics the server exports.
	rules, err := os.ReadFile("../../deploy/prometheus/quiver-alerts.yaml")
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range regexp.MustCompile(`quiver_dr_[a-z_]+`).FindAllString(string(rules), -1) {
		metric(name)
	}

	// The link cut: the lag passes the RPO, the target keeps its point.
	l.cut()
	qemu("qemu-io", "-f", "raw", "-c", "write -P 0x44 3M 64k", a.URI("vm/root"))
	missed := waitFor("the RPO missed", 30*time.Second, func(s api.DRStatus) bool { return s.Missed && s.Failures >= 1 })
	if missed.LastPoint != second.LastPoint || missed.LastError == "" {
		t.Fatalf("with the link cut: %+v", missed)
	}
	if m := metric("quiver_dr_rpo_missed"); m != "1" {
		t.Fatalf("quiver_dr_rpo_missed %s with the RPO missed", m)
	}
	if out := onA("dr", "status"); !strings.Contains(out, "rpo missed") {
		t.Fatalf("dr status does not say the RPO is missed:\n%s", out)
	}
	if list := onB("dr", "target", "list"); !strings.Contains(list, second.LastPoint) {
		t.Fatalf("site B lost its last point while the link was cut:\n%s", list)
	}

	// The link back: the next try catches up.
	l.down.Store(false)
	back := waitFor("catching up", 20*time.Second, func(s api.DRStatus) bool { return !s.Missed && s.LastError == "" && s.Cycles > second.Cycles })
	var att api.Attachment
	if err := json.Unmarshal([]byte(onB("-o", "json", "attach", "create", "vm-dr", "checker", "--mode", "ro")), &att); err != nil {
		t.Fatal(err)
	}
	for _, d := range []string{"root", "data", "logs"} {
		qemu("qemu-img", "compare", "-f", "raw", "-F", "raw", a.URI("vm@"+back.LastPoint+"/"+d), b.URI("vm-dr@"+back.LastPoint+"/"+d+"/"+att.Token))
	}
	onA("dr", "disable", "vm")
	if out := onA("dr", "status"); strings.Contains(out, "vm") {
		t.Fatalf("dr status after disable:\n%s", out)
	}
}
