package pool

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"path"
	"strings"
	"testing"
	"time"

	"github.com/quiverstorage/quiver/internal/storage/crashfs"
)

// readAll reads a disk, live (snap "") or of a snapshot.
func readAll(t *testing.T, v *Volume, snap, disk string) []byte {
	t.Helper()
	var d Disk
	var err error
	if snap == "" {
		d, err = v.OpenDisk(disk)
	} else {
		d, err = v.OpenSnapshotDisk(snap, disk)
	}
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	buf := make([]byte, d.Size())
	if err := d.ReadAt(buf, 0); err != nil {
		t.Fatal(err)
	}
	return buf
}

// covered checks that every granule where a and b differ is inside the
// delta's ranges, and returns the bytes the delta reports.
func covered(t *testing.T, what string, a, b []byte, dd DiskDelta) {
	t.Helper()
	in := func(off int64) bool {
		for _, r := range dd.Ranges {
			if off >= r.Offset && off < r.Offset+r.Length {
				return true
			}
		}
		return false
	}
	n := max(len(a), len(b))
	for off := 0; off < n; off += changeGranule {
		end := min(off+changeGranule, n)
		var x, y []byte
		if off < len(a) {
			x = a[off:min(end, len(a))]
		}
		if off < len(b) {
			y = b[off:min(end, len(b))]
		}
		if !bytes.Equal(x, y) && !in(int64(off)) {
			t.Fatalf("%s: the granule at %d differs and the delta %v does not report it", what, off, dd.Ranges)
		}
	}
}

func deltaOf(t *testing.T, ds []DiskDelta, disk string) DiskDelta {
	t.Helper()
	for _, d := range ds {
		if d.Disk == disk {
			return d
		}
	}
	t.Fatalf("no delta for disk %q in %+v", disk, ds)
	return DiskDelta{}
}

func TestChangesBetweenCheckpoints(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	p := openTestPool(t, dir)
	mustCreate(t, p, VolumeSpec{Name: "vm", Capacity: 64 * mib,
		Disks: []DiskSpec{{Name: "root", Size: 8 * mib}, {Name: "data", Size: 8 * mib}}})
	v, _ := p.Volume("vm")
	writeDisk(t, v, "root", 0, bytes.Repeat([]byte{1}, 4096))
	if _, _, err := v.CreateSnapshot(ctx, "a", nil); err != nil {
		t.Fatal(err)
	}
	writeDisk(t, v, "root", 3*mib+100, []byte("changed after a"))
	writeDisk(t, v, "data", 5*mib, bytes.Repeat([]byte{2}, 70<<10)) // two granules
	if _, _, err := v.CreateSnapshot(ctx, "b", nil); err != nil {
		t.Fatal(err)
	}
	writeDisk(t, v, "data", 7*mib, []byte("changed after b"))

	ab, err := v.Changes(ctx, "a", "b")
	if err != nil {
		t.Fatal(err)
	}
	if got, want := deltaOf(t, ab, "root").Ranges, []ChangedRange{{3 * mib, changeGranule}}; fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("root a..b: %v, want %v", got, want)
	}
	if got, want := deltaOf(t, ab, "data").Ranges, []ChangedRange{{5 * mib, 2 * changeGranule}}; fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("data a..b: %v, want %v", got, want)
	}
	ba, err := v.Changes(ctx, "b", "a")
	if err != nil || fmt.Sprint(ba) != fmt.Sprint(ab) {
		t.Errorf("b..a = %v, %v; want a..b's %v", ba, err, ab)
	}
	alive, err := v.Changes(ctx, "a", "")
	if err != nil {
		t.Fatal(err)
	}
	if got, want := deltaOf(t, alive, "data").Ranges, []ChangedRange{{5 * mib, 2 * changeGranule}, {7 * mib, changeGranule}}; fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("data a..live: %v, want %v", got, want)
	}
	blive, _ := v.Changes(ctx, "b", "")
	if d := deltaOf(t, blive, "root"); len(d.Ranges) != 0 || d.Changed != 0 {
		t.Errorf("root b..live: %+v, want nothing", d)
	}
	for _, disk := range []string{"root", "data"} {
		covered(t, disk+" a..b", readAll(t, v, "a", disk), readAll(t, v, "b", disk), deltaOf(t, ab, disk))
		covered(t, disk+" a..live", readAll(t, v, "a", disk), readAll(t, v, "", disk), deltaOf(t, alive, disk))
	}

	// After a restart the current epoch is known per region (1 MiB), the
	// sealed ones per granule still.
	p.Close()
	p = openTestPool(t, dir)
	v, _ = p.Volume("vm")
	alive, err = v.Changes(ctx, "a", "")
	if err != nil {
		t.Fatal(err)
	}
	if got, want := deltaOf(t, alive, "data").Ranges, []ChangedRange{{5 * mib, 2 * changeGranule}, {7 * mib, mib}}; fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("data a..live after a restart: %v, want %v", got, want)
	}
	covered(t, "data a..live after a restart", readAll(t, v, "a", "data"), readAll(t, v, "", "data"), deltaOf(t, alive, "data"))

	// Bad input changes nothing and says what is wrong.
	if _, err := v.Changes(ctx, "nope", ""); !errors.Is(err, ErrSnapshotNotFound) {
		t.Errorf("unknown base: %v", err)
	}
	if _, err := v.Changes(ctx, "../a", ""); !errors.Is(err, ErrInvalid) {
		t.Errorf("bad name: %v", err)
	}
}

