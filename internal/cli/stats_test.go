package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/quiverstorage/quiver/internal/api"
)

// statsScrape is /metrics of a server run with --metrics-per-disk after n
// steps of a known workload on web01/root: per step 1000 reads of 4096
// bytes (0.5 s of latency in all), 200 writes (2 MB, 1.8 s), 100 trims
// (0.2 s), 10 flushes (0.5 s) and 1.5 s waiting for QoS tokens. web01/data
// stays idle and db/root, another volume, is busy.
func statsScrape(n float64) string { return statsVolumeScrape(n) + statsDiskScrape(n) }

// statsVolumeScrape is the per-volume part of statsScrape: all a server
// exports by default.
func statsVolumeScrape(n float64) string {
	var b strings.Builder
	series := func(typ, name string, lines ...string) {
		fmt.Fprintf(&b, "# TYPE %s %s\n", name, typ)
		for _, l := range lines {
			b.WriteString(l + "\n")
		}
	}
	l := func(name, op string, v float64) string {
		if op == "" {
			return fmt.Sprintf(`%s{volume="web01"} %g`, name, v)
		}
		return fmt.Sprintf(`%s{op=%q,volume="web01"} %g`, name, op, v)
	}
	series("counter", metricVolRequests,
		l(metricVolRequests, "read", 1000*n), l(metricVolRequests, "write", 200*n),
		l(metricVolRequests, "trim", 100*n), l(metricVolRequests, "flush", 10*n),
		fmt.Sprintf(`%s{op="read",volume="db"} %g`, metricVolRequests, 7777*n))
	series("counter", metricVolBytes, l(metricVolBytes, "read", 4096*1000*n), l(metricVolBytes, "write", 2e6*n))
	series("counter", metricVolSeconds, l(metricVolSeconds, "read", 0.5*n), l(metricVolSeconds, "write", 1.8*n),
		l(metricVolSeconds, "trim", 0.2*n), l(metricVolSeconds, "flush", 0.5*n))
	series("gauge", metricVolInFlight, l(metricVolInFlight, "", 4))
	series("counter", metricThrottled, l(metricThrottled, "", 1.5*n))
	series("gauge", "quiver_nbd_connections", "quiver_nbd_connections 2")
	return b.String()
}

// statsDiskScrape is the per-disk part of statsScrape.
func statsDiskScrape(n float64) string {
	var b strings.Builder
	series := func(typ, name string, lines ...string) {
		fmt.Fprintf(&b, "# TYPE %s %s\n", name, typ)
		for _, l := range lines {
			b.WriteString(l + "\n")
		}
	}
	l := func(name, disk, op string, v float64) string {
		if op == "" {
			return fmt.Sprintf(`%s{disk=%q,volume="web01"} %g`, name, disk, v)
		}
		return fmt.Sprintf(`%s{disk=%q,op=%q,volume="web01"} %g`, name, disk, op, v)
	}
	series("counter", metricRequests,
		l(metricRequests, "root", "read", 1000*n), l(metricRequests, "root", "write", 200*n),
		l(metricRequests, "root", "trim", 100*n), l(metricRequests, "root", "flush", 10*n),
		l(metricRequests, "data", "read", 0),
		fmt.Sprintf(`%s{disk="root",op="read",volume="db"} %g`, metricRequests, 7777*n))
	series("counter", metricBytes,
		l(metricBytes, "root", "read", 4096*1000*n), l(metricBytes, "root", "write", 2e6*n),
		l(metricBytes, "root", "trim", 0), l(metricBytes, "data", "read", 0))
	const h = "quiver_disk_request_duration_seconds"
	var hist []string
	for _, s := range []struct {
		op       string
		sum, cnt float64
	}{{"read", 0.5, 1000}, {"write", 1.8, 200}, {"trim", 0.2, 100}, {"flush", 0.5, 10}} {
		hist = append(hist,
			fmt.Sprintf(`%s_bucket{disk="root",op=%q,volume="web01",le="+Inf"} %g`, h, s.op, s.cnt*n),
			l(h+"_sum", "root", s.op, s.sum*n), l(h+"_count", "root", s.op, s.cnt*n))
	}
	series("histogram", h, hist...)
	series("gauge", metricInFlight, l(metricInFlight, "root", "", 4), l(metricInFlight, "data", "", 0))
	return b.String()
}

