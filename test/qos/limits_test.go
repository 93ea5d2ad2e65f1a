package qosbench

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/quiverstorage/quiver/internal/api"
	"github.com/quiverstorage/quiver/internal/cli"
	"github.com/quiverstorage/quiver/internal/testfs"
)

// The bounds of these tests are the behaviour the issue asks of QoS: a
// volume limited to a rate is measured close to that rate by its client.
// They are not thresholds on quiver's speed: unlimited, the same workloads
// run many times faster (make bench-nbd), and the limiter only ever slows
// requests down, so a loaded machine cannot push a rate above its limit
// (plus one burst over the run). Short runs carry the burst and the start-up
// over fewer seconds, hence their looser bounds.

// rateMode is how long a rate is measured and how far from the limit it may
// be.
type rateMode struct {
	runtime time.Duration
	slack   float64 // allowed deviation, as a fraction of the limit
}

// mode is the full acceptance run with QUIVER_QOS_FULL=1 (30 s, ±10 %),
// else the short one CI runs (6 s, ±20 %).
func mode() rateMode {
	if os.Getenv("QUIVER_QOS_FULL") == "1" {
		return rateMode{runtime: 30 * time.Second, slack: 0.10}
	}
	return rateMode{runtime: 6 * time.Second, slack: 0.20}
}

// check fails the test unless got, measured over a run of length over, is
// within the slack of limit.
func (m rateMode) check(t *testing.T, what string, got, limit float64, over time.Duration) {
	t.Helper()
	lo, hi := limit*(1-m.slack), limit*(1+m.slack)
	if got < lo || got > hi {
		t.Errorf("%s = %.1f over %v, want %.0f..%.0f (limit %.0f)", what, got, over, lo, hi, limit)
		return
	}
	t.Logf("%s = %.1f over %v (limit %.0f, bounds %.0f..%.0f)", what, got, over, limit, lo, hi)
}

// TestRWIOPSLimitAcrossDisks is acceptance criterion 1a: rw_iops=500 is one
// budget for the whole VM, so two fio processes on its two disks (4k random
// read/write, QD32 each) get 500 IOPS between them. While they run, `quiver
// volume stats` must see the same rate in the server's metrics.
func TestRWIOPSLimitAcrossDisks(t *testing.T) {
	testfs.RequireTool(t, "fio")
	m := mode()
	s := startServer(t, "--metrics-per-disk") // to see both disks busy before measuring
	s.createVolume(t, "vm", &api.QoS{RWIOPS: 500}, disk("root", 256*miB), disk("data", 256*miB))
	dir := t.TempDir()
	var runs []*fioRun
	for _, d := range []string{"root", "data"} {
		runs = append(runs, startFio(t, dir, d, append(nbdArgs(s.uri("vm", d), m.runtime),
			"--rw=randrw", "--bs=4k", "--iodepth=32")...))
	}
	// Watch once both fio processes are running: they take a moment to
	// start and connect, more than a second on a loaded machine.
	waitBusy(t, s, "vm", "root", "data")
	time.Sleep(500 * time.Millisecond)
	stats := watchStats(t, s, "vm", time.Second, 3)
	var total float64
	var ios int64
	for _, r := range runs {
		j := r.wait(t)
		t.Logf("fio on %s: %.1f read + %.1f write IOPS", j.Name, j.Read.IOPS, j.Write.IOPS)
		total += j.Read.IOPS + j.Write.IOPS
		ios += j.Read.IOs + j.Write.IOs
	}
	m.check(t, "total IOPS of both fio processes", total, 500, m.runtime)

	var seen float64
	for _, st := range stats(t) {
		t.Logf("volume stats: %.1f read + %.1f write IOPS over %.2fs, throttled %.0f%%",
			st.Total.ReadIOPS, st.Total.WriteIOPS, st.Interval, 100*st.Total.Throttled)
		seen += (st.Total.ReadIOPS + st.Total.WriteIOPS) / 3
	}
	m.check(t, "total IOPS `quiver volume stats` saw", seen, 500, 3*time.Second)

	met := waitIdle(t, s)
	counted := met.Sum("quiver_volume_requests_total", map[string]string{"volume": "vm", "op": "read"}) +
		met.Sum("quiver_volume_requests_total", map[string]string{"volume": "vm", "op": "write"})
	if counted != float64(ios) {
		t.Errorf("server counted %v reads and writes, fio did %d", counted, ios)
	}
	if w := met.Sum("quiver_qos_throttled_seconds_total", map[string]string{"volume": "vm"}); w <= 0 {
		t.Errorf("requests to vm never waited for QoS tokens")
	}
}