func TestChangesWholeDisk(t *testing.T) {
	ctx := context.Background()
	p := openTestPool(t, t.TempDir())
	mustCreate(t, p, VolumeSpec{Name: "vm", Capacity: 64 * mib,
		Disks: []DiskSpec{{Name: "root", Size: 4 * mib}, {Name: "data", Size: 4 * mib}}})
	v, _ := p.Volume("vm")
	writeDisk(t, v, "data", 0, []byte("first"))
	if _, _, err := v.CreateSnapshot(ctx, "a", nil); err != nil {
		t.Fatal(err)
	}
	// A disk removed and added again under its name is another disk.
	if _, err := v.RemoveDisk(ctx, "data"); err != nil {
		t.Fatal(err)
	}
	if _, err := v.AddDisk(ctx, DiskSpec{Name: "data", Size: 4 * mib}); err != nil {
		t.Fatal(err)
	}
	writeDisk(t, v, "data", 0, []byte("again"))
	ds, err := v.Changes(ctx, "a", "")
	if err != nil {
		t.Fatal(err)
	}
	if d := deltaOf(t, ds, "data"); !d.Whole || d.Changed != 4*mib {
		t.Errorf("disk added again: %+v, want whole", d)
	}
	if d := deltaOf(t, ds, "root"); d.Whole || d.Changed != 0 {
		t.Errorf("root untouched: %+v", d)
	}
	// A grown disk: what the base did not have is changed.
	if _, err := v.GrowDisk(ctx, "root", 6*mib); err != nil {
		t.Fatal(err)
	}
	ds, _ = v.Changes(ctx, "a", "")
	if d := deltaOf(t, ds, "root"); fmt.Sprint(d.Ranges) != fmt.Sprint([]ChangedRange{{4 * mib, 2 * mib}}) || d.BaseSize != 4*mib {
		t.Errorf("grown root: %+v", d)
	}
	// A rollback replaces every disk.
	if _, _, err := v.CreateSnapshot(ctx, "b", nil); err != nil {
		t.Fatal(err)
	}
	if _, err := v.Rollback(ctx, "a", nil); err != nil {
		t.Fatal(err)
	}
	ds, _ = v.Changes(ctx, "b", "")
	for _, d := range ds {
		if !d.Whole {
			t.Errorf("after a rollback, %s from b: %+v, want whole", d.Disk, d)
		}
	}
	// A snapshot whose checkpoint is another pool's is no base (its
	// sequence number means nothing here), nor one from before change
	// tracking.
	v.mu.Lock()
	v.snaps["b"].CheckpointPool = "another-pool"
	v.mu.Unlock()
	if _, err := v.Changes(ctx, "b", ""); !errors.Is(err, ErrNoCheckpoint) || !strings.Contains(err.Error(), "another pool") {
		t.Errorf("base of another pool: %v", err)
	}
	v.mu.Lock()
	v.snaps["a"].Checkpoint = 0
	v.mu.Unlock()
	if _, err := v.Changes(ctx, "a", ""); !errors.Is(err, ErrNoCheckpoint) {
		t.Errorf("base without a checkpoint: %v", err)
	}
}

