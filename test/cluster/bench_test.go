package clustertest

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/quiverstorage/quiver/internal/api"
	"github.com/quiverstorage/quiver/internal/testfs"
)

// TestBenchCluster is the cluster benchmark of issue 15 (acceptance 8, make
// bench-cluster): it measures and prints, and asserts only that each part
// ran. It runs only with QUIVER_BENCH=1, on the three-node namespace setup
// of the other tests:
//
//   - a replicas=2 and a replicas=1 volume (one disk each of QUIVER_BENCH_SIZE_MIB,
//     default 256, written whole once before measuring) on the same
//     nodes, driven side by side by fio's nbd engine from the hub namespace
//     (test/bench/nbdrun, one fio job per run) on their primaries: 4 KiB
//     random writes at QD1 and QD32 and 1 MiB writes at QD8, the two volumes
//     taking turns in each round, the order swapped every round
//     (QUIVER_BENCH_ROUNDS, default 3, of QUIVER_BENCH_RUNTIME seconds, default
//     10); the CPU time counted is that of the three node processes;
//   - resync throughput: a new replicas=2 volume of one disk
//     (QUIVER_BENCH_RESYNC_SIZE_MIB, default 1024), its copy node killed,
//     fio writing 64 KiB blocks at random over the disk for
//     QUIVER_BENCH_RESYNC_WRITE (default 15 s), then the node restarted:
//     the bytes the primary copied (quiver_cluster_resync_bytes_total) over
//     the time from the copy's first state after degraded to in-sync;
//   - failover time: QUIVER_BENCH_KILLS (default 5) cycles of
//     TestFailoverKill's killing the primary (killCycle): the time from the
//     SIGKILL to the client's first acknowledged write, median.
//
// QUIVER_BENCH_PROFILE=<dir>: the nodes serve /debug/pprof (--pprof), and
// in the last round each run of the replicas=2 volume is profiled on its
// primary and its copy (files in dir, top functions in the log).
func TestBenchCluster(t *testing.T) {
	if os.Getenv("QUIVER_BENCH") == "" {
		t.Skip("benchmark: run with QUIVER_BENCH=1 (make bench-cluster)")
	}
	testfs.RequireTool(t, "fio")
	size := int64(envCount(t, "QUIVER_BENCH_SIZE_MIB", 256)) * mib
	rounds := envCount(t, "QUIVER_BENCH_ROUNDS", 3)
	secs := envCount(t, "QUIVER_BENCH_RUNTIME", 10)
	kills := envCount(t, "QUIVER_BENCH_KILLS", 5)
	resyncWrite := envDuration(t, "QUIVER_BENCH_RESYNC_WRITE", 15*time.Second)
	resyncSize := int64(envCount(t, "QUIVER_BENCH_RESYNC_SIZE_MIB", 1024)) * mib

	nbdrun := filepath.Join(t.TempDir(), "nbdrun")
	if out, err := exec.Command("go", "build", "-o", nbdrun, "../bench/nbdrun").CombinedOutput(); err != nil {
		t.Fatalf("build nbdrun: %v\n%s", err, out)
	}
	load := readLoad()
	profDir := os.Getenv("QUIVER_BENCH_PROFILE")
	c := startClusterWith(t, func(_ int, nd *node) {
		if profDir != "" {
			nd.args = append(nd.args, "--pprof")
		}
	})
	c.waitNodes(c.nodes[0], "n1 n2 n3 up", allUp("n1", "n2", "n3"))
	var pids []string
	for _, nd := range c.nodes {
		pids = append(pids, strconv.Itoa(nd.proc.PID()))
	}

	// Both volumes on the same primary: the replicated one first, then the
	// unreplicated one made again until it lands on that node (placement
	// picks among nodes of equal free space: the pools share a filesystem).
	kinds := []string{"replicas=2", "replicas=1"}
	uris, prims, vols := map[string]string{}, map[string]*node{}, map[string]api.Volume{}
	for _, kind := range []string{"replicas=2", "replicas=1"} {
		name := "b" + strings.TrimPrefix(kind, "replicas=")
		r, _ := strconv.Atoi(strings.TrimPrefix(kind, "replicas="))
		uri, v := c.benchVolume(t, name, r, size, vols["replicas=2"].Primary)
		uris[kind], prims[kind], vols[kind] = uri, c.byName(v.Primary), v
		t.Logf("%s: volume %s, copies %s", kind, name, formatCopies(v))
		c.fio(t, "--name=fill", "--ioengine=nbd", "--uri="+uri, "--rw=write", "--bs=1m", "--iodepth=8",
			fmt.Sprintf("--size=%d", size))
	}

	results := filepath.Join(t.TempDir(), "results.tsv")
	inner := map[string][]insideRun{}
	var innerKeys []string
	cases := [][3]string{{"randwrite", "4k", "1"}, {"randwrite", "4k", "32"}, {"write", "1m", "8"}}
	for _, cs := range cases {
		for round := range rounds {
			for j := range kinds {
				kind := kinds[(j+round)%len(kinds)]
				var prof func()
				if profDir != "" && kind == "replicas=2" && round == rounds-1 {
					prof = c.profile(t, profDir, strings.Join(cs[:], "-"), secs-1, prims[kind], c.byName(copyNodes(vols[kind])[1]))
				}
				cmd := exec.Command("ip", "netns", "exec", c.net.Hub, nbdrun, "run", "-out", results, "-kind", kind,
					"-transport", "tcp", "-pid", strings.Join(pids, ","), "-target", uris[kind], "-rw", cs[0], "-bs", cs[1],
					"-qd", cs[2], "-runtime", strconv.Itoa(secs), "-size", strconv.FormatInt(size, 10))
				m0 := c.inside(t, prims[kind], "b"+strings.TrimPrefix(kind, "replicas="))
				out, err := cmd.CombinedOutput()
				if err != nil {
					t.Fatalf("nbdrun: %v\n%s", err, out)
				}
				in := c.inside(t, prims[kind], "b"+strings.TrimPrefix(kind, "replicas=")).minus(m0)
				in.replicated = kind == "replicas=2"
				key := fmt.Sprintf("%s %s QD%s | %s", cs[0], cs[1], cs[2], kind)
				if _, ok := inner[key]; !ok {
					innerKeys = append(innerKeys, key)
				}
				inner[key] = append(inner[key], in)
				t.Logf("%s; on the primary: %s", strings.TrimSpace(string(out)), in)
				if prof != nil {
					prof()
				}
			}
		}
	}

	rate, copied, took, total := c.benchResync(t, resyncSize, resyncWrite)

	var failovers []time.Duration
	for i := range kills {
		failovers = append(failovers, c.killCycle(t, i, "primary").gap)
	}

	report, err := exec.Command(nbdrun, "report", "-ref", "replicas=2", results).CombinedOutput()
	if err != nil {
		t.Fatalf("nbdrun report: %v\n%s", err, report)
	}
	var b strings.Builder
	fmt.Fprintf(&b, "\ncluster benchmark: 3 nodes (netns, embedded etcd), %d cores, fio %s, quiver %s, %d s per run, %d rounds, "+
		"disk %d MiB on %s, load average %s at the start and %s at the end\n", runtime.NumCPU(), fioVersion(), gitDescribe(),
		secs, rounds, size/mib, fsType(c.dir), load, readLoad())
	b.Write(report)
	fmt.Fprintf(&b, "\nInside the primary, medians of the runs: writes to its own image (quiver_volume_request_seconds_total, "+
		"below the replication), their mean time and mean number in flight (their time summed over the run's wall time); "+
		"the copy's answers to forwarded writes and flushes (quiver_cluster_replication_latency_seconds), the same:\n\n")
	fmt.Fprintf(&b, "| case | volume | local writes | mean µs | in flight | copy answers | mean µs | in flight |\n|---|---|---|---|---|---|---|---|\n")
	for _, k := range innerKeys {
		fmt.Fprintf(&b, "| %s | %s |\n", k, medianInside(inner[k]))
	}
	fmt.Fprintf(&b, "\nGoals (replicas=2 over replicas=1, medians of IOPS or MB/s):\n\n")
	med := medians(t, results)
	for _, g := range []struct {
		key  string
		goal float64
	}{{"randwrite\t4k\t1", 0}, {"randwrite\t4k\t32", 0.7}, {"write\t1m\t8", 0.8}} {
		r2, r1 := med["replicas=2\t"+g.key], med["replicas=1\t"+g.key]
		ratio := r2 / r1
		goal := "no goal"
		if g.goal > 0 {
			goal = fmt.Sprintf("goal >= %.1fx: %s", g.goal, verdict(ratio >= g.goal))
		}
		fmt.Fprintf(&b, "- %s: %.2fx (%s)\n", strings.ReplaceAll(g.key, "\t", " "), ratio, goal)
	}
	m := median(failovers)
	fmt.Fprintf(&b, "- failover, SIGKILL of the primary to the client's first acknowledged write: median %v of %d (goal < 10 s: %s), all %v\n",
		m.Round(time.Millisecond), len(failovers), verdict(m < 10*time.Second), roundAll(failovers))
	fmt.Fprintf(&b, "- resync of a copy that was down under writes (%v of 64 KiB random writes over %d MiB): %.0f MB/s "+
		"(%.1f MiB copied in %v from the first resyncing state seen to in-sync; %v from the node's restart; resync rate unlimited)\n",
		resyncWrite, resyncSize/mib, rate/1e6, copied/mib, took.Round(time.Millisecond), total.Round(time.Millisecond))
	t.Log(b.String())
}

