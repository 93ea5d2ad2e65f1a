package pool

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/quiverstorage/quiver/internal/durable"
	"github.com/quiverstorage/quiver/internal/faultio"
	"github.com/quiverstorage/quiver/internal/storage"
	"github.com/quiverstorage/quiver/internal/testfs"
)

// openFaultPool opens a pool in a temporary directory whose disk writes and
// syncs go through a fault injector, with one volume "vm" of disks root and
// data.
func openFaultPool(t *testing.T) (*Pool, *Volume, *faultio.FS) {
	t.Helper()
	dir := t.TempDir()
	osfs, err := storage.OpenOS(dir)
	if err != nil {
		t.Fatal(err)
	}
	fio := faultio.New(osfs)
	p, err := OpenWith(context.Background(), dir,
		Options{Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), FS: fio})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close() })
	mustCreate(t, p, VolumeSpec{Name: "vm", Capacity: 64 * mib,
		Disks: []DiskSpec{{Name: "root", Size: 4 * mib}, {Name: "data", Size: 4 * mib}}})
	v, err := p.Volume("vm")
	if err != nil {
		t.Fatal(err)
	}
	return p, v, fio
}

func openDisk(t *testing.T, v *Volume, name string) Disk {
	t.Helper()
	d, err := v.OpenDisk(name)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = d.Close() })
	return d
}

// syncOps are the requests that must make data durable before they return.
var syncOps = []struct {
	name string
	do   func(d Disk) error
}{
	{"flush", func(d Disk) error { return d.Flush() }},
	{"fua write", func(d Disk) error { return d.WriteAt(pattern(9, 4096), 0, true) }},
	{"fua trim", func(d Disk) error { return d.Trim(0, 4096, true) }},
	{"fua zero", func(d Disk) error { return d.Zero(0, 4096, ZeroFUA) }},
}

// TestFailedSyncIsSticky: after one failed fdatasync, every later flush and
// FUA request of that disk fails, on every handle (those open at the failure
// and those opened while one of them is), although the storage's next
// fdatasync would succeed; the other disk is unaffected. Once every handle
// is closed the disk is reopened and checked, and syncs work again.
func TestFailedSyncIsSticky(t *testing.T) {
	for _, failing := range syncOps {
		t.Run(failing.name, func(t *testing.T) {
			p, v, fio := openFaultPool(t)
			h1, h2 := openDisk(t, v, "root"), openDisk(t, v, "root")
			other := openDisk(t, v, "data")
			if err := h1.WriteAt(pattern(1, 4096), 0, false); err != nil {
				t.Fatal(err)
			}
			fio.FailSync(1, syscall.EIO)
			if err := failing.do(h1); !errors.Is(err, ErrSyncFailed) || !errors.Is(err, syscall.EIO) {
				t.Fatalf("%s with a failing fdatasync: %v, want ErrSyncFailed wrapping EIO", failing.name, err)
			}
			late := openDisk(t, v, "root") // opened while the others hold the failed disk
			for _, h := range []Disk{h1, h2, late} {
				for _, op := range syncOps {
					if err := op.do(h); !errors.Is(err, ErrSyncFailed) {
						t.Errorf("%s after the failure: %v, want ErrSyncFailed", op.name, err)
					}
				}
			}
			if err := other.Flush(); err != nil {
				t.Errorf("flush of the other disk: %v", err)
			}
			if n := p.SyncFailures(); n != 1 {
				t.Errorf("SyncFailures() = %d, want 1 (later requests fail without calling fdatasync)", n)
			}
			for _, h := range []Disk{h1, h2, late} {
				_ = h.Close()
			}
			again := openDisk(t, v, "root")
			for _, op := range syncOps {
				if err := op.do(again); err != nil {
					t.Errorf("%s once the disk is reopened: %v", op.name, err)
				}
			}
		})
	}
}

