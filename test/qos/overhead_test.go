package qosbench

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/quiverstorage/quiver/internal/testserver"

	"github.com/quiverstorage/quiver/internal/metrics"
	"github.com/quiverstorage/quiver/internal/nbd"
	"github.com/quiverstorage/quiver/internal/pool"
	"github.com/quiverstorage/quiver/internal/qos"
	"github.com/quiverstorage/quiver/internal/testfs"
)

// TestQoSOverhead is the benchmark of acceptance criterion 2: what the
// metrics and QoS path costs a volume with no limits. One process serves
// the same disk of one pool through two NBD servers, side by side: "plain"
// exports the disk handle as the pool opens it, "counted" wraps it in
// metrics.Disk with the volume's (unlimited) QoS limiter, as `quiver server`
// does. fio (nbd engine, unix socket) drives each in turn, A/B/A/B/... per
// case to spread drift and the noise of other processes over both, on a
// disk filled beforehand so reads hit data (from the page cache: the
// cheapest I/O, where a per-request cost shows most). It reports, per side,
// throughput and the CPU time the servers' process spent per request.
//
// It measures and prints; it asserts nothing. QUIVER_BENCH=1 runs it (make
// bench-qos); QUIVER_BENCH_RUNTIME sets the seconds per run (default 10),
// QUIVER_BENCH_ROUNDS the runs per case, both sides together (default 6).
func TestQoSOverhead(t *testing.T) {
	if os.Getenv("QUIVER_BENCH") != "1" {
		t.Skip("benchmark: run with QUIVER_BENCH=1 (make bench-qos)")
	}
	if testserver.RaceEnabled {
		t.Skip("benchmark: the race detector would dominate what is measured")
	}
	testfs.RequireTool(t, "fio")
	runtime := time.Duration(envInt(t, "QUIVER_BENCH_RUNTIME", 10)) * time.Second
	rounds := envInt(t, "QUIVER_BENCH_ROUNDS", 6)
	ctx := context.Background()
	p, err := pool.Open(ctx, t.TempDir(), slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	const size = 1 << 30
	if _, _, err := p.Create(ctx, pool.VolumeSpec{Name: "bench", Capacity: size,
		Disks: []pool.DiskSpec{{Name: "disk", Size: size}}}); err != nil {
		t.Fatal(err)
	}
	sockDir, err := os.MkdirTemp("", "qvb")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(sockDir) })
	sides := []struct {
		name string
		uri  string
	}{
		{"plain", serveNBD(t, nbd.PoolExports{Pool: p}, filepath.Join(sockDir, "plain.sock"))},
		{"counted", serveNBD(t, nbd.PoolExports{Pool: p, Metrics: metrics.New(p)}, filepath.Join(sockDir, "counted.sock"))},
	}
	dir := t.TempDir()
	fill := startFio(t, dir, "fill", "--ioengine=nbd", "--uri="+sides[0].uri, "--rw=write", "--bs=1m", "--iodepth=8")
	fill.wait(t)

	cases := []struct{ rw, bs, qd string }{{"randread", "4k", "32"}, {"randread", "4k", "1"}}
	var b strings.Builder
	fmt.Fprintf(&b, "\n%s, %d cores, %v per run (after 1 s of ramp), %d runs per case alternating plain/counted\n\n",
		fioVersion(t), numCPU(), runtime, rounds)
	b.WriteString("| case | plain IOPS: best (median) | counted IOPS: best (median) | ratio of best | " +
		"plain server CPU/request: least (median) | counted server CPU/request: least (median) | ratio of least |\n")
	b.WriteString("|---|---|---|---|---|---|---|\n")
	for _, c := range cases {
		var iops, cpu [2][]float64
		for round := range rounds {
			side := round % 2
			before := cpuTime(t)
			j := startFio(t, dir, fmt.Sprintf("%s-%s-%s-%d", sides[side].name, c.rw, c.qd, round),
				append(nbdArgs(sides[side].uri, runtime), "--ramp_time=1",
					"--rw="+c.rw, "--bs="+c.bs, "--iodepth="+c.qd)...).wait(t)
			used := cpuTime(t) - before
			// The ramp's requests are not in the report but used CPU: count
			// them at the measured rate.
			n := float64(j.Read.IOs+j.Write.IOs) * (runtime + time.Second).Seconds() / runtime.Seconds()
			iops[side] = append(iops[side], j.Read.IOPS+j.Write.IOPS)
			cpu[side] = append(cpu[side], used.Seconds()/n*1e6)
			t.Logf("%s %s %s QD%s: %.0f IOPS, %.1f µs of server CPU per request", sides[side].name, c.rw, c.bs, c.qd,
				iops[side][len(iops[side])-1], cpu[side][len(cpu[side])-1])
		}
		// Other processes only ever take throughput and add CPU time
		// (cache misses), so the best run of each side is the one least
		// disturbed; the medians show how disturbed the rest were.
		ia, ib := slices.Max(iops[0]), slices.Max(iops[1])
		ca, cb := slices.Min(cpu[0]), slices.Min(cpu[1])
		fmt.Fprintf(&b, "| %s %s QD%s | %.0f (%.0f) | %.0f (%.0f) | %.3f | %.1f µs (%.1f) | %.1f µs (%.1f) | %.3f |\n",
			c.rw, c.bs, c.qd, ia, median(iops[0]), ib, median(iops[1]), ib/ia,
			ca, median(cpu[0]), cb, median(cpu[1]), cb/ca)
	}
	fmt.Print(b.String())
}

