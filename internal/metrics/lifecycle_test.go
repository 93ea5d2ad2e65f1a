package metrics

import (
	"context"
	"fmt"
	"testing"

	dto "github.com/prometheus/client_model/go"

	"github.com/quiverstorage/quiver/internal/pool"
)

// seriesOf returns, family by family, how many series of the registry
// carry volume="<volume>".
func seriesOf(t *testing.T, m *Metrics, volume string) map[string]int {
	t.Helper()
	_, fams := scrape(t, m)
	out := map[string]int{}
	for name, f := range fams {
		for _, s := range f.GetMetric() {
			if labelValue(s, "volume") == volume {
				out[name]++
			}
		}
	}
	return out
}

func labelValue(s *dto.Metric, name string) string {
	for _, l := range s.GetLabel() {
		if l.GetName() == name {
			return l.GetValue()
		}
	}
	return ""
}

// TestDeletedVolumesLeaveNoSeries: a node whose volumes come and go (a VDI
// pool makes and deletes hundreds a day) exports the series of the
// volumes it holds, not of every volume it ever served: once a busy volume
// is deleted, no family has a series of it left, per-disk and snapshot
// ones included, and the volumes kept keep theirs.
func TestDeletedVolumesLeaveNoSeries(t *testing.T) {
	const n = 6
	ctx := context.Background()
	m, disks, p := activePool(t, n, Options{PerDisk: true})
	// A read of a snapshot of each, so that its quiver_snapshot_* series
	// exist too.
	for i := range n {
		name := fmt.Sprintf("vm-%04d", i+1)
		v, err := p.Volume(name)
		if err != nil {
			t.Fatal(err)
		}
		if _, _, err := v.CreateSnapshot(ctx, "s", nil); err != nil {
			t.Fatal(err)
		}
		d, err := v.OpenSnapshotDisk("s", "root")
		if err != nil {
			t.Fatal(err)
		}
		if err := m.WrapSnapshot(d, name).ReadAt(make([]byte, 4096), 0); err != nil {
			t.Fatal(err)
		}
		_ = d.Close()
	}
	for _, d := range disks {
		_ = d.Close()
	}
	if got := seriesOf(t, m, "vm-0001"); got["quiver_volume_requests_total"] == 0 || got["quiver_disk_requests_total"] == 0 ||
		got["quiver_snapshot_requests_total"] == 0 {
		t.Fatalf("before the delete vm-0001 has series %v, want the volume's, its disks' and its snapshots'", got)
	}
	kept := seriesOf(t, m, fmt.Sprintf("vm-%04d", n))
	for i := range n - 1 {
		if err := p.Delete(ctx, fmt.Sprintf("vm-%04d", i+1)); err != nil {
			t.Fatal(err)
		}
	}
	for i := range n - 1 {
		name := fmt.Sprintf("vm-%04d", i+1)
		if got := seriesOf(t, m, name); len(got) != 0 {
			t.Errorf("deleted volume %s still has series: %v", name, got)
		}
	}
	last := fmt.Sprintf("vm-%04d", n)
	if got := seriesOf(t, m, last); fmt.Sprint(got) != fmt.Sprint(kept) {
		t.Errorf("volume %s, kept, has series %v, want %v as before the others' delete", last, got, kept)
	}
}

