package replicated

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"testing"

	"github.com/quiverstorage/quiver/internal/api"
	"github.com/quiverstorage/quiver/internal/cluster"
	"github.com/quiverstorage/quiver/internal/pool"
	"github.com/quiverstorage/quiver/internal/qos"
)

func qosLimits(rwIOPS int64) qos.Limits { return qos.Limits{RWIOPS: rwIOPS} }

const mib = 1 << 20

// copyVolume makes a pool with volume "vm" of disks a (1 MiB), b (2 MiB)
// and c (1 MiB), capacity 8 MiB, with 0xaa written at the start of a.
func copyVolume(t *testing.T) *pool.Volume {
	t.Helper()
	ctx := context.Background()
	p, err := pool.Open(ctx, t.TempDir(), slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close() })
	if _, _, err := p.Create(ctx, pool.VolumeSpec{Name: "vm", Capacity: 8 * mib, Disks: []pool.DiskSpec{
		{Name: "a", Size: mib}, {Name: "b", Size: 2 * mib}, {Name: "c", Size: mib}}}); err != nil {
		t.Fatal(err)
	}
	v, err := p.Volume("vm")
	if err != nil {
		t.Fatal(err)
	}
	d, err := v.OpenDisk("a")
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	buf := make([]byte, 4096)
	for i := range buf {
		buf[i] = 0xaa
	}
	if err := d.WriteAt(buf, 0, true); err != nil {
		t.Fatal(err)
	}
	return v
}

func disksOf(v *pool.Volume) map[string]int64 {
	out := map[string]int64{}
	for _, d := range v.Info().Disks {
		out[d.Name] = d.Size
	}
	return out
}

func sameDisks(t *testing.T, v *pool.Volume, want map[string]int64) {
	t.Helper()
	got := disksOf(v)
	if len(got) != len(want) {
		t.Fatalf("disks %v, want %v", got, want)
	}
	for n, s := range want {
		if got[n] != s {
			t.Fatalf("disks %v, want %v", got, want)
		}
	}
}