// serveNBD serves exports on a unix socket until the test ends and returns
// the URI of the benchmark's disk.
func serveNBD(t *testing.T, exports nbd.Exports, socket string) string {
	t.Helper()
	ln, err := nbd.ListenUnix(socket)
	if err != nil {
		t.Fatal(err)
	}
	srv := nbd.NewServer(exports, nbd.Config{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	go srv.Serve(ln)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = srv.Shutdown(ctx)
	})
	return "nbd+unix:///bench/disk?socket=" + socket
}

func median(xs []float64) float64 {
	s := slices.Sorted(slices.Values(xs))
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// envInt reads a positive integer from the environment, def when unset.
func envInt(t *testing.T, name string, def int) int {
	s := os.Getenv(name)
	if s == "" {
		return def
	}
	n, err := strconv.Atoi(s)
	if err != nil || n <= 0 {
		t.Fatalf("%s=%q: want a positive integer", name, s)
	}
	return n
}

// cpuTime is the CPU time (user and system) this process used so far: the
// NBD servers', as fio runs in processes of its own.
func cpuTime(t *testing.T) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		t.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkDiskPath is the per-request cost of the wrapper alone, without
// NBD or a client, for 4 KiB reads through: the disk handle as the pool
// opens it ("plain"); that handle wrapped by metrics with the volume's
// unlimited limiter ("counted"); and wrapped with limits so high that no
// request ever waits ("limited": the token buckets are consulted). Under
// "pread" the handle reads from the page cache; under "nop" it is a handle
// that does nothing, so the difference to "plain" is the wrapper's own cost
// without the noise of a system call. Compare it with the server CPU per
// request of TestQoSOverhead.
//
//	go test ./test/qos/ -run '^$' -bench DiskPath -count 5
func BenchmarkDiskPath(b *testing.B) {
	ctx := context.Background()
	p, err := pool.Open(ctx, b.TempDir(), slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		b.Fatal(err)
	}
	defer p.Close()
	const size = 64 << 20
	for _, name := range []string{"plain", "limited"} {
		spec := pool.VolumeSpec{Name: name, Capacity: size, Disks: []pool.DiskSpec{{Name: "disk", Size: size}}}
		if name == "limited" {
			spec.QoS = qos.Limits{RWIOPS: qos.MaxLimit, RWMBytes: qos.MaxLimit}
		}
		if _, _, err := p.Create(ctx, spec); err != nil {
			b.Fatal(err)
		}
	}
	m := metrics.New(p)
	limiter := func(volume string) *qos.Limiter {
		v, err := p.Volume(volume)
		if err != nil {
			b.Fatal(err)
		}
		return v.QoS()
	}
	v, err := p.Volume("plain")
	if err != nil {
		b.Fatal(err)
	}
	file, err := v.OpenDisk("disk")
	if err != nil {
		b.Fatal(err)
	}
	defer file.Close()
	if err := file.WriteAt(make([]byte, size), 0, false); err != nil {
		b.Fatal(err)
	}
	for _, inner := range []struct {
		name string
		disk pool.Disk
	}{{"pread", file}, {"nop", nopDisk{}}} {
		for _, c := range []struct {
			name string
			disk pool.Disk
		}{
			{"plain", inner.disk},
			{"counted", m.Wrap(inner.disk, inner.name, "counted", limiter("plain"))},
			{"limited", m.Wrap(inner.disk, inner.name, "limited", limiter("limited"))},
		} {
			b.Run(inner.name+"/"+c.name, func(b *testing.B) {
				buf := make([]byte, 4096)
				b.ReportAllocs()
				var off int64
				for b.Loop() {
					if err := c.disk.ReadAt(buf, off); err != nil {
						b.Fatal(err)
					}
					off = (off + 4096*7919) % size
				}
			})
		}
	}
}

// nopDisk is a disk handle whose reads do nothing.
type nopDisk struct{ pool.Disk }

func (nopDisk) ReadAt([]byte, int64) error      { return nil }
func (nopDisk) Capabilities() pool.Capabilities { return pool.Capabilities{} }
