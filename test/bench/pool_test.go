package bench

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/quiverstorage/quiver/internal/fscap"
	"github.com/quiverstorage/quiver/internal/pool"
	"github.com/quiverstorage/quiver/internal/testfs"
)

const (
	mib = int64(1) << 20
	gib = int64(1) << 30
)

type report struct {
	rows [][]string
}

func (r *report) add(cols ...string) { r.rows = append(r.rows, cols) }

func (r *report) print(w io.Writer, title string) {
	fmt.Fprintf(w, "\n### %s\n\n", title)
	for i, row := range r.rows {
		fmt.Fprintf(w, "| %s |\n", strings.Join(row, " | "))
		if i == 0 {
			fmt.Fprintf(w, "|%s\n", strings.Repeat("---|", len(row)))
		}
	}
}

func ms(d time.Duration) string { return fmt.Sprintf("%.1f ms", float64(d.Microseconds())/1000) }

func ratio(a, b time.Duration) string { return fmt.Sprintf("%.3fx", float64(a)/float64(b)) }

func verdict(ok bool) string {
	if ok {
		return "met"
	}
	return "MISSED"
}

func requireBench(t *testing.T) {
	if os.Getenv("QUIVER_BENCH") == "" {
		t.Skip("benchmark: run with QUIVER_BENCH=1 (make bench)")
	}
}

func quietLog() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// TestPoolBenchmark measures the core issue's targets on XFS with reflink:
// whole-VM snapshot time and gate hold time (fresh and after 100k random 4k
// writes per disk) against cp --sparse=always and cp --reflink=always of the
// same files; 500 clones of a 3-disk golden volume against cp
// --reflink=always of the same files; and server start on 1,000 volumes.
func TestPoolBenchmark(t *testing.T) {
	requireBench(t)
	testfs.RequireTool(t, "cp")
	mnt := testfs.MountXFS(t, 24*gib)
	ctx := context.Background()
	p, err := pool.Open(ctx, filepath.Join(mnt, "pool"), quietLog())
	if err != nil {
		t.Fatal(err)
	}
	disks := []pool.DiskSpec{{Name: "root", Size: 4 * gib}, {Name: "data", Size: 4 * gib}, {Name: "logs", Size: 4 * gib}}
	if _, _, err := p.Create(ctx, pool.VolumeSpec{Name: "golden", Capacity: 12 * gib, Disks: disks}); err != nil {
		t.Fatal(err)
	}
	v, _ := p.Volume("golden")
	handles := make([]pool.Disk, len(disks))
	for i, d := range disks {
		if handles[i], err = v.OpenDisk(d.Name); err != nil {
			t.Fatal(err)
		}
		fill(t, handles[i], gib)
	}
	r := &report{}
	r.add("case", "quiver snapshot (median / max)", "gate held (median / max)", "cp --sparse=always", "cp --reflink=always", "quiver / cp --sparse", "target")
	measureSnapshots(t, r, p, v, "3 disks x 1 GiB data, fresh", mnt, "fresh")
	t.Logf("fresh snapshots measured")

	// Bulk clone of the freshly written volume: a golden image.
	c := &report{}
	c.add("case", "quiver", "cp --reflink=always (1,500 files)", "quiver / cp", "target")
	names := make([]string, 500)
	for i := range names {
		names[i] = fmt.Sprintf("vdi-%03d", i+1)
	}
	if _, _, err := v.CreateSnapshot(ctx, "golden-v1", nil); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if _, err := p.Clone(ctx, pool.CloneRequest{Source: pool.Source{Volume: "golden", Snapshot: "golden-v1"}, Names: names}, nil); err != nil {
		t.Fatal(err)
	}
	quiverClones := time.Since(start)
	t.Logf("500 clones in %v", quiverClones)
	cpClones := cpReflinkClones(t, v, mnt, 500)
	c.add("500 clones of a 3-disk golden volume (1 GiB data per disk)", ms(quiverClones), ms(cpClones), ratio(quiverClones, cpClones),
		"< 30 s: "+verdict(quiverClones < 30*time.Second))

	rng := rand.New(rand.NewPCG(1, 2))
	block := make([]byte, 4096)
	for i, h := range handles {
		start := time.Now()
		for range 100_000 {
			off := rng.Int64N(4*gib/4096) * 4096
			fillRandom(rng, block)
			if err := h.WriteAt(block, off, false); err != nil {
				t.Fatal(err)
			}
		}
		if err := h.Flush(); err != nil {
			t.Fatal(err)
		}
		took := time.Since(start)
		f, _ := os.Open(filepath.Join(v.Info().Dir, disks[i].Name+".img"))
		n, _ := fscap.Extents(f)
		_ = f.Close()
		t.Logf("disk %s: %d extents after 100k random 4k writes in %v (%.0f writes/s, first write per 1 MiB chunk after the clones rewrites the chunk)",
			disks[i].Name, n, took.Round(time.Millisecond), 100_000/took.Seconds())
	}
	measureSnapshots(t, r, p, v, "after 100k random 4k writes per disk", mnt, "aged")
	r.print(os.Stdout, "Whole-VM snapshot on XFS (reflink), 3 disks")
	c.print(os.Stdout, "Bulk clone on XFS (reflink)")

	for i := len(p.List(nil)); i < 1000; i++ {
		spec := pool.VolumeSpec{Name: fmt.Sprintf("vm-%04d", i), Capacity: gib, Disks: []pool.DiskSpec{{Name: "disk", Size: gib}}}
		if _, _, err := p.Create(ctx, spec); err != nil {
			t.Fatal(err)
		}
	}
	_ = p.Close()
	s := &report{}
	s.add("case", "quiver server: exec to first answer", "target")
	d := serverStart(t, filepath.Join(mnt, "pool"), 1000)
	s.add("server start on a pool of 1,000 volumes", ms(d), "< 5 s: "+verdict(d < 5*time.Second))
	s.print(os.Stdout, "Server start")
}

