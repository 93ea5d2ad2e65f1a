package security

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/quiverstorage/quiver/internal/api"
	"github.com/quiverstorage/quiver/internal/client"
	"github.com/quiverstorage/quiver/internal/testfs"
	"github.com/quiverstorage/quiver/internal/testserver"
)

// Bounds on the server's resident memory, documented in docs/security.md
// ("Findings and tests"). Under the connection flood the server holds at
// most --api-max-conns and --nbd-max-conns connections, a few KiB each;
// under unread 32 MiB READs it holds at most --nbd-max-bytes (1 GiB) of
// replies, here 2 peers of --nbd-max-peer-bytes (256 MiB) each.
const (
	floodRSSBound    = 512 << 20
	readsRSSBound    = 1<<30 + 256<<20
	returnedRSSBound = 256 << 20 // after the readers left
)

// TestAbuse floods a server in a network namespace of its own: the test
// binary re-executes itself there (ip netns exec), so the tens of thousands
// of connections use a loopback of their own, and again for each flooder
// process (flood.go).
func TestAbuse(t *testing.T) {
	if os.Getenv(childBinEnv) != "" {
		abuse(t)
		return
	}
	testfs.RequireRoot(t)
	testfs.RequireTool(t, "ip")
	testfs.RequireTool(t, "prlimit")
	ns := fmt.Sprintf("quiver-abuse-%d", os.Getpid())
	if out, err := exec.Command("ip", "netns", "add", ns).CombinedOutput(); err != nil {
		testfs.SkipOrFail(t, "ip netns add: %v: %s", err, out)
	}
	t.Cleanup(func() {
		if out, err := exec.Command("ip", "netns", "del", ns).CombinedOutput(); err != nil {
			t.Errorf("ip netns del %s: %v: %s", ns, err, out)
		}
	})
	if out, err := exec.Command("ip", "-n", ns, "link", "set", "lo", "up").CombinedOutput(); err != nil {
		t.Fatalf("ip link set lo up: %v: %s", err, out)
	}
	cmd := exec.Command("ip", "netns", "exec", ns, os.Args[0], "-test.run=^TestAbuse$", "-test.v", "-test.count=1",
		"-test.timeout=4m")
	// The server is built without the race detector whatever the tests
	// use: its shadow memory would make the RSS bounds meaningless, and
	// other tests race-check the same code.
	bin := filepath.Join(t.TempDir(), "quiver")
	if err := testserver.Build(bin, false); err != nil {
		t.Fatal(err)
	}
	cmd.Env = append(os.Environ(), childBinEnv+"="+bin)
	out, err := cmd.CombinedOutput()
	t.Logf("inside netns %s:\n%s", ns, out)
	if err != nil {
		t.Fatalf("TestAbuse in the namespace: %v", err)
	}
}