// benchVolume makes a volume of one disk "disk" of size with replicas
// copies; if on is not empty, it makes it again (up to 20 times) until its
// primary is on. It attaches it on its primary and returns the disk's NBD
// URI there.
func (c *cluster) benchVolume(t *testing.T, name string, replicas int, size int64, on string) (string, api.Volume) {
	t.Helper()
	ctx := context.Background()
	var v api.Volume
	for try := 0; ; try++ {
		var err error
		v, err = c.nodes[0].api().CreateVolume(ctx, api.VolumeSpec{Name: name, Capacity: size, Replicas: replicas,
			Disks: []api.DiskSpec{{Name: "disk", Size: size}}})
		if err != nil {
			t.Fatal(err)
		}
		if on == "" || v.Primary == on || try == 20 {
			break
		}
		if _, err := c.nodes[0].api().DeleteVolume(ctx, name); err != nil {
			t.Fatal(err)
		}
	}
	prim := c.byName(v.Primary)
	att, err := prim.api().Attach(ctx, name, api.AttachmentSpec{Node: "bench"})
	if err != nil {
		t.Fatal(err)
	}
	return fmt.Sprintf("nbd://%s:10809/%s/disk/%s", prim.ip, name, att.Token), v
}

// profile starts taking a CPU profile of secs seconds of each of nodes
// (their --pprof endpoint) and returns a function that waits for them,
// writes them to dir as <name>-<node>.pprof and logs their top functions.
func (c *cluster) profile(t *testing.T, dir, name string, secs int, nodes ...*node) func() {
	t.Helper()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	hc := &http.Client{Transport: &http.Transport{DialContext: c.net.Dial}}
	errs := make(chan error, len(nodes))
	for _, nd := range nodes {
		go func() {
			req, err := http.NewRequest("GET", fmt.Sprintf("http://%s:7480/debug/pprof/profile?seconds=%d", nd.ip, secs), nil)
			if err != nil {
				errs <- err
				return
			}
			req.Header.Set("Authorization", "Bearer "+apiToken)
			resp, err := hc.Do(req)
			if err != nil {
				errs <- err
				return
			}
			defer resp.Body.Close()
			body, err := io.ReadAll(resp.Body)
			if err == nil && resp.StatusCode != http.StatusOK {
				err = fmt.Errorf("profile of %s: %s: %s", nd.name, resp.Status, body)
			}
			if err == nil {
				err = os.WriteFile(filepath.Join(dir, name+"-"+nd.name+".pprof"), body, 0o644)
			}
			errs <- err
		}()
	}
	return func() {
		for range nodes {
			if err := <-errs; err != nil {
				t.Fatal(err)
			}
		}
		for _, nd := range nodes {
			f := filepath.Join(dir, name+"-"+nd.name+".pprof")
			out, err := exec.Command("go", "tool", "pprof", "-top", "-nodecount=25", f).CombinedOutput()
			if err != nil {
				t.Fatalf("go tool pprof %s: %v\n%s", f, err, out)
			}
			t.Logf("CPU profile of %s during %s (%s):\n%s", nd.name, name, f, out)
		}
	}
}