// statsAPI serves web01 and, on each scrape, the next of scrapes (the last
// one again once they run out).
func statsAPI(t *testing.T, scrapes ...string) (*fakeAPI, string) {
	f, url := newFakeAPI(t)
	v := testVolumes[0]
	v.QoS = &api.QoS{RWIOPS: 500}
	f.reply("GET /v1/volumes/web01", 200, v)
	var mu sync.Mutex
	f.routes["GET /metrics"] = func(w http.ResponseWriter, _ *http.Request) {
		mu.Lock()
		body := scrapes[0]
		if len(scrapes) > 1 {
			scrapes = scrapes[1:]
		}
		mu.Unlock()
		w.Header().Set("Content-Type", "text/plain; version=0.0.4")
		fmt.Fprint(w, body)
	}
	return f, url
}

// runStats runs `volume stats` with a clock that advances 2 s per reading.
func runStats(t *testing.T, url string, redraw bool, args ...string) result {
	t.Helper()
	var stdout, stderr bytes.Buffer
	clock := testNow
	code := Execute(context.Background(), append([]string{"--server", url, "volume", "stats"}, args...), Env{
		Stdout: &stdout, Stderr: &stderr, Redraw: redraw,
		Now: func() time.Time { clock = clock.Add(2 * time.Second); return clock },
	})
	return result{code: code, stdout: stdout.String(), stderr: stderr.String()}
}

// statsWant is the table of one interval of statsScrape: 500 reads and 150
// writes (write + trim) a second, 2.048 MB/s read, 1 MB/s written, mean
// latencies 0.5 ms and 2 s / 300, throttled 1.5 s of 3 s (for the whole
// volume: QoS has one budget per volume).
func statsWant(at time.Time) string {
	return "web01   qos rw-iops=500   2.0s to " + at.Local().Format("15:04:05") + "\n" +
		"DISK    READ IOPS   WRITE IOPS   READ MB/S   WRITE MB/S   READ LAT   WRITE LAT   IN FLIGHT   THROTTLED\n" +
		"root    500         150          2.0         1.0          500µs      6.7ms       4           0%\n" +
		"data    0           0            0.0         0.0          -          -           0           0%\n" +
		"total   500         150          2.0         1.0          500µs      6.7ms       4           50%\n"
}

func TestVolumeStatsTables(t *testing.T) {
	first, second := statsWant(testNow.Add(4*time.Second)), statsWant(testNow.Add(6*time.Second))
	tests := []struct {
		name   string
		redraw bool
		want   string
	}{
		{"a new table per interval", false, first + "\n" + second},
		// Five lines up, clear to the end of the screen, draw again.
		{"redraw on a terminal", true, first + "\x1b[5A\x1b[J" + second},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f, url := statsAPI(t, statsScrape(0), statsScrape(1), statsScrape(2))
			got := runStats(t, url, tt.redraw, "web01", "--interval", "1ms", "--count", "2")
			if got.code != 0 || got.stdout != tt.want {
				t.Fatalf("exit %d, stderr %q, stdout:\n%q\nwant:\n%q", got.code, got.stderr, got.stdout, tt.want)
			}
			if n := strings.Count(strings.Join(f.requests, "\n"), "GET /metrics"); n != 3 {
				t.Fatalf("%d scrapes, want 3: %v", n, f.requests)
			}
		})
	}
}

// TestVolumeStatsPerVolume: from a server that exports metrics per volume
// only (the default), the table has the volume's line alone.
func TestVolumeStatsPerVolume(t *testing.T) {
	_, url := statsAPI(t, statsVolumeScrape(0), statsVolumeScrape(1))
	got := runStats(t, url, false, "web01", "--interval", "1ms", "--count", "1")
	want := "web01   qos rw-iops=500   2.0s to " + testNow.Add(4*time.Second).Local().Format("15:04:05") + "\n" +
		"DISK    READ IOPS   WRITE IOPS   READ MB/S   WRITE MB/S   READ LAT   WRITE LAT   IN FLIGHT   THROTTLED\n" +
		"total   500         150          2.0         1.0          500µs      6.7ms       4           50%\n"
	if got.code != 0 || got.stdout != want {
		t.Fatalf("exit %d, stderr %q, stdout:\n%q\nwant:\n%q", got.code, got.stderr, got.stdout, want)
	}
}