// TestApplyCutOp: what a copy does with each change its primary makes at
// the cut, and what it refuses with nothing changed.
func TestApplyCutOp(t *testing.T) {
	ctx := context.Background()
	original := map[string]int64{"a": mib, "b": 2 * mib, "c": mib}
	t.Run("conform", func(t *testing.T) {
		v := copyVolume(t)
		// a grows (its data kept), b is larger than the primary's (made
		// again), c is not on the primary, d is new; the capacity grows.
		op := cluster.Op{Kind: cluster.OpConformDisks, Name: "vm", Capacity: 16 * mib, Disks: []api.DiskSpec{
			{Name: "a", Size: 2 * mib}, {Name: "b", Size: mib}, {Name: "d", Size: 4 * mib}}}
		if err := applyCutOp(ctx, v, op); err != nil {
			t.Fatal(err)
		}
		sameDisks(t, v, map[string]int64{"a": 2 * mib, "b": mib, "d": 4 * mib})
		if c := v.Info().Capacity; c != 16*mib {
			t.Errorf("capacity %d, want %d", c, 16*mib)
		}
		d, err := v.OpenDisk("a")
		if err != nil {
			t.Fatal(err)
		}
		defer d.Close()
		b := make([]byte, 4096)
		if err := d.ReadAt(b, 0); err != nil || b[0] != 0xaa || b[4095] != 0xaa {
			t.Errorf("a grown in place lost its data: %x (%v)", b[:4], err)
		}
		// Again: nothing to do.
		if err := applyCutOp(ctx, v, op); err != nil {
			t.Fatal(err)
		}
		sameDisks(t, v, map[string]int64{"a": 2 * mib, "b": mib, "d": 4 * mib})
	})
	t.Run("disk changes", func(t *testing.T) {
		v := copyVolume(t)
		steps := []struct {
			op   cluster.Op
			want map[string]int64
		}{
			{cluster.Op{Kind: cluster.OpAddDisk, Disk: &api.DiskSpec{Name: "d", Size: mib}}, map[string]int64{"a": mib, "b": 2 * mib, "c": mib, "d": mib}},
			{cluster.Op{Kind: cluster.OpAddDisk, Disk: &api.DiskSpec{Name: "d", Size: mib}}, map[string]int64{"a": mib, "b": 2 * mib, "c": mib, "d": mib}},
			{cluster.Op{Kind: cluster.OpGrowDisk, Disk: &api.DiskSpec{Name: "a", Size: 3 * mib}}, map[string]int64{"a": 3 * mib, "b": 2 * mib, "c": mib, "d": mib}},
			{cluster.Op{Kind: cluster.OpRemoveDisk, Disk: &api.DiskSpec{Name: "c"}}, map[string]int64{"a": 3 * mib, "b": 2 * mib, "d": mib}},
			{cluster.Op{Kind: cluster.OpRemoveDisk, Disk: &api.DiskSpec{Name: "c"}}, map[string]int64{"a": 3 * mib, "b": 2 * mib, "d": mib}},
			// Beyond the copy's capacity: the primary's capacity comes with it.
			{cluster.Op{Kind: cluster.OpAddDisk, Capacity: 12 * mib, Disk: &api.DiskSpec{Name: "e", Size: 4 * mib}},
				map[string]int64{"a": 3 * mib, "b": 2 * mib, "d": mib, "e": 4 * mib}},
		}
		for i, s := range steps {
			if err := applyCutOp(ctx, v, s.op); err != nil {
				t.Fatalf("step %d (%s): %v", i, s.op.Kind, err)
			}
			sameDisks(t, v, s.want)
		}
	})
	t.Run("update", func(t *testing.T) {
		v := copyVolume(t)
		capacity := int64(12 * mib)
		gold := map[string]string{"tier": "gold"}
		op := cluster.Op{Kind: cluster.OpUpdate, Name: "vm", Update: &api.VolumeUpdate{Capacity: &capacity, Labels: gold,
			QoS: &api.QoS{RWIOPS: 500}}}
		for range 2 { // again: the same
			if err := applyCutOp(ctx, v, op); err != nil {
				t.Fatal(err)
			}
			if i := v.Info(); i.Capacity != capacity || i.Labels["tier"] != "gold" || i.QoS.RWIOPS != 500 {
				t.Fatalf("after the update: capacity %d, labels %v, QoS %+v", i.Capacity, i.Labels, i.QoS)
			}
		}
		// A smaller capacity than the copy's is kept (it only grows);
		// labels and limits are replaced, emptied when empty.
		smaller := int64(10 * mib)
		op.Update = &api.VolumeUpdate{Capacity: &smaller, Labels: map[string]string{}, QoS: &api.QoS{}}
		if err := applyCutOp(ctx, v, op); err != nil {
			t.Fatal(err)
		}
		if i := v.Info(); i.Capacity != capacity || len(i.Labels) != 0 || i.QoS.RWIOPS != 0 {
			t.Fatalf("after the second update: capacity %d, labels %v, QoS %+v", i.Capacity, i.Labels, i.QoS)
		}
		// A conform carries the primary's labels and limits too.
		conform := cluster.Op{Kind: cluster.OpConformDisks, Name: "vm", Capacity: capacity, Disks: []api.DiskSpec{
			{Name: "a", Size: mib}, {Name: "b", Size: 2 * mib}, {Name: "c", Size: mib}},
			Update: settingsOf(pool.VolumeInfo{Capacity: capacity, Labels: gold, QoS: qosLimits(700)})}
		if err := applyCutOp(ctx, v, conform); err != nil {
			t.Fatal(err)
		}
		if i := v.Info(); i.Labels["tier"] != "gold" || i.QoS.RWIOPS != 700 {
			t.Fatalf("after the conform: labels %v, QoS %+v", i.Labels, i.QoS)
		}
		sameDisks(t, v, original)
		if err := applyCutOp(ctx, v, cluster.Op{Kind: cluster.OpUpdate, Name: "vm"}); err == nil {
			t.Error("an update without its change was applied")
		}
	})
	t.Run("refused", func(t *testing.T) {
		v := copyVolume(t)
		snap, _, err := v.CreateSnapshot(ctx, "s1", nil)
		if err != nil {
			t.Fatal(err)
		}
		for _, c := range []struct {
			name string
			op   cluster.Op
			is   error
		}{
			{"check of a missing snapshot", cluster.Op{Kind: cluster.OpCheckSnapshot, Name: "s2"}, pool.ErrSnapshotNotFound},
			{"rollback to a missing snapshot", cluster.Op{Kind: cluster.OpRollback, Name: "s2"}, pool.ErrSnapshotNotFound},
			{"rollback to another UID", cluster.Op{Kind: cluster.OpRollback, Name: "s1", UID: "other"}, cluster.ErrCopyMismatch},
			{"grow of a missing disk", cluster.Op{Kind: cluster.OpGrowDisk, Disk: &api.DiskSpec{Name: "x", Size: mib}}, pool.ErrDiskNotFound},
			{"update with a bad label", cluster.Op{Kind: cluster.OpUpdate, Update: &api.VolumeUpdate{Labels: map[string]string{"": "x"}}}, pool.ErrInvalid},
			{"shrink", cluster.Op{Kind: cluster.OpGrowDisk, Disk: &api.DiskSpec{Name: "b", Size: mib}}, pool.ErrInvalid},
			{"unknown", cluster.Op{Kind: "defragment"}, cluster.ErrNotSupported},
		} {
			t.Run(c.name, func(t *testing.T) {
				if err := applyCutOp(ctx, v, c.op); !errors.Is(err, c.is) {
					t.Fatalf("%v, want %v", err, c.is)
				}
				sameDisks(t, v, original)
			})
		}
		if err := applyCutOp(ctx, v, cluster.Op{Kind: cluster.OpCheckSnapshot, Name: "s1", UID: snap.UID}); err != nil {
			t.Errorf("check of the snapshot held: %v", err)
		}
	})
}