// TestSnapshotFailsWithFailedSync: a snapshot fails when a sync of a source
// disk fails during the capture, and when one failed before it; no snapshot
// is left behind either way.
func TestSnapshotFailsWithFailedSync(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		name string
		open bool // the disk is open for I/O (else the capture syncs its own file)
		arm  func(t *testing.T, fio *faultio.FS, d Disk)
	}{
		{"sync fails during the capture, disk open", true, func(t *testing.T, fio *faultio.FS, d Disk) {
			fio.FailSync(1, syscall.EIO)
		}},
		{"sync fails during the capture, disk not open", false, func(t *testing.T, fio *faultio.FS, d Disk) {
			fio.FailSync(1, syscall.EIO)
		}},
		{"a flush failed before", true, func(t *testing.T, fio *faultio.FS, d Disk) {
			fio.FailSync(1, syscall.EIO)
			if err := d.Flush(); !errors.Is(err, ErrSyncFailed) {
				t.Fatalf("flush: %v", err)
			}
		}},
		{"the sync after the cut fails", true, func(t *testing.T, fio *faultio.FS, d Disk) {
			// Count the file syncs of a snapshot that succeeds, then fail
			// the data disk's after the cut in the next: the last but
			// three (the two copies and snapshot.json come after it).
			before := fio.Syncs()
			if _, _, err := d.(*liveDisk).v.CreateSnapshot(context.Background(), "probe", nil); err != nil {
				t.Fatal(err)
			}
			if err := d.(*liveDisk).v.DeleteSnapshot(context.Background(), "probe"); err != nil {
				t.Fatal(err)
			}
			fio.FailSync(fio.Syncs()-before-3, syscall.EIO)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, v, fio := openFaultPool(t)
			var d Disk
			if tc.open {
				d = openDisk(t, v, "root")
				if err := d.WriteAt(pattern(1, 4096), 0, false); err != nil {
					t.Fatal(err)
				}
			}
			tc.arm(t, fio, d)
			if _, _, err := v.CreateSnapshot(ctx, "s", nil); !errors.Is(err, ErrSyncFailed) {
				t.Fatalf("snapshot: %v, want ErrSyncFailed", err)
			}
			if fio.Failures() != 1 {
				t.Fatalf("%d faults injected, want 1: the test did not reach the sync it meant to fail", fio.Failures())
			}
			if n := len(v.Snapshots()); n != 0 {
				t.Fatalf("%d snapshots after a failed one", n)
			}
		})
	}
}

// TestWriteNoSpaceIsNotSticky: a write that finds no space fails with
// ErrNoSpace, changes no sync state, and writes work again once there is
// space.
func TestWriteNoSpaceIsNotSticky(t *testing.T) {
	_, v, fio := openFaultPool(t)
	d := openDisk(t, v, "root")
	fio.LimitWrites(4096)
	if err := d.WriteAt(pattern(1, 8192), 0, false); !errors.Is(err, ErrNoSpace) {
		t.Fatalf("write beyond the space left: %v, want ErrNoSpace", err)
	}
	if err := d.Flush(); err != nil {
		t.Fatalf("flush after a failed write: %v", err)
	}
	fio.LimitWrites(-1)
	if err := d.WriteAt(pattern(2, 8192), 0, true); err != nil {
		t.Fatalf("write once space is back: %v", err)
	}
	if got := readBack(t, d, 0, 8192); !bytes.Equal(got, pattern(2, 8192)) {
		t.Fatal("data written once space was back does not read back")
	}
}