func TestChangesDamagedOrMissing(t *testing.T) {
	ctx := context.Background()
	p := openTestPool(t, t.TempDir())
	mustCreate(t, p, VolumeSpec{Name: "vm", Capacity: 64 * mib, Disks: []DiskSpec{{Name: "root", Size: 4 * mib}}})
	v, _ := p.Volume("vm")
	for _, s := range []string{"a", "b", "c"} {
		writeDisk(t, v, "root", 0, []byte(s))
		if _, _, err := v.CreateSnapshot(ctx, s, nil); err != nil {
			t.Fatal(err)
		}
	}
	b, _ := v.snapshotManifest("b")
	c, _ := v.snapshotManifest("c")
	// A damaged sealed epoch counts as all changed.
	rel := path.Join(v.changesDir(), fmt.Sprintf("root.%d", c.Checkpoint))
	f, err := p.fs.OpenRegular(rel, 2)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt([]byte{0xff}, changeHeader+1); err != nil {
		t.Fatal(err)
	}
	f.Close()
	ds, err := v.Changes(ctx, "b", "c")
	if err != nil || !ds[0].Whole {
		t.Errorf("damaged epoch: %+v, %v; want whole", ds, err)
	}
	// A missing one that a snapshot names fails the delta.
	if err := p.fs.Remove(path.Join(v.changesDir(), fmt.Sprintf("root.%d", b.Checkpoint))); err != nil {
		t.Fatal(err)
	}
	if _, err := v.Changes(ctx, "a", "c"); !errors.Is(err, ErrNoCheckpoint) {
		t.Errorf("missing epoch: %v", err)
	}
	// Deleting the oldest snapshots prunes the epochs before them.
	if err := v.DeleteSnapshot(ctx, "a"); err != nil {
		t.Fatal(err)
	}
	if err := v.DeleteSnapshot(ctx, "b"); err != nil {
		t.Fatal(err)
	}
	es, _ := p.fs.ReadDir(v.changesDir())
	for _, e := range es {
		if _, seq, ok := sealedName(e.Name()); ok && seq <= c.Checkpoint {
			t.Errorf("epoch %s kept after every snapshot up to it was deleted", e.Name())
		}
	}
}

// TestChangesSurvivePowerCuts writes at random between checkpoints on the
// strict crash twin, cuts the power at a random sync point (keeping a
// random part of what was not synced, as a disk may), and checks after the
// reboot that the delta from every surviving checkpoint covers every
// granule that differs between its snapshot and the disk now.
func TestChangesSurvivePowerCuts(t *testing.T) {
	ctx := context.Background()
	runs := 100
	if raceOn {
		runs = 40 // about 90 s on two cores with the race detector
	}
	for run := range runs {
		rng := rand.New(rand.NewPCG(uint64(run), 7))
		cfs := crashfs.New("/crash")
		cfs.KeepPartial(uint64(run))
		p := crashPool(t, cfs)
		mustCreate(t, p, VolumeSpec{Name: "vm", Capacity: 64 * mib,
			Disks: []DiskSpec{{Name: "root", Size: 4 * mib}, {Name: "data", Size: 4 * mib}}})
		cfs.CutAtSync(len(cfs.Syncs())+1+rng.IntN(60), rng.IntN(2) == 0)
		v, _ := p.Volume("vm")
		handles := map[string]Disk{}
		for _, d := range []string{"root", "data"} {
			h, err := v.OpenDisk(d)
			if err != nil {
				t.Fatal(err)
			}
			handles[d] = h
		}
		// A second writer runs beside the checkpoints, so that writes
		// land between a cut and the reset of the live map after it.
		done := make(chan struct{})
		go func() {
			defer close(done)
			wr := rand.New(rand.NewPCG(uint64(run), 9))
			for i := 0; !cfs.Off() && i < 2000; i++ {
				_ = handles["data"].WriteAt(bytes.Repeat([]byte{byte(i)}, 4096), wr.Int64N(4*mib-4096), false)
			}
		}()
		for i := 0; !cfs.Off() && i < 400; i++ {
			switch r := rng.IntN(20); {
			case r == 0:
				_, _, _ = v.CreateSnapshot(ctx, fmt.Sprintf("s%d", i), nil)
			case r == 1:
				_ = handles["root"].Flush()
			default:
				disk := []string{"root", "data"}[rng.IntN(2)]
				off := rng.Int64N(4*mib - 8192)
				_ = handles[disk].WriteAt(bytes.Repeat([]byte{byte(i)}, 1+rng.IntN(8192)), off, rng.IntN(8) == 0)
			}
		}
		<-done
		for _, h := range handles {
			h.Close()
		}
		p = reboot(t, p, cfs)
		v, err := p.Volume("vm")
		if err != nil {
			t.Fatal(err)
		}
		for _, s := range v.Snapshots() {
			ds, err := v.Changes(ctx, s.Name, "")
			if err != nil {
				t.Fatalf("run %d: delta from %s: %v", run, s.Name, err)
			}
			for _, disk := range []string{"root", "data"} {
				covered(t, fmt.Sprintf("run %d: %s from %s", run, disk, s.Name),
					readAll(t, v, s.Name, disk), readAll(t, v, "", disk), deltaOf(t, ds, disk))
			}
		}
		p.Close()
	}
}