// abuse runs inside the namespace.
func abuse(t *testing.T) {
	srv := testserver.StartT(t, quiverBin, testserver.Options{NBDTCP: true, Token: testToken})
	ctx := context.Background()
	if _, err := srv.API.CreateVolume(ctx, api.VolumeSpec{Name: "vm", Capacity: 1 << 30,
		Disks: []api.DiskSpec{{Name: "root", Size: 512 << 20}}}); err != nil {
		t.Fatal(err)
	}
	rw, err := srv.API.Attach(ctx, "vm", api.AttachmentSpec{Node: "good", Mode: "rw"})
	if err != nil {
		t.Fatal(err)
	}
	ro, err := srv.API.Attach(ctx, "vm", api.AttachmentSpec{Node: "greedy", Mode: "ro"})
	if err != nil {
		t.Fatal(err)
	}
	g := newGoodClient(t, srv, "vm/root/"+rw.Token)
	base := rss(t, srv.PID())
	t.Logf("RSS at rest: %d MiB", base>>20)

	t.Run("connection flood", func(t *testing.T) {
		_, apiPort, _ := net.SplitHostPort(srv.APIAddr)
		_, nbdPort, _ := net.SplitHostPort(srv.NBDAddr)
		// Each flooder is a process of its own with its own descriptors:
		// 20,000 idle API connections from 5 addresses, 2,000 NBD
		// connections that never send a byte from 4.
		var floods []*flooder
		for _, f := range []struct {
			port          string
			first, n, per int
		}{{apiPort, 2, 3, 4000}, {apiPort, 5, 2, 4000}, {nbdPort, 50, 4, 500}} {
			floods = append(floods, startFlooder(t, "127.0.0.1:"+f.port, f.first, f.n, f.per))
		}
		stats := g.runWhile(t, func() bool {
			for _, f := range floods {
				f.wait(t)
			}
			return true
		}, 4*time.Second, srv.PID())
		for _, f := range floods {
			f.stop()
		}
		stats.report(t, "under the connection flood")
		if stats.maxRSS > floodRSSBound {
			t.Errorf("RSS %d MiB under the flood, want at most %d MiB", stats.maxRSS>>20, floodRSSBound>>20)
		}
		expectRejected(t, srv, "api", "peer")
		expectRejected(t, srv, "nbd", "handshakes")
	})

	t.Run("unread 32 MiB READs", func(t *testing.T) {
		var greedy []*nbdConn
		for _, src := range addrs(100, 2) {
			for range 8 {
				c, err := nbdOpen(src, srv.NBDAddr, "vm/root/"+ro.Token, 5*time.Second)
				if err != nil {
					t.Fatal(err)
				}
				greedy = append(greedy, c)
			}
		}
		var wg sync.WaitGroup
		for _, c := range greedy {
			_ = c.nc.(*net.TCPConn).SetReadBuffer(64 << 10)
			wg.Go(func() {
				for i := range 40 {
					if c.send(0, uint64(i%15)<<25, 32<<20, nil) != nil {
						return
					}
				}
			})
		}
		stats := g.runWhile(t, nil, 6*time.Second, srv.PID())
		stats.report(t, "beside 16 connections with 40 unread 32 MiB READs each")
		if stats.maxRSS > readsRSSBound {
			t.Errorf("RSS %d MiB with unread READs, want at most %d MiB", stats.maxRSS>>20, readsRSSBound>>20)
		}
		expectRejected(t, srv, "nbd_memory", "peer")
		for _, c := range greedy {
			_ = c.Close()
		}
		wg.Wait()
		deadline := time.Now().Add(20 * time.Second)
		for {
			r := rss(t, srv.PID())
			if r <= returnedRSSBound {
				t.Logf("RSS %d MiB after the readers left (peak %d MiB)", r>>20, stats.maxRSS>>20)
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("RSS still %d MiB 20 s after the readers left, want at most %d MiB", r>>20, returnedRSSBound>>20)
			}
			time.Sleep(250 * time.Millisecond)
		}
	})

	t.Run("out of file descriptors", func(t *testing.T) {
		// A second server that may open 200 files: the flood runs it out
		// of descriptors (EMFILE) before the connection limits bind.
		small := testserver.StartT(t, quiverBin, testserver.Options{NBDTCP: true, Token: testToken})
		if out, err := exec.Command("prlimit", "--pid", strconv.Itoa(small.PID()), "--nofile=200:200").CombinedOutput(); err != nil {
			testfs.SkipOrFail(t, "prlimit: %v: %s", err, out)
		}
		var held []net.Conn
		for _, addr := range []string{small.APIAddr, small.NBDAddr} {
			for _, src := range addrs(150, 4) {
				for range 60 {
					if c, err := dialFrom(src, addr, time.Second); err == nil {
						held = append(held, c)
					}
				}
			}
		}
		time.Sleep(time.Second) // let the server hit the limit
		select {
		case <-small.Exited():
			t.Fatalf("the server exited when out of file descriptors:\n%s", testserver.Tail(small.Log.String(), 20))
		default:
		}
		for _, c := range held {
			_ = c.Close()
		}
		expectRejected(t, small, "api", "fds")
		// And it serves again.
		if _, err := small.API.Pool(ctx); err != nil {
			t.Fatalf("API after the descriptors came back: %v", err)
		}
		if _, err := small.API.CreateVolume(ctx, api.VolumeSpec{Name: "v", Capacity: 1 << 20,
			Disks: []api.DiskSpec{{Name: "disk", Size: 1 << 20}}}); err != nil {
			t.Fatal(err)
		}
		a, err := small.API.Attach(ctx, "v", api.AttachmentSpec{Node: "n", Mode: "rw"})
		if err != nil {
			t.Fatal(err)
		}
		c, err := nbdOpen("", small.NBDAddr, "v/disk/"+a.Token, 5*time.Second)
		if err != nil {
			t.Fatalf("NBD after the descriptors came back: %v", err)
		}
		defer c.Close()
		if err := c.readAt(make([]byte, 4096), 0, 5*time.Second); err != nil {
			t.Fatal(err)
		}
	})
}