// TestRemovedDiskEndsItsHandles: a handle holds its disk, not the disk's
// name. Once the disk is removed, alone or with its volume, every request
// of the handle fails with ErrDiskRemoved, and a disk created later under
// the same name never sees its writes.
func TestRemovedDiskEndsItsHandles(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		name     string
		recreate func(t *testing.T, p *Pool, v *Volume) *Volume
	}{
		{"disk removed and added", func(t *testing.T, p *Pool, v *Volume) *Volume {
			if _, err := v.RemoveDisk(ctx, "root"); err != nil {
				t.Fatal(err)
			}
			if _, err := v.AddDisk(ctx, DiskSpec{Name: "root", Size: 4 * mib}); err != nil {
				t.Fatal(err)
			}
			return v
		}},
		{"volume deleted and created", func(t *testing.T, p *Pool, v *Volume) *Volume {
			if err := p.Delete(ctx, "vm"); err != nil {
				t.Fatal(err)
			}
			mustCreate(t, p, VolumeSpec{Name: "vm", Capacity: 64 * mib, Disks: []DiskSpec{{Name: "root", Size: 4 * mib}}})
			nv, err := p.Volume("vm")
			if err != nil {
				t.Fatal(err)
			}
			return nv
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, v, _ := openFaultPool(t)
			old := openDisk(t, v, "root")
			if err := old.WriteAt(pattern(1, 4096), 0, false); err != nil {
				t.Fatal(err)
			}
			nv := tc.recreate(t, p, v)
			fresh := openDisk(t, nv, "root")
			ops := []struct {
				name string
				do   func() error
			}{
				{"write", func() error { return old.WriteAt(pattern(2, 4096), 0, false) }},
				{"fua write", func() error { return old.WriteAt(pattern(2, 4096), 4096, true) }},
				{"zero", func() error { return old.Zero(8192, 4096, 0) }},
				{"trim", func() error { return old.Trim(8192, 4096, false) }},
				{"read", func() error { return old.ReadAt(make([]byte, 4096), 0) }},
				{"flush", func() error { return old.Flush() }},
				{"extents", func() error { _, err := old.Extents(0, 4096, 0); return err }},
				{"try read", func() error { return old.Capabilities().Nonblocking.TryReadAt(make([]byte, 4096), 0) }},
			}
			for _, op := range ops {
				if err := op.do(); !errors.Is(err, ErrDiskRemoved) {
					t.Errorf("%s through a handle of the removed disk: %v, want ErrDiskRemoved", op.name, err)
				}
			}
			if got := readBack(t, fresh, 0, 16384); !bytes.Equal(got, make([]byte, 16384)) {
				t.Fatal("the new disk holds data written through a handle of the old one")
			}
		})
	}
}

// TestUncertainMetadataFailsVolume: a metadata write whose rename is done
// but not durable (durable.ErrUncertain) marks the volume failed: every
// change and every new handle is refused with ErrVolumeFailed, while an
// ordinary failure (the old content is in place) marks nothing.
func TestUncertainMetadataFailsVolume(t *testing.T) {
	ctx := context.Background()
	_, v, _ := openFaultPool(t)
	held := openDisk(t, v, "root")
	if err := v.metaError(fmt.Errorf("write volume.json: %w", syscall.ENOSPC)); !errors.Is(err, ErrNoSpace) || errors.Is(err, ErrVolumeFailed) {
		t.Fatalf("ordinary failure: %v, want ErrNoSpace and not ErrVolumeFailed", err)
	}
	if _, err := v.AddDisk(ctx, DiskSpec{Name: "logs", Size: mib}); err != nil {
		t.Fatalf("add disk after an ordinary failure: %v", err)
	}
	err := v.metaError(fmt.Errorf("write volume.json: %w: %w", durable.ErrUncertain, syscall.EIO))
	if !errors.Is(err, ErrVolumeFailed) || !errors.Is(err, syscall.EIO) {
		t.Fatalf("uncertain failure: %v, want ErrVolumeFailed wrapping the cause", err)
	}
	ops := []struct {
		name string
		do   func() error
	}{
		{"add disk", func() error { _, err := v.AddDisk(ctx, DiskSpec{Name: "more", Size: mib}); return err }},
		{"remove disk", func() error { _, err := v.RemoveDisk(ctx, "logs"); return err }},
		{"snapshot", func() error { _, _, err := v.CreateSnapshot(ctx, "s", nil); return err }},
		{"attach", func() error { _, _, err := v.Attach("node-1", ModeReadWrite); return err }},
		{"open disk", func() error { _, err := v.OpenDisk("root"); return err }},
		{"update", func() error { _, err := v.Update(ctx, Update{Labels: map[string]string{"a": "b"}}); return err }},
	}
	for _, op := range ops {
		if err := op.do(); !errors.Is(err, ErrVolumeFailed) {
			t.Errorf("%s on a failed volume: %v, want ErrVolumeFailed", op.name, err)
		}
	}
	if err := held.WriteAt(pattern(1, 4096), 0, true); err != nil {
		t.Errorf("a handle opened before keeps its I/O: %v", err)
	}
}

