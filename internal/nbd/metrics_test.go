package nbd

import (
	"bytes"
	"net/http/httptest"
	"os/exec"
	"testing"

	"github.com/quiverstorage/quiver/internal/client"
	"github.com/quiverstorage/quiver/internal/metrics"
	"github.com/quiverstorage/quiver/internal/testfs"
)

// scrapeMetrics reads m's /metrics as a client does.
func scrapeMetrics(t *testing.T, m *metrics.Metrics) client.Metrics {
	t.Helper()
	rec := httptest.NewRecorder()
	m.Handler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	got, err := client.ParseMetrics(rec.Body)
	if err != nil {
		t.Fatal(err)
	}
	return got
}

// TestListingMakesNoSeries: nbdinfo --list lists the exports and opens each
// one to describe it (NBD_OPT_INFO), reading nothing: no data-path series
// may come of it, or every list would leave series of every volume behind.
func TestListingMakesNoSeries(t *testing.T) {
	testfs.RequireTool(t, "nbdinfo")
	var m *metrics.Metrics
	e := newEnv(t, Config{}, func(x Exports) Exports {
		pe := x.(PoolExports)
		m = metrics.New(pe.Pool)
		pe.Metrics = m
		return pe
	})
	out, err := exec.CommandContext(t.Context(), "nbdinfo", "--list", "nbd://"+e.addr).CombinedOutput()
	if err != nil {
		t.Fatalf("nbdinfo --list: %v\n%s", err, out)
	}
	for _, x := range []string{exportRoot, exportData, exportSnap} {
		if !bytes.Contains(out, []byte(x)) {
			t.Fatalf("nbdinfo --list does not show %s:\n%s", x, out)
		}
	}
	got := scrapeMetrics(t, m)
	for _, name := range []string{"quiver_volume_requests_total", "quiver_volume_requests_in_flight",
		"quiver_qos_throttled_seconds_total", "quiver_snapshot_requests_total"} {
		if s := got.Samples(name, map[string]string{"volume": testVolume}); len(s) != 0 {
			t.Errorf("after nbdinfo --list, %s has %d series of %s, want none", name, len(s), testVolume)
		}
	}
}

// TestSnapshotExportCounted: reads through a snapshot's export are counted
// under its volume in quiver_snapshot_*, not in the volume's own series.
func TestSnapshotExportCounted(t *testing.T) {
	var m *metrics.Metrics
	e := newEnv(t, Config{}, func(x Exports) Exports {
		pe := x.(PoolExports)
		m = metrics.New(pe.Pool)
		pe.Metrics = m
		return pe
	})
	c := e.connect(t, hsOpts{export: exportSnap, structured: true})
	for i := range 3 {
		if got := c.readAt(uint64(i)*4096, 4096); !bytes.Equal(got, e.model["snap"][i*4096:(i+1)*4096]) {
			t.Fatalf("read %d of the snapshot differs from the model", i)
		}
	}
	got := scrapeMetrics(t, m)
	vol := map[string]string{"volume": testVolume, "op": "read"}
	if n := got.Sum("quiver_snapshot_requests_total", vol); n != 3 {
		t.Errorf("quiver_snapshot_requests_total%v = %v, want 3", vol, n)
	}
	if n := got.Sum("quiver_snapshot_bytes_total", vol); n != 3*4096 {
		t.Errorf("quiver_snapshot_bytes_total%v = %v, want %d", vol, n, 3*4096)
	}
	if n := got.Sum("quiver_volume_requests_total", vol); n != 0 {
		t.Errorf("quiver_volume_requests_total%v = %v, want 0: snapshot reads are not the VM's", vol, n)
	}
}