func fill(t *testing.T, d pool.Disk, n int64) {
	rng := rand.New(rand.NewPCG(3, 4))
	buf := make([]byte, 4*mib)
	for off := int64(0); off < n; off += int64(len(buf)) {
		fillRandom(rng, buf)
		if err := d.WriteAt(buf, off, false); err != nil {
			t.Fatal(err)
		}
	}
	if err := d.Flush(); err != nil {
		t.Fatal(err)
	}
}

func fillRandom(rng *rand.Rand, b []byte) {
	for i := 0; i+8 <= len(b); i += 8 {
		x := rng.Uint64()
		for j := range 8 {
			b[i+j] = byte(x >> (8 * j))
		}
	}
}

func measureSnapshots(t *testing.T, r *report, p *pool.Pool, v *pool.Volume, label, mnt, tag string) {
	ctx := context.Background()
	var total, held []time.Duration
	for i := range 5 {
		start := time.Now()
		s, _, err := v.CreateSnapshot(ctx, fmt.Sprintf("%s-%d", tag, i), nil)
		if err != nil {
			t.Fatal(err)
		}
		total = append(total, time.Since(start))
		held = append(held, s.GateHeld)
	}
	slices.Sort(total)
	slices.Sort(held)
	sparse := timeCp(t, v, mnt, "--sparse=always")
	reflink := timeCp(t, v, mnt, "--reflink=always")
	ok := total[len(total)-1] < 200*time.Millisecond && held[len(held)-1] < 50*time.Millisecond
	r.add(label, ms(total[2])+" / "+ms(total[4]), ms(held[2])+" / "+ms(held[4]), ms(sparse), ms(reflink),
		ratio(total[2], sparse), "snapshot < 200 ms, gate < 50 ms: "+verdict(ok))
}

// timeCp copies the volume's three images with cp and the given flag, then
// syncs, as a snapshot would be made by hand.
func timeCp(t *testing.T, v *pool.Volume, mnt, flag string) time.Duration {
	dst := filepath.Join(mnt, "cp-"+strings.Trim(flag, "-=")+fmt.Sprint(time.Now().UnixNano()))
	if err := os.Mkdir(dst, 0o755); err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dst)
	var srcs []string
	for _, d := range v.Info().Disks {
		srcs = append(srcs, d.Path)
	}
	start := time.Now()
	args := append([]string{flag}, srcs...)
	if out, err := exec.Command("cp", append(args, dst)...).CombinedOutput(); err != nil {
		t.Fatalf("cp: %v: %s", err, out)
	}
	if out, err := exec.Command("sync", "-f", dst).CombinedOutput(); err != nil {
		t.Fatalf("sync: %v: %s", err, out)
	}
	return time.Since(start)
}

func cpReflinkClones(t *testing.T, v *pool.Volume, mnt string, n int) time.Duration {
	base := filepath.Join(mnt, "cp-clones")
	defer os.RemoveAll(base)
	var srcs []string
	for _, d := range v.Info().Disks {
		srcs = append(srcs, d.Path)
	}
	script := fmt.Sprintf(`set -e; for i in $(seq 1 %d); do mkdir -p %s/$i; cp --reflink=always %s %s/$i/; done; sync -f %s`,
		n, base, strings.Join(srcs, " "), base, mnt)
	start := time.Now()
	if out, err := exec.Command("bash", "-c", script).CombinedOutput(); err != nil {
		t.Fatalf("cp clones: %v: %s", err, out)
	}
	return time.Since(start)
}

// serverStart builds and starts `quiver server` on the pool and returns the
// time from exec until GET /v1/volumes answers with every volume.
func serverStart(t *testing.T, poolDir string, want int) time.Duration {
	bin := filepath.Join(t.TempDir(), "quiver")
	build := exec.Command("go", "build", "-o", bin, "./cmd/quiver")
	build.Dir = "../.."
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build: %v: %s", err, out)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	_ = ln.Close()
	start := time.Now()
	cmd := exec.Command(bin, "server", "--pool", poolDir, "--listen", addr)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
	for time.Since(start) < 60*time.Second {
		resp, err := http.Get("http://" + addr + "/v1/volumes")
		if err == nil {
			body, _ := io.ReadAll(resp.Body)
			_ = resp.Body.Close()
			if resp.StatusCode == 200 {
				if n := strings.Count(string(body), `"uid"`); n != want {
					t.Fatalf("server lists %d volumes, want %d", n, want)
				}
				return time.Since(start)
			}
		}
		time.Sleep(5 * time.Millisecond)
	}
	t.Fatal("server did not answer within 60 s")
	return 0
}