// TestRollbackRecordWithoutStagingFails: a rollback record whose staged
// images are gone cannot be finished; start-up quarantines the volume, with
// a reason naming the missing staging, instead of "finishing" a rollback
// without its images, and serves the other volumes.
func TestRollbackRecordWithoutStagingFails(t *testing.T) {
	dir := t.TempDir()
	p := openTestPool(t, dir)
	mustCreate(t, p, vm3("vm"))
	mustCreate(t, p, vm3("other"))
	v, err := p.Volume("vm")
	if err != nil {
		t.Fatal(err)
	}
	if err := durable.WriteJSONPath(filepath.Join(v.dir, rollbackRecordName),
		rollbackRecord{Snapshot: "s", Staging: "rb-gone"}); err != nil {
		t.Fatal(err)
	}
	_ = p.Close()
	p, err = Open(context.Background(), dir, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatalf("open with a rollback record whose staging is gone: %v, want the volume quarantined", err)
	}
	defer p.Close()
	v, err = p.Volume("vm")
	if err != nil {
		t.Fatal(err)
	}
	if info := v.Info(); !strings.Contains(info.Broken, "rb-gone") {
		t.Fatalf("volume with a rollback record whose staging is gone: broken %q, want a reason naming it", info.Broken)
	}
	if _, _, err := v.CreateSnapshot(context.Background(), "x", nil); !errors.Is(err, ErrBroken) {
		t.Fatalf("snapshot of the quarantined volume: %v, want ErrBroken", err)
	}
	o, err := p.Volume("other")
	if err != nil || o.Info().Broken != "" {
		t.Fatalf("the other volume: %v, broken %q", err, o.Info().Broken)
	}
}