// addrs returns n loopback addresses from 127.0.0.<first>.
func addrs(first, n int) []string {
	var out []string
	for i := range n {
		out = append(out, "127.0.0."+strconv.Itoa(first+i))
	}
	return out
}

// goodClient is a client with the token: it reads known data over one NBD
// connection, opens a fresh NBD connection now and then, and calls the API
// on a fresh connection each time.
type goodClient struct {
	srv    *testserver.Process
	export string
	nbd    *nbdConn
	api    *client.Client
	data   []byte // what the first 64 MiB of the disk hold
}

func newGoodClient(t *testing.T, srv *testserver.Process, export string) *goodClient {
	t.Helper()
	hc := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	c, err := client.New("http://"+srv.APIAddr, client.WithToken(testToken), client.WithHTTPClient(hc))
	if err != nil {
		t.Fatal(err)
	}
	g := &goodClient{srv: srv, export: export, api: c, data: make([]byte, 64<<20)}
	for i := range g.data {
		g.data[i] = byte(i*7 + i>>12)
	}
	if g.nbd, err = nbdOpen("127.0.0.1", srv.NBDAddr, export, 5*time.Second); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = g.nbd.Close() })
	for off := 0; off < len(g.data); off += 1 << 20 {
		if err := g.nbd.writeAt(g.data[off:off+1<<20], uint64(off), 10*time.Second); err != nil {
			t.Fatal(err)
		}
	}
	return g
}

// round is one unit of the good client's work: an API call on a new
// connection, a 1 MiB READ checked against the data, and every fifth round
// a new NBD connection with its own READ.
func (g *goodClient) round(i int, slowest *[3]time.Duration) error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	t0 := time.Now()
	if _, err := g.api.GetVolume(ctx, "vm"); err != nil {
		return fmt.Errorf("API: %w", err)
	}
	t1 := time.Now()
	off := rand.IntN(63) << 20
	buf := make([]byte, 1<<20)
	if err := g.nbd.readAt(buf, uint64(off), 10*time.Second); err != nil {
		return fmt.Errorf("NBD READ: %w", err)
	}
	t2 := time.Now()
	slowest[0], slowest[1] = max(slowest[0], t1.Sub(t0)), max(slowest[1], t2.Sub(t1))
	if !bytes.Equal(buf, g.data[off:off+1<<20]) {
		return fmt.Errorf("NBD READ at %d: wrong data", off)
	}
	if i%5 == 0 {
		defer func(t3 time.Time) { slowest[2] = max(slowest[2], time.Since(t3)) }(time.Now())
		c, err := nbdOpen("127.0.0.1", g.srv.NBDAddr, g.export, 10*time.Second)
		if err != nil {
			return fmt.Errorf("new NBD connection: %w", err)
		}
		defer c.Close()
		if err := c.readAt(buf[:4096], uint64(off), 10*time.Second); err != nil {
			return fmt.Errorf("READ on a new NBD connection: %w", err)
		}
	}
	return nil
}

