package clustertest

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/quiverstorage/quiver/internal/api"
	"github.com/quiverstorage/quiver/internal/client"
	"github.com/quiverstorage/quiver/internal/testfs"
)

const (
	mib     = 1 << 20
	granule = 64 << 10 // replica.DefaultGranule, the tracking granule
)

// envDuration reads a duration from the environment (soak runs), or def.
func envDuration(t *testing.T, name string, def time.Duration) time.Duration {
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	d, err := time.ParseDuration(v)
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	return d
}

// qemuWriter writes through the primary's NBD exports with qemu-io (each round:
// a few writes of 4 KiB to 128 KiB at random 4 KiB-aligned offsets on each
// disk, then a flush) and counts the bytes it wrote, as they are and
// rounded up to the tracking granule, write by write.
type qemuWriter struct {
	c     *cluster
	uris  []string
	size  int64
	rng   *rand.Rand
	mu    sync.Mutex
	bytes int64
	span  int64
	err   error
}

func spanOf(off, length int64) int64 {
	return ((off+length-1)/granule - off/granule + 1) * granule
}

func (w *qemuWriter) round() error {
	for _, uri := range w.uris {
		args := []string{"netns", "exec", w.c.net.Hub, "qemu-io", "-f", "raw"}
		var n, sp int64
		for range 4 {
			length := (1 + w.rng.Int64N(32)) * 4096
			off := w.rng.Int64N((w.size-length)/4096) * 4096
			args = append(args, "-c", fmt.Sprintf("write -P %d %d %d", 1+w.rng.IntN(250), off, length))
			n += length
			sp += spanOf(off, length)
		}
		args = append(args, "-c", "flush", uri)
		out, err := exec.Command("ip", args...).CombinedOutput()
		if err != nil || strings.Contains(string(out), "failed") || strings.Contains(string(out), "error") {
			return fmt.Errorf("qemu-io: %v: %s", err, out)
		}
		w.mu.Lock()
		w.bytes += n
		w.span += sp
		w.mu.Unlock()
	}
	return nil
}

// counts returns the bytes written so far and their granule span, and
// starts counting from zero.
func (w *qemuWriter) counts() (bytes, span int64) {
	w.mu.Lock()
	defer w.mu.Unlock()
	b, s := w.bytes, w.span
	w.bytes, w.span = 0, 0
	return b, s
}

// run writes rounds, one every pause, until stop is closed.
func (w *qemuWriter) run(stop <-chan struct{}, pause time.Duration, done chan<- error) {
	for {
		select {
		case <-stop:
			done <- nil
			return
		default:
		}
		if err := w.round(); err != nil {
			done <- err
			return
		}
		select {
		case <-stop:
			done <- nil
			return
		case <-time.After(pause):
		}
	}
}