// insideRun is what a primary's metrics say of one run (deltas), or their
// totals at a moment.
type insideRun struct {
	at                   time.Time
	writes, writeSeconds float64 // quiver_volume_requests_total, quiver_volume_request_seconds_total of op write
	copies, copySeconds  float64 // quiver_cluster_replication_latency_seconds: count, sum
	wall                 float64 // seconds (deltas only)
	replicated           bool    // copies, copySeconds are this volume's (the metric is the node's)
}

// inside reads the totals of volume (of one disk) on its primary nd.
func (c *cluster) inside(t *testing.T, nd *node, volume string) insideRun {
	t.Helper()
	m, err := metricsOf(c, nd)
	if err != nil {
		t.Fatal(err)
	}
	match := map[string]string{"volume": volume, "op": "write"}
	return insideRun{at: time.Now(),
		writes:       m.Sum("quiver_volume_requests_total", match),
		writeSeconds: m.Sum("quiver_volume_request_seconds_total", match),
		copies:       m.Sum("quiver_cluster_replication_latency_seconds_count", nil),
		copySeconds:  m.Sum("quiver_cluster_replication_latency_seconds_sum", nil)}
}

func (r insideRun) minus(o insideRun) insideRun {
	return insideRun{writes: r.writes - o.writes, writeSeconds: r.writeSeconds - o.writeSeconds,
		copies: r.copies - o.copies, copySeconds: r.copySeconds - o.copySeconds, wall: r.at.Sub(o.at).Seconds()}
}