type roundStats struct {
	slowest [3]time.Duration // API call, READ, new NBD connection
	lat     []time.Duration
	errs    []error
	maxRSS  int64
}

// runWhile runs rounds until done (when not nil) has returned and at least
// min has passed, sampling the server's RSS.
func (g *goodClient) runWhile(t *testing.T, done func() bool, least time.Duration, pid int) roundStats {
	var finished atomic.Bool
	if done == nil {
		finished.Store(true)
	} else {
		go func() { done(); finished.Store(true) }()
	}
	var s roundStats
	start := time.Now()
	for i := 0; !finished.Load() || time.Since(start) < least; i++ {
		t0 := time.Now()
		if err := g.round(i, &s.slowest); err != nil {
			s.errs = append(s.errs, err)
		}
		s.lat = append(s.lat, time.Since(t0))
		s.maxRSS = max(s.maxRSS, rss(t, pid))
		if time.Since(start) > 60*time.Second {
			t.Fatal("the attack did not end within 60 s")
		}
	}
	return s
}

// report logs the latency percentiles and fails on any failed round. The
// bound on p99 is a liveness check, not a performance target: the 3 s
// greeting timeout (after which stalled handshakes give their slots back)
// plus a SYN lost to a full accept queue under the flood (retransmitted
// after 1 s), with a second to spare for a loaded machine.
func (s roundStats) report(t *testing.T, what string) {
	t.Helper()
	slices.Sort(s.lat)
	p := func(q float64) time.Duration { return s.lat[min(len(s.lat)-1, int(q*float64(len(s.lat))))] }
	t.Logf("%s: %d rounds, p50 %v, p99 %v, max %v (slowest API call %v, READ %v, new NBD connection %v), server RSS peak %d MiB",
		what, len(s.lat), p(0.5), p(0.99), s.lat[len(s.lat)-1], s.slowest[0], s.slowest[1], s.slowest[2], s.maxRSS>>20)
	for _, err := range s.errs {
		t.Errorf("%s: %v", what, err)
	}
	if p(0.99) > 5*time.Second {
		t.Errorf("%s: p99 %v, want under 5 s", what, p(0.99))
	}
}

// rss returns the resident memory of process pid.
func rss(t *testing.T, pid int) int64 {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			kb, _ := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			return kb << 10
		}
	}
	t.Fatal("no VmRSS")
	return 0
}

// expectRejected fails unless the server's metrics count a refusal: kind
// "api" or "nbd" (quiver_connections_rejected_total) with that reason, or
// "nbd_memory" (quiver_nbd_memory_waits_total) with that scope.
func expectRejected(t *testing.T, p *testserver.Process, kind, reason string) {
	t.Helper()
	hc := &http.Client{Timeout: 10 * time.Second}
	req, _ := http.NewRequest("GET", "http://"+p.APIAddr+"/metrics", nil)
	req.Header.Set("Authorization", "Bearer "+testToken)
	resp, err := hc.Do(req)
	if err != nil {
		t.Errorf("metrics: %v", err)
		return
	}
	defer resp.Body.Close()
	var buf bytes.Buffer
	_, _ = buf.ReadFrom(resp.Body)
	want := fmt.Sprintf(`quiver_connections_rejected_total{reason="%s",server="%s"}`, reason, kind)
	if kind == "nbd_memory" {
		want = fmt.Sprintf(`quiver_nbd_memory_waits_total{scope="%s"}`, reason)
	}
	for _, line := range strings.Split(buf.String(), "\n") {
		if v, ok := strings.CutPrefix(line, want+" "); ok {
			if n, _ := strconv.ParseFloat(v, 64); n > 0 {
				t.Logf("%s %s", want, v)
				return
			}
		}
	}
	t.Errorf("metrics count no %s", want)
}