// diskSum is the SHA-256 of a disk's image in a node's pool.
func diskSum(t *testing.T, nd *node, volume, disk string) string {
	t.Helper()
	f, err := os.Open(filepath.Join(nd.pool, "volumes", volume, "disks", disk+".img"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(h.Sum(nil))
}

// copyState returns the state of nd's copy of volume, as the primary shows
// it, with the volume.
func copyState(ctx context.Context, from *node, volume, copyNode string) (api.Copy, api.Volume, error) {
	v, err := from.api().GetVolume(ctx, volume)
	if err != nil {
		return api.Copy{}, v, err
	}
	for _, c := range v.Copies {
		if c.Node == copyNode {
			return c, v, nil
		}
	}
	return api.Copy{}, v, fmt.Errorf("no copy on %s: %+v", copyNode, v.Copies)
}

// waitInSync polls until the copy is in sync, noting each resync state seen
// (and once the CLI's view of it) on the way.
func (c *cluster) waitInSync(t *testing.T, prim *node, volume, copyNode string, limit time.Duration) (seen []string) {
	t.Helper()
	ctx := context.Background()
	deadline := time.Now().Add(limit)
	shown := false
	for {
		cp, v, err := copyState(ctx, prim, volume, copyNode)
		if err == nil {
			s := cp.State
			if cp.Progress != nil {
				s += fmt.Sprintf(" %.0f%%", *cp.Progress)
				if !shown {
					shown = true
					t.Logf("quiver volume get while resyncing:\n%s", c.cli(prim, "volume", "get", volume))
				}
			}
			if len(seen) == 0 || seen[len(seen)-1] != s {
				seen = append(seen, s)
			}
			if cp.State == api.CopyInSync {
				return seen
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("copy on %s of %s not in sync after %s: states seen %v, last %v (%v)", copyNode, volume, limit, seen,
				formatCopies(v), err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// TestResync is acceptance 3 of issue 15: a copy of a 3-disk, 2-copy volume
// is down for 30 s (QUIVER_RESYNC_DOWN) under writes, then returns while
// the writes go on. The primary resyncs it (state resyncing with its
// progress in `quiver volume get`), copying at most twice the bytes written
// meanwhile rounded up to the 64 KiB granule (quiver_cluster_resync_bytes_total),
// and afterwards the copies of every disk are byte-identical.
func TestResync(t *testing.T) {
	testfs.RequireTool(t, "qemu-io")
	down := envDuration(t, "QUIVER_RESYNC_DOWN", 30*time.Second)
	c := startClusterWith(t, func(_ int, nd *node) {
		// Slow enough that the resyncing state can be seen.
		nd.args = append(nd.args, "--resync-rate", "16Mi")
	})
	ctx := context.Background()
	const diskSize = 64 * mib
	disks := []string{"root", "data", "logs"}
	spec := api.VolumeSpec{Name: "rs", Capacity: 3 * diskSize, Replicas: 2}
	for _, d := range disks {
		spec.Disks = append(spec.Disks, api.DiskSpec{Name: d, Size: diskSize})
	}
	prim, cp, token := c.placeAndAttach(t, spec)
	w := &qemuWriter{c: c, size: diskSize, rng: rand.New(rand.NewPCG(15, 3))}
	for _, d := range disks {
		uri := fmt.Sprintf("nbd://%s:10809/rs/%s/%s", prim.ip, d, token)
		w.uris = append(w.uris, uri)
		c.qemuIO(t, uri, "write -P 0x5a 0 8M", "flush")
	}

	cp.proc.Kill()
	start := time.Now()
	stop, done := make(chan struct{}), make(chan error, 1)
	go w.run(stop, 500*time.Millisecond, done)
	stopped := false
	defer func() {
		if !stopped {
			close(stop)
			<-done
		}
	}()
	for time.Since(start) < down {
		time.Sleep(200 * time.Millisecond)
		select {
		case err := <-done:
			t.Fatalf("writer while the copy is down: %v", err)
		default:
		}
	}
	st, _, err := copyState(ctx, prim, "rs", cp.name)
	if err != nil || st.State != api.CopyDegraded {
		t.Fatalf("copy on %s after %s down: %+v (%v)", cp.name, down, st, err)
	}
	before := scrapeSum(t, c, prim, "quiver_cluster_resync_bytes_total")
	downBytes, downSpan := w.counts()
	c.spawn(cp)
	c.waitReady(cp)
	// Writes go on while the copy comes back and is resynced.
	seen := c.waitInSync(t, prim, "rs", cp.name, 3*time.Minute)
	written, span := w.counts()
	written, span = written+downBytes, span+downSpan
	close(stop)
	stopped = true
	if err := <-done; err != nil {
		t.Fatalf("writer during the resync: %v", err)
	}
	copied := scrapeSum(t, c, prim, "quiver_cluster_resync_bytes_total") - before
	t.Logf("copy %s down %s, back in sync %s after the kill; states seen %v", cp.name, down,
		time.Since(start).Round(time.Millisecond), seen)
	t.Logf("written while down: %d B (%d B rounded up to 64 KiB granules); until in sync: %d B (%d B rounded); "+
		"resync copied %.0f B (%.2fx the rounded bytes written while down, %.2fx until in sync)",
		downBytes, downSpan, written, span, copied, copied/float64(downSpan), copied/float64(span))
	if copied <= 0 || copied > float64(2*span) {
		t.Errorf("resync copied %.0f bytes: want more than 0 and at most 2 x %d", copied, span)
	}
	// Every acknowledged write is on both copies, byte for byte.
	for _, d := range disks {
		a, b := diskSum(t, prim, "rs", d), diskSum(t, cp, "rs", d)
		if a != b {
			t.Errorf("disk %s: primary %s, copy %s", d, a, b)
		} else {
			t.Logf("disk %s: both copies sha256 %s", d, a[:16])
		}
	}
	m, err := metricsOf(c, prim)
	if err != nil {
		t.Fatal(err)
	}
	if s := m.Sum("quiver_cluster_copy_state", map[string]string{"volume": "rs", "copy": cp.name, "state": "in-sync"}); s != 1 {
		t.Errorf("quiver_cluster_copy_state of the resynced copy: %v", s)
	}
	if s := m.Sum("quiver_cluster_resyncs_total", map[string]string{"result": "ok"}); s < 1 {
		t.Errorf("quiver_cluster_resyncs_total{result=ok}: %v", s)
	}
	if len(m.Samples("quiver_cluster_replication_latency_seconds_count", nil)) == 0 {
		t.Error("no replication latency")
	}
}

func metricsOf(c *cluster, nd *node) (client.Metrics, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	return nd.api().Metrics(ctx)
}

func scrapeSum(t *testing.T, c *cluster, nd *node, name string) float64 {
	t.Helper()
	m, err := metricsOf(c, nd)
	if err != nil {
		t.Fatal(err)
	}
	return m.Sum(name, nil)
}