func (r insideRun) cols() [6]float64 {
	var c [6]float64
	c[0] = r.writes
	if r.writes > 0 {
		c[1] = r.writeSeconds / r.writes * 1e6
	}
	c[2] = r.writeSeconds / r.wall
	c[3] = r.copies
	if r.copies > 0 {
		c[4] = r.copySeconds / r.copies * 1e6
	}
	c[5] = r.copySeconds / r.wall
	return c
}

func (r insideRun) String() string {
	c := r.cols()
	if !r.replicated {
		return fmt.Sprintf("%.0f local writes, mean %.0f µs, %.1f in flight", c[0], c[1], c[2])
	}
	return fmt.Sprintf("%.0f local writes, mean %.0f µs, %.1f in flight; %.0f copy answers, mean %.0f µs, %.1f in flight",
		c[0], c[1], c[2], c[3], c[4], c[5])
}

// medianInside formats the median of each column of runs.
func medianInside(runs []insideRun) string {
	var out []string
	for i, f := range []string{"%.0f", "%.0f", "%.1f", "%.0f", "%.0f", "%.1f"} {
		var v []float64
		for _, r := range runs {
			v = append(v, r.cols()[i])
		}
		slices.Sort(v)
		m := v[len(v)/2]
		if len(v)%2 == 0 {
			m = (v[len(v)/2-1] + v[len(v)/2]) / 2
		}
		if i >= 3 && !runs[0].replicated {
			out = append(out, "-")
			continue
		}
		out = append(out, fmt.Sprintf(f, m))
	}
	return strings.Join(out, " | ")
}

// fio runs fio with args in the hub namespace.
func (c *cluster) fio(t *testing.T, args ...string) {
	t.Helper()
	if out, err := exec.Command("ip", append([]string{"netns", "exec", c.net.Hub, "fio"}, args...)...).CombinedOutput(); err != nil {
		t.Fatalf("fio %v: %v\n%s", args[0], err, out)
	}
}