func TestVolumeStatsJSON(t *testing.T) {
	// The third scrape went back to zero: the server restarted, and the
	// counters grew by their new values, which are zero.
	_, url := statsAPI(t, statsScrape(3), statsScrape(4), statsScrape(0))
	got := runStats(t, url, true, "web01", "--interval", "1ms", "--count", "2", "-o", "json")
	if got.code != 0 {
		t.Fatalf("exit %d: %s", got.code, got.stderr)
	}
	lines := strings.Split(strings.TrimSpace(got.stdout), "\n")
	if len(lines) != 2 {
		t.Fatalf("want one JSON object per line, got:\n%s", got.stdout)
	}
	var s [2]volumeStats
	for i, l := range lines {
		if err := json.Unmarshal([]byte(l), &s[i]); err != nil {
			t.Fatalf("line %d: %v\n%s", i, err, l)
		}
	}
	tot := s[0].Total
	if s[0].Volume != "web01" || s[0].Interval != 2 || s[0].QoS.RWIOPS != 500 || len(s[0].Disks) != 2 ||
		tot.ReadIOPS != 500 || tot.WriteIOPS != 150 || tot.ReadMBps != 2.048 || tot.WriteMBps != 1 ||
		tot.ReadLatency != 0.0005 || tot.InFlight != 4 || tot.Throttled != 0.5 {
		t.Errorf("first interval: %+v", s[0])
	}
	if r := s[1].Total; r.ReadIOPS != 0 || r.WriteIOPS != 0 || r.Throttled != 0 || r.ReadLatency != 0 {
		t.Errorf("after a counter reset: %+v", s[1].Total)
	}
}

func TestVolumeStatsUnknownVolume(t *testing.T) {
	f, url := newFakeAPI(t)
	got := runStats(t, url, false, "nope", "--count", "1")
	if got.code != ExitError || !strings.Contains(got.stderr, "error: no route GET /v1/volumes/nope") {
		t.Fatalf("exit %d, stderr %q", got.code, got.stderr)
	}
	if f.sent("GET /metrics") {
		t.Fatal("scraped metrics of an unknown volume")
	}
}

func TestVolumeStatsStopsOnInterrupt(t *testing.T) {
	_, url := statsAPI(t, statsScrape(0))
	ctx, cancel := context.WithCancel(context.Background())
	var stdout, stderr bytes.Buffer
	done := make(chan int)
	go func() {
		done <- Execute(ctx, []string{"--server", url, "volume", "stats", "web01", "--interval", "1h"},
			Env{Stdout: &stdout, Stderr: &stderr})
	}()
	cancel()
	select {
	case code := <-done:
		if code != ExitOK && code != ExitInterrupted {
			t.Fatalf("exit %d, stderr %q", code, stderr.String())
		}
	case <-time.After(10 * time.Second):
		t.Fatal("stats did not stop on interrupt")
	}
}

// TestVolumeStatsOnCluster: asked through a node that is not the volume's
// primary, `volume stats` scrapes the primary (the node list's address,
// the same token): the node asked forwards the volume's I/O and counts
// none of it.
func TestVolumeStatsOnCluster(t *testing.T) {
	prim, primURL := statsAPI(t, statsScrape(0), statsScrape(1))
	asked, url := newFakeAPI(t)
	v := testVolumes[0]
	v.QoS = &api.QoS{RWIOPS: 500}
	v.Primary = "n2"
	asked.reply("GET /v1/volumes/web01", 200, v)
	asked.reply("GET /v1/nodes", 200, api.List[api.Node]{Items: []api.Node{
		{Name: "n1", Address: strings.TrimPrefix(url, "http://"), State: api.NodeUp, Self: true},
		{Name: "n2", Address: strings.TrimPrefix(primURL, "http://"), State: api.NodeUp},
	}})
	asked.routes["GET /metrics"] = func(w http.ResponseWriter, _ *http.Request) {
		fmt.Fprint(w, "# TYPE quiver_nbd_connections gauge\nquiver_nbd_connections 0\n")
	}
	got := runStats(t, url, false, "web01", "--interval", "1ms", "--count", "1")
	if got.code != 0 || got.stdout != statsWant(testNow.Add(4*time.Second)) {
		t.Fatalf("exit %d, stderr %q, stdout:\n%q", got.code, got.stderr, got.stdout)
	}
	if asked.sent("GET /metrics") || !prim.sent("GET /metrics") {
		t.Fatalf("scraped the node asked (%v), not the primary (%v)", asked.requests, prim.requests)
	}

	// The primary down: no node counts the volume's I/O; say so.
	asked.reply("GET /v1/nodes", 200, api.List[api.Node]{Items: []api.Node{
		{Name: "n1", Address: strings.TrimPrefix(url, "http://"), State: api.NodeUp, Self: true},
		{Name: "n2", State: api.NodeDown},
	}})
	got = runStats(t, url, false, "web01", "--interval", "1ms", "--count", "1")
	if got.code != ExitError || !strings.Contains(got.stderr, "its primary n2 is down") {
		t.Fatalf("primary down: exit %d, stderr %q", got.code, got.stderr)
	}
}