// TestRWMBytesLimit is acceptance criterion 1b: rw_mbytes=50 holds 1 MiB
// sequential writes on both disks of a VM to 50 MB/s (10^6 bytes) between
// them.
func TestRWMBytesLimit(t *testing.T) {
	testfs.RequireTool(t, "fio")
	m := mode()
	// A run below the limit whose requests hardly waited for QoS tokens says
	// that the clients did not offer the limit's rate (seen in CI at load
	// average 16: 34 MB/s with 1 MiB writes barely throttled), not that the
	// limit held them back: such a run is measured once more, on a new
	// server. A run below the limit with requests that did wait, or any run
	// above it, fails.
	var total float64
	for attempt := 1; ; attempt++ {
		var throttled float64
		total, throttled = rwMBytesRun(t, m)
		lo := 50 * (1 - m.slack)
		if total >= lo || throttled >= 0.25*m.runtime.Seconds() || attempt == 2 {
			break
		}
		t.Logf("attempt %d: %.1f MB/s, below the limit with requests waiting %.2fs for tokens over %v: the clients were slow, measuring again",
			attempt, total, throttled, m.runtime)
	}
	m.check(t, "total MB/s of both fio processes", total, 50, m.runtime)
}

// rwMBytesRun runs TestRWMBytesLimit's fio processes on a new server and
// returns their total MB/s and how long their requests waited for QoS
// tokens (seconds, summed over both disks).
func rwMBytesRun(t *testing.T, m rateMode) (total, throttled float64) {
	s := startServer(t)
	s.createVolume(t, "vm", &api.QoS{RWMBytes: 50}, disk("root", 256*miB), disk("data", 256*miB))
	dir := t.TempDir()
	var runs []*fioRun
	for _, d := range []string{"root", "data"} {
		runs = append(runs, startFio(t, dir, d, append(nbdArgs(s.uri("vm", d), m.runtime),
			"--rw=write", "--bs=1m", "--iodepth=4")...))
	}
	for _, r := range runs {
		j := r.wait(t)
		t.Logf("fio on %s: %.1f MB/s", j.Name, j.Write.BW/1e6)
		total += j.Write.BW / 1e6
	}
	met := waitIdle(t, s)
	throttled = met.Sum("quiver_qos_throttled_seconds_total", map[string]string{"volume": "vm"})
	t.Logf("requests waited %.2fs for QoS tokens", throttled)
	return total, throttled
}

// TestLiveLimitChange is acceptance criterion 1c: fio runs at rw_iops=200,
// the limit is raised to 1000 through the API, and fio's own per-second
// IOPS log must show >= 800 within 2 s of the moment the PATCH returned.
// Before it, the old limit held.
//
// fio logs every 250 ms and the test sums four consecutive windows into a
// one-second rate, so one-second windows end every 250 ms. With windows
// ending only once a second, the one full second after the change could end
// anywhere between +1 s and +2 s; when it ended early and the machine was
// busy for a moment (a loaded CI run: 713 IOPS in the second ending at
// +1.4 s, 1009 in the next) the test failed although the limit had changed
// at once.
//
// The rate after the change also needs a machine that can do 1000 IOPS
// through fio at that moment: on a loaded 2-core machine fio itself stalls
// now and then (its log then misses windows: seen for a whole second, with
// the rounds before it right on the line of an immediate change). A round
// that misses the rate is run again, at most three in all; each round must
// hold the old limit, and the test fails if no round reaches the new one.
func TestLiveLimitChange(t *testing.T) {
	testfs.RequireTool(t, "fio")
	const rounds = 3
	for round := 1; ; round++ {
		reached := liveLimitRound(t, round)
		if t.Failed() || reached {
			return
		}
		if round == rounds {
			t.Fatalf("no per-second rate >= 800 IOPS within 2 s after the limit went from 200 to 1000, in %d rounds", rounds)
		}
		t.Logf("round %d: no per-second rate >= 800 IOPS within 2 s of the change; again", round)
	}
}