// benchResync makes a replicas=2 volume of one disk of size, kills its
// copy node, writes 64 KiB blocks at random over the disk for write (fio),
// restarts the node and measures the resync: the bytes the primary copied
// (quiver_cluster_resync_bytes_total) over the time from the first state
// of the copy other than degraded (polled every 20 ms from the restart on)
// to in-sync. It also returns the time from the restart to in-sync.
func (c *cluster) benchResync(t *testing.T, size int64, write time.Duration) (rate, copied float64, took, total time.Duration) {
	t.Helper()
	ctx := context.Background()
	uri, v := c.benchVolume(t, "rs", 2, size, "")
	prim, cp := c.byName(v.Primary), c.byName(copyNodes(v)[1])
	cp.proc.Kill()
	c.fio(t, "--name=degraded", "--ioengine=nbd", "--uri="+uri, "--rw=randwrite", "--bs=64k", "--iodepth=8",
		fmt.Sprintf("--size=%d", size), "--time_based", fmt.Sprintf("--runtime=%d", int(write.Seconds())))
	st, _, err := copyState(ctx, prim, "rs", cp.name)
	if err != nil || st.State != api.CopyDegraded {
		t.Fatalf("copy on %s after the writes: %+v (%v)", cp.name, st, err)
	}
	before := scrapeSum(t, c, prim, "quiver_cluster_resync_bytes_total")
	restart := time.Now()
	c.spawn(cp)
	var start time.Time
	var seen []string
	deadline := time.Now().Add(10 * time.Minute)
	for {
		st, _, err := copyState(ctx, prim, "rs", cp.name)
		now := time.Now()
		if err == nil && (len(seen) == 0 || seen[len(seen)-1] != st.State) {
			seen = append(seen, st.State)
		}
		if err == nil && st.State != api.CopyDegraded && start.IsZero() {
			start = now
		}
		if err == nil && st.State == api.CopyInSync {
			took, total = now.Sub(start), now.Sub(restart)
			break
		}
		if now.After(deadline) {
			t.Fatalf("copy on %s not in sync after 10 minutes: %+v (%v)", cp.name, st, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	c.waitReady(cp)
	copied = scrapeSum(t, c, prim, "quiver_cluster_resync_bytes_total") - before
	if copied <= 0 || took <= 0 {
		t.Fatalf("resync copied %.0f bytes in %v (states %v)", copied, took, seen)
	}
	t.Logf("resync of rs on %s: %.0f bytes in %v, %v after the restart; states %v", cp.name, copied, took, total, seen)
	return copied / took.Seconds(), copied, took, total
}

// medians reads nbdrun's results file: the median throughput (IOPS for 4k,
// bytes per second otherwise) by kind and case (kind, rw, bs, qd).
func medians(t *testing.T, path string) map[string]float64 {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	runs := map[string][]float64{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fl := strings.Split(sc.Text(), "\t") // kind transport rw bs qd iops bw ...
		if len(fl) < 7 {
			t.Fatalf("%s: %q", path, sc.Text())
		}
		col := 5
		if fl[3] != "4k" {
			col = 6
		}
		x, err := strconv.ParseFloat(fl[col], 64)
		if err != nil {
			t.Fatal(err)
		}
		k := strings.Join([]string{fl[0], fl[2], fl[3], fl[4]}, "\t")
		runs[k] = append(runs[k], x)
	}
	out := map[string]float64{}
	for k, v := range runs {
		slices.Sort(v)
		if n := len(v); n%2 == 1 {
			out[k] = v[n/2]
		} else {
			out[k] = (v[n/2-1] + v[n/2]) / 2
		}
	}
	return out
}

func verdict(ok bool) string {
	if ok {
		return "met"
	}
	return "MISSED"
}

func roundAll(ds []time.Duration) []time.Duration {
	out := make([]time.Duration, len(ds))
	for i, d := range ds {
		out[i] = d.Round(time.Millisecond)
	}
	return out
}

func readLoad() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	f := strings.Fields(string(b))
	return strings.Join(f[:3], " ")
}

func fioVersion() string {
	out, _ := exec.Command("fio", "--version").Output()
	return strings.TrimSpace(string(out))
}

func gitDescribe() string {
	out, _ := exec.Command("git", "describe", "--always", "--dirty").Output()
	return strings.TrimSpace(string(out))
}

func fsType(dir string) string {
	out, _ := exec.Command("findmnt", "-n", "-o", "FSTYPE", "--target", dir).Output()
	return strings.TrimSpace(string(out))
}