// TestSeriesOnFirstRequest: wrapping a handle (opening an export to answer
// NBD_OPT_INFO, as nbdinfo --list does for each) makes no series; its
// first request does. A handle of a volume deleted before its first
// request leaves none behind.
func TestSeriesOnFirstRequest(t *testing.T) {
	ctx := context.Background()
	m, _, p := activePool(t, 0, Options{PerDisk: true})
	for _, name := range []string{"idle", "gone"} {
		if _, _, err := p.Create(ctx, pool.VolumeSpec{Name: name, Capacity: 1 << 20,
			Disks: []pool.DiskSpec{{Name: "root", Size: 1 << 20}}}); err != nil {
			t.Fatal(err)
		}
	}
	open := func(name string) *Disk {
		v, err := p.Volume(name)
		if err != nil {
			t.Fatal(err)
		}
		d, err := v.OpenDisk("root")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = d.Close() })
		return m.Wrap(d, name, "root", v.QoS())
	}
	idle, gone := open("idle"), open("gone")
	// What a scrape reads from the pool (capacities, allocation) is
	// there for every volume held; a Metrics that wrapped nothing has it.
	atRest := seriesOf(t, New(p), "idle")
	if got := seriesOf(t, m, "idle"); fmt.Sprint(got) != fmt.Sprint(atRest) {
		t.Fatalf("a wrapped handle without a request made series: %v, want only the pool's %v", got, atRest)
	}
	if err := idle.ReadAt(make([]byte, 512), 0); err != nil {
		t.Fatal(err)
	}
	if got := seriesOf(t, m, "idle"); got["quiver_volume_requests_total"] != len(ops) || got["quiver_disk_requests_total"] != len(ops) {
		t.Errorf("after a read: series %v, want %d of quiver_volume_requests_total and of quiver_disk_requests_total", got, len(ops))
	}
	if err := p.Delete(ctx, "gone"); err != nil {
		t.Fatal(err)
	}
	if err := gone.ReadAt(make([]byte, 512), 0); err == nil {
		t.Fatal("a read of a deleted volume succeeded")
	}
	if got := seriesOf(t, m, "gone"); len(got) != 0 {
		t.Errorf("a request after the volume's delete made series %v", got)
	}
}

// TestSnapshotExportsCounted: reads of a snapshot's disk are counted under
// its volume in quiver_snapshot_*, apart from the volume's own series (what
// its QoS limits count), whichever snapshot and disk they read.
func TestSnapshotExportsCounted(t *testing.T) {
	ctx := context.Background()
	m, _, p := activePool(t, 1, Options{})
	v, err := p.Volume("vm-0001")
	if err != nil {
		t.Fatal(err)
	}
	before := seriesOf(t, m, "vm-0001")
	for _, snap := range []string{"a", "b"} {
		if _, _, err := v.CreateSnapshot(ctx, snap, nil); err != nil {
			t.Fatal(err)
		}
		for _, disk := range []string{"root", "data"} {
			d, err := v.OpenSnapshotDisk(snap, disk)
			if err != nil {
				t.Fatal(err)
			}
			w := m.WrapSnapshot(d, "vm-0001")
			if err := w.ReadAt(make([]byte, 8192), 0); err != nil {
				t.Fatal(err)
			}
			if err := w.Flush(); err != nil {
				t.Fatal(err)
			}
			_ = d.Close()
		}
	}
	_, fams := scrape(t, m)
	get := func(name, op string) float64 {
		for _, s := range fams[name].GetMetric() {
			if labelValue(s, "volume") == "vm-0001" && labelValue(s, "op") == op {
				return s.GetCounter().GetValue()
			}
		}
		return -1
	}
	for _, tc := range []struct {
		name, op string
		want     float64
	}{
		{"quiver_snapshot_requests_total", OpRead, 4},
		{"quiver_snapshot_requests_total", OpFlush, 4},
		{"quiver_snapshot_bytes_total", OpRead, 4 * 8192},
		// The volume's own: the one read and flush per disk activePool made.
		{"quiver_volume_requests_total", OpRead, 2},
		{"quiver_volume_requests_total", OpFlush, 2},
		{"quiver_volume_bytes_total", OpRead, 2 * 4096},
	} {
		if got := get(tc.name, tc.op); got != tc.want {
			t.Errorf("%s{volume=vm-0001,op=%s} = %v, want %v", tc.name, tc.op, got, tc.want)
		}
	}
	// A few series a volume, whatever its snapshots: read and flush
	// requests and seconds, read bytes.
	after := seriesOf(t, m, "vm-0001")
	if got := after["quiver_snapshot_requests_total"] + after["quiver_snapshot_bytes_total"] + after["quiver_snapshot_request_seconds_total"]; got != 5 {
		t.Errorf("the snapshots of vm-0001 have %d series, want 5", got)
	}
	if after["quiver_volume_requests_total"] != before["quiver_volume_requests_total"] {
		t.Errorf("snapshot reads changed the volume's series: %v, before %v", after, before)
	}
}