func TestBackupPolicyKeptInTheManifest(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	p := openTestPool(t, dir)
	mustCreate(t, p, VolumeSpec{Name: "vm", Capacity: 8 * mib, Disks: []DiskSpec{{Name: "root", Size: mib}}})
	v, _ := p.Volume("vm")
	for _, bad := range []BackupPolicy{{Every: time.Second}, {Every: time.Hour, Target: "../x"}, {Every: time.Hour, KeepLast: -1}} {
		if _, err := v.SetBackupPolicy(ctx, &bad); !errors.Is(err, ErrInvalid) {
			t.Errorf("policy %+v: %v, want ErrInvalid", bad, err)
		}
	}
	want := BackupPolicy{Every: 6 * time.Hour, Target: "offsite", KeepDaily: 7}
	if _, err := v.SetBackupPolicy(ctx, &want); err != nil {
		t.Fatal(err)
	}
	p.Close()
	p = openTestPool(t, dir)
	v, _ = p.Volume("vm")
	if got := v.Info().BackupPolicy; got == nil || *got != want {
		t.Fatalf("policy after a restart: %+v, want %+v", got, want)
	}
	if _, err := v.SetBackupPolicy(ctx, nil); err != nil || v.Info().BackupPolicy != nil {
		t.Fatalf("removing the policy: %v", err)
	}
}

func TestDRPolicyKeptInTheManifest(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	p := openTestPool(t, dir)
	mustCreate(t, p, VolumeSpec{Name: "vm", Capacity: 8 * mib, Disks: []DiskSpec{{Name: "root", Size: mib}}})
	v, _ := p.Volume("vm")
	for _, bad := range []DRPolicy{{Site: "b", Relationship: "db", RPO: time.Second}, {Site: "../b", Relationship: "db", RPO: time.Minute},
		{Site: "b", Relationship: "", RPO: time.Minute}, {Site: "b", Relationship: "db", RPO: 48 * time.Hour}} {
		if _, err := v.SetDRPolicy(ctx, &bad); !errors.Is(err, ErrInvalid) {
			t.Errorf("policy %+v: %v, want ErrInvalid", bad, err)
		}
	}
	if v.Info().DRPolicy != nil {
		t.Fatal("a refused policy was kept")
	}
	want := DRPolicy{Site: "b", Relationship: "db", RPO: 30 * time.Second}
	if _, err := v.SetDRPolicy(ctx, &want); err != nil {
		t.Fatal(err)
	}
	p.Close()
	p = openTestPool(t, dir)
	v, _ = p.Volume("vm")
	if got := v.Info().DRPolicy; got == nil || *got != want {
		t.Fatalf("policy after a restart: %+v, want %+v", got, want)
	}
	if _, err := v.SetDRPolicy(ctx, nil); err != nil || v.Info().DRPolicy != nil {
		t.Fatalf("removing the policy: %v", err)
	}
}

func TestChangesPrunedAtEachCheckpoint(t *testing.T) {
	ctx := context.Background()
	p := openTestPool(t, t.TempDir())
	mustCreate(t, p, VolumeSpec{Name: "vm", Capacity: 8 * mib, Disks: []DiskSpec{{Name: "root", Size: mib}}})
	v, _ := p.Volume("vm")
	for _, s := range []string{"a", "b", "c"} {
		writeDisk(t, v, "root", 0, []byte(s))
		if _, _, err := v.CreateSnapshot(ctx, s, nil); err != nil {
			t.Fatal(err)
		}
	}
	a, _ := v.snapshotManifest("a")
	es, _ := p.fs.ReadDir(v.changesDir())
	var sealed []uint64
	for _, e := range es {
		if _, seq, ok := sealedName(e.Name()); ok {
			sealed = append(sealed, seq)
			if seq <= a.Checkpoint {
				t.Errorf("epoch %s kept: no delta reads an epoch at or before the oldest checkpoint %d", e.Name(), a.Checkpoint)
			}
		}
	}
	if len(sealed) != 2 {
		t.Errorf("sealed epochs %v, want the two after a", sealed)
	}
	if _, err := v.Changes(ctx, "a", "c"); err != nil {
		t.Fatal(err)
	}
}