// liveLimitRound runs one round of TestLiveLimitChange on a fresh server
// and reports whether fio reached 800 IOPS within 2 s of the change.
func liveLimitRound(t *testing.T, round int) bool {
	s := startServer(t)
	s.createVolume(t, "vm", &api.QoS{RWIOPS: 200}, disk("root", 256*miB))
	dir := t.TempDir()
	logPrefix := filepath.Join(dir, "live")
	run := startFio(t, dir, "live", append(nbdArgs(s.uri("vm", "root"), 8*time.Second),
		"--rw=randrw", "--bs=4k", "--iodepth=32",
		"--write_iops_log="+logPrefix, "--log_avg_msec=250", "--log_unix_epoch=1")...)
	time.Sleep(3500 * time.Millisecond)
	changed := s.setQoS(t, "vm", api.QoS{RWIOPS: 1000})
	run.wait(t)
	samples := perSecond(readIOPSLog(t, logPrefix+"_iops.1.log"), 4)
	var before, reached int
	for _, smp := range samples {
		since := smp.end.Sub(changed)
		t.Logf("round %d: %+6dms after the change: %4.0f IOPS", round, since.Milliseconds(), smp.iops)
		switch {
		case since <= 0:
			before++
			// 200 a second, plus the burst (20) in the first window.
			if smp.iops > 200*1.3 {
				t.Errorf("%.0f IOPS %v before the change, above the limit of 200", smp.iops, -since)
			}
		case since <= 2*time.Second && smp.iops >= 800:
			reached++
		}
	}
	if before == 0 {
		t.Fatalf("fio logged no rate before the change: %+v", samples)
	}
	return reached > 0
}

// watchStats runs `quiver volume stats NAME -o json` with the CLI for count
// intervals, in the background; the returned function waits for it and
// decodes its output.
func watchStats(t *testing.T, s *server, volume string, interval time.Duration, count int) func(*testing.T) []cliStats {
	var stdout, stderr bytes.Buffer
	done := make(chan int, 1)
	go func() {
		done <- cli.Execute(context.Background(), []string{"--server", s.apiURL, "volume", "stats", volume,
			"--interval", interval.String(), "--count", itoa(count), "-o", "json"},
			cli.Env{Stdout: &stdout, Stderr: &stderr})
	}()
	return func(t *testing.T) []cliStats {
		t.Helper()
		if code := <-done; code != cli.ExitOK {
			t.Fatalf("quiver volume stats: exit %d: %s", code, stderr.String())
		}
		var out []cliStats
		for _, line := range strings.Split(strings.TrimSpace(stdout.String()), "\n") {
			var st cliStats
			if err := json.Unmarshal([]byte(line), &st); err != nil {
				t.Fatalf("quiver volume stats: %v in %q", err, line)
			}
			out = append(out, st)
		}
		if len(out) != count {
			t.Fatalf("quiver volume stats printed %d intervals, want %d:\n%s", len(out), count, stdout.String())
		}
		return out
	}
}

// cliStats is the part of one line of `quiver volume stats -o json` read here.
type cliStats struct {
	Interval float64 `json:"intervalSeconds"`
	Total    struct {
		ReadIOPS  float64 `json:"readIOPS"`
		WriteIOPS float64 `json:"writeIOPS"`
		Throttled float64 `json:"throttled"`
	} `json:"total"`
}