// TestFlushWaitsForASyncThatStartsAfterIt: a flush that arrives while an
// fdatasync of its disk runs does not return on that one (it may have
// missed the flush's writes): it waits for a sync that starts after it
// arrived. Flushes that arrive together share that next sync.
func TestFlushWaitsForASyncThatStartsAfterIt(t *testing.T) {
	_, v, fio := openFaultPool(t)
	d := openDisk(t, v, "root")
	// The write below records its region in the change tracking's live
	// map first (a sync of its own): done here, so that only the disk's
	// syncs are counted.
	if err := d.WriteAt(pattern(2, 4096), 0, false); err != nil {
		t.Fatal(err)
	}
	entered, release := fio.HoldSyncs()
	defer release()
	first := make(chan error, 1)
	go func() { first <- d.Flush() }()
	<-entered // the first sync runs, and waits
	before := fio.Syncs()
	const late = 4
	errs := make(chan error, late)
	for range late {
		go func() {
			if err := d.WriteAt(pattern(3, 4096), 0, false); err != nil {
				errs <- err
				return
			}
			errs <- d.Flush()
		}()
	}
	time.Sleep(50 * time.Millisecond) // let the late flushes arrive (if they do not, they sync later: no false failure)
	release()
	if err := <-first; err != nil {
		t.Fatal(err)
	}
	for range late {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	if got := fio.Syncs() - before; got < 1 {
		t.Fatalf("late flushes returned on the sync that was running when they arrived: %d syncs after it", got)
	} else if got > late {
		t.Fatalf("%d syncs for %d late flushes", got, late)
	}
}

// TestReadOnlyRemountWhileServing: the filesystem goes read-only under a
// serving pool (the kernel remounts it on an error; the fault twin does it
// here). Every write through a disk handle and every operation that changes
// the pool fails, with an error that says read-only (ErrReadOnly, which the
// API answers 409 ReadOnly and NBD EPERM); nothing on disk changes, the pool
// in memory is as before, and reads still work. Once the filesystem is
// writable again, so is the pool.
func TestReadOnlyRemountWhileServing(t *testing.T) {
	ctx := context.Background()
	p, v, fio := openFaultPool(t)
	d := openDisk(t, v, "root")
	if err := d.WriteAt(pattern(7, 4096), 0, true); err != nil {
		t.Fatal(err)
	}
	if _, _, err := v.CreateSnapshot(ctx, "s1", nil); err != nil {
		t.Fatal(err)
	}
	if _, _, err := v.Attach("node-a", ModeReadWrite); err != nil {
		t.Fatal(err)
	}
	mustCreate(t, p, VolumeSpec{Name: "other", Capacity: 8 * mib, Disks: []DiskSpec{{Name: "root", Size: mib}}})
	list := p.List(nil)
	before := testfs.TreeSum(t, p.Dir())

	fio.RemountReadOnly(true)
	ops := []struct {
		name string
		run  func() error
	}{
		{"disk write", func() error { return d.WriteAt(pattern(8, 4096), 4096, false) }},
		{"disk write with FUA", func() error { return d.WriteAt(pattern(8, 4096), 0, true) }},
		{"disk trim", func() error { return d.Trim(0, 4096, false) }},
		{"volume create", func() error {
			_, _, err := p.Create(ctx, VolumeSpec{Name: "new", Capacity: 8 * mib, Disks: []DiskSpec{{Name: "root", Size: mib}}})
			return err
		}},
		{"volume update", func() error {
			_, err := v.Update(ctx, Update{Labels: map[string]string{"a": "b"}})
			return err
		}},
		{"disk add", func() error { _, err := v.AddDisk(ctx, DiskSpec{Name: "logs", Size: mib}); return err }},
		{"disk grow", func() error { _, err := v.GrowDisk(ctx, "data", 8*mib); return err }},
		{"disk remove", func() error { _, err := v.RemoveDiskWith(ctx, "data", true); return err }},
		{"snapshot create", func() error { _, _, err := v.CreateSnapshot(ctx, "s2", nil); return err }},
		{"snapshot delete", func() error { return v.DeleteSnapshot(ctx, "s1") }},
		{"clone", func() error {
			_, err := p.Clone(ctx, CloneRequest{Source: Source{Volume: "vm", Snapshot: "s1"}, Names: []string{"c1"}}, nil)
			return err
		}},
		{"attach", func() error { _, _, err := v.Attach("node-b", ModeReadWrite); return err }},
		{"detach", func() error { return v.Detach(v.Attachments()[0].ID) }},
		{"rollback", func() error { _, err := v.RollbackWith(ctx, "s1", true, nil); return err }},
		{"volume delete", func() error { return p.Delete(ctx, "other") }},
	}
	for _, op := range ops {
		err := op.run()
		if !errors.Is(err, ErrReadOnly) || !strings.Contains(err.Error(), "read-only") {
			t.Errorf("%s on a filesystem remounted read-only: %v, want ErrReadOnly saying read-only", op.name, err)
		}
	}
	buf := make([]byte, 4096)
	if err := d.ReadAt(buf, 0); err != nil || !bytes.Equal(buf, pattern(7, 4096)) {
		t.Errorf("read on a read-only filesystem: %v, or not what was written", err)
	}
	if after := testfs.TreeSum(t, p.Dir()); after != before {
		t.Errorf("the pool changed on disk while read-only:\nbefore %s\nafter  %s", before, after)
	}
	if got := p.List(nil); !reflect.DeepEqual(got, list) {
		t.Errorf("the pool in memory changed:\nbefore %+v\nafter  %+v", list, got)
	}

	fio.RemountReadOnly(false)
	if err := d.WriteAt(pattern(9, 4096), 4096, true); err != nil {
		t.Errorf("write once writable again: %v", err)
	}
	if _, err := v.AddDisk(ctx, DiskSpec{Name: "logs", Size: mib}); err != nil {
		t.Errorf("disk add once writable again: %v", err)
	}
}

// TestReopenAfterFailedSyncIsChecked: a disk whose sync failed is reopened
// once no handle holds it, and the reopened file is checked by a sync of its
// own: while the storage still fails, the disk stays failed; once it works,
// the disk opens and flushes.
func TestReopenAfterFailedSyncIsChecked(t *testing.T) {
	_, v, fio := openFaultPool(t)
	d := openDisk(t, v, "root")
	if err := d.WriteAt(pattern(1, 4096), 0, false); err != nil {
		t.Fatal(err)
	}
	fio.FailSync(1, syscall.EIO)
	if err := d.Flush(); !errors.Is(err, ErrSyncFailed) {
		t.Fatalf("flush: %v, want ErrSyncFailed", err)
	}
	_ = d.Close()
	fio.FailSync(1, syscall.EIO) // the storage still fails
	if d2, err := v.OpenDisk("root"); !errors.Is(err, ErrSyncFailed) {
		if d2 != nil {
			_ = d2.Close()
		}
		t.Fatalf("reopen while the storage fails: %v, want ErrSyncFailed", err)
	}
	d3, err := v.OpenDisk("root")
	if err != nil {
		t.Fatalf("reopen once the storage works: %v", err)
	}
	defer d3.Close()
	if err := d3.Flush(); err != nil {
		t.Fatalf("flush after the reopen: %v", err)
	}
}

// TestCreateFailedStagedSyncLeavesNothing: when one of the staged volume's
// sync points fails (volume.json's data, or either directory synced side by
// side before publish), Create fails with the cause, publishes nothing and
// leaves nothing in staging/; the same create then succeeds.
func TestCreateFailedStagedSyncLeavesNothing(t *testing.T) {
	spec := VolumeSpec{Name: "new", Capacity: 8 * mib, Disks: []DiskSpec{{Name: "root", Size: mib}, {Name: "data", Size: mib}}}
	for _, c := range []struct {
		name string
		arm  func(*faultio.FS)
	}{
		{"volume.json sync", func(f *faultio.FS) { f.FailSync(1, syscall.EIO) }},
		{"first directory sync", func(f *faultio.FS) { f.FailDirSync(1, syscall.EIO) }},
		{"second directory sync", func(f *faultio.FS) { f.FailDirSync(2, syscall.EIO) }},
	} {
		t.Run(c.name, func(t *testing.T) {
			p, _, fio := openFaultPool(t)
			c.arm(fio)
			_, _, err := p.Create(context.Background(), spec)
			if !errors.Is(err, syscall.EIO) || errors.Is(err, ErrVolumeFailed) {
				t.Fatalf("create with a failing staged sync: %v, want EIO and not ErrVolumeFailed", err)
			}
			if fio.Failures() != 1 {
				t.Fatalf("%d faults injected, want 1", fio.Failures())
			}
			if _, err := p.Volume("new"); !errors.Is(err, ErrVolumeNotFound) {
				t.Fatalf("volume after a failed create: %v, want ErrVolumeNotFound", err)
			}
			for _, d := range []string{"staging", "volumes/new"} {
				es, err := os.ReadDir(filepath.Join(p.Dir(), d))
				if d == "staging" && (err != nil || len(es) != 0) {
					t.Fatalf("staging/ after a failed create: %v (%v)", es, err)
				}
				if d != "staging" && !errors.Is(err, os.ErrNotExist) {
					t.Fatalf("%s after a failed create: %v", d, err)
				}
			}
			mustCreate(t, p, spec)
		})
	}
}
