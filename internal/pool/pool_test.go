package pool

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"testing"
)

const mib = int64(1) << 20

func openTestPool(t *testing.T, dir string) *Pool {
	t.Helper()
	p, err := Open(context.Background(), dir, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close() })
	return p
}

func mustCreate(t testing.TB, p *Pool, spec VolumeSpec) VolumeInfo {
	t.Helper()
	info, _, err := p.Create(context.Background(), spec)
	if err != nil {
		t.Fatal(err)
	}
	return info
}

func vm3(name string) VolumeSpec {
	return VolumeSpec{Name: name, Capacity: 64 * mib, Labels: map[string]string{"app": "web"},
		Disks: []DiskSpec{{Name: "root", Size: 8 * mib}, {Name: "data", Size: 8 * mib}, {Name: "logs", Size: 4 * mib}}}
}

func writeDisk(t *testing.T, v *Volume, disk string, off int64, data []byte) {
	t.Helper()
	d, err := v.OpenDisk(disk)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	if err := d.WriteAt(data, off, true); err != nil {
		t.Fatal(err)
	}
}

func readFile(t *testing.T, path string, off int64, n int) []byte {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	buf := make([]byte, n)
	if _, err := f.ReadAt(buf, off); err != nil {
		t.Fatal(err)
	}
	return buf
}

func TestCreateLaysOutDisks(t *testing.T) {
	p := openTestPool(t, t.TempDir())
	ctx := context.Background()
	_, created, err := p.Create(ctx, vm3("web01"))
	if err != nil || !created {
		t.Fatalf("first create: created=%v err=%v", created, err)
	}
	for _, d := range []string{"root", "data", "logs"} {
		st, err := os.Stat(filepath.Join(p.Dir(), "volumes", "web01", "disks", d+".img"))
		if err != nil {
			t.Fatal(err)
		}
		if st.Sys() == nil || st.Size() == 0 {
			t.Fatalf("%s: empty image", d)
		}
	}
}

func TestDiskOperations(t *testing.T) {
	p := openTestPool(t, t.TempDir())
	ctx := context.Background()
	mustCreate(t, p, vm3("db"))
	v, _ := p.Volume("db")
	if _, err := v.AddDisk(ctx, DiskSpec{Name: "wal", Size: 100 * mib}); !errors.Is(err, ErrCapacity) {
		t.Fatalf("add over capacity: %v", err)
	}
	if _, err := v.AddDisk(ctx, DiskSpec{Name: "wal", Size: 16 * mib}); err != nil {
		t.Fatal(err)
	}
	if _, err := v.GrowDisk(ctx, "wal", 8*mib); !errors.Is(err, ErrInvalid) {
		t.Fatalf("shrink: %v", err)
	}
	info, err := v.GrowDisk(ctx, "wal", 32*mib)
	if err != nil {
		t.Fatal(err)
	}
	if info.Disks[3].Size != 32*mib {
		t.Fatalf("grown size %d", info.Disks[3].Size)
	}
	d, err := v.OpenDisk("wal")
	if err != nil {
		t.Fatal(err)
	}
	if d.Size() != 32*mib {
		t.Fatalf("handle size %d", d.Size())
	}
	if err := d.WriteAt([]byte("x"), 32*mib, false); !errors.Is(err, ErrOutOfRange) {
		t.Fatalf("write past end: %v", err)
	}
	if _, err := v.RemoveDisk(ctx, "wal"); err != nil {
		t.Fatal(err)
	}
	if err := d.WriteAt([]byte("x"), 0, false); !errors.Is(err, ErrDiskRemoved) {
		t.Fatalf("write to removed disk: %v", err)
	}
	c := 128 * mib
	if _, err := v.Update(ctx, Update{Capacity: &c, Labels: map[string]string{"tier": "gold"}}); err != nil {
		t.Fatal(err)
	}
	small := 1 * mib
	if _, err := v.Update(ctx, Update{Capacity: &small}); !errors.Is(err, ErrInvalid) {
		t.Fatalf("shrink capacity: %v", err)
	}
	if _, err := os.Stat(filepath.Join(v.disksDir(), "wal.img")); !os.IsNotExist(err) {
		t.Fatalf("removed disk image still there: %v", err)
	}
}

func TestSnapshotCloneRollbackAndReopen(t *testing.T) {
	dir := t.TempDir()
	p := openTestPool(t, dir)
	ctx := context.Background()
	mustCreate(t, p, vm3("golden"))
	v, _ := p.Volume("golden")
	writeDisk(t, v, "root", 4096, []byte("version-1"))
	writeDisk(t, v, "data", 0, []byte("data-1"))
	if _, _, err := v.CreateSnapshot(ctx, "v1", nil); err != nil {
		t.Fatal(err)
	}
	writeDisk(t, v, "root", 4096, []byte("version-2"))
	if _, err := v.AddDisk(ctx, DiskSpec{Name: "extra", Size: mib}); err != nil {
		t.Fatal(err)
	}

	clones, err := p.Clone(ctx, CloneRequest{Source: Source{"golden", "v1"}, Names: []string{"vdi-1", "vdi-2"}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range clones {
		if got := readFile(t, filepath.Join(c.Dir, "root.img"), 4096, 9); string(got) != "version-1" {
			t.Fatalf("clone %s root: %q", c.Name, got)
		}
		if len(c.Disks) != 3 {
			t.Fatalf("clone %s has %d disks, want the snapshot's 3", c.Name, len(c.Disks))
		}
	}
	live, err := p.Clone(ctx, CloneRequest{Source: Source{Volume: "golden"}, Names: []string{"live-1"}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if got := readFile(t, filepath.Join(live[0].Dir, "root.img"), 4096, 9); string(got) != "version-2" {
		t.Fatalf("live clone root: %q", got)
	}
	// Clones are independent of their source.
	c1, _ := p.Volume("vdi-1")
	writeDisk(t, c1, "root", 4096, []byte("changed!!"))
	if got := readFile(t, filepath.Join(v.disksDir(), "root.img"), 4096, 9); string(got) != "version-2" {
		t.Fatalf("source changed by clone write: %q", got)
	}

	// Roll back through an open handle: it sees the snapshot's data.
	h, err := v.OpenDisk("root")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := v.Rollback(ctx, "v1", nil); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 9)
	if err := h.ReadAt(buf, 4096); err != nil || string(buf) != "version-1" {
		t.Fatalf("after rollback read %q, %v", buf, err)
	}
	if info := v.Info(); len(info.Disks) != 3 {
		t.Fatalf("after rollback %d disks, want 3", len(info.Disks))
	}
	if _, err := os.Stat(filepath.Join(v.disksDir(), "extra.img")); !os.IsNotExist(err) {
		t.Fatal("disk added after the snapshot survived rollback")
	}
	sd, err := v.OpenSnapshotDisk("v1", "data")
	if err != nil {
		t.Fatal(err)
	}
	if err := sd.WriteAt([]byte("x"), 0, false); !errors.Is(err, ErrReadOnly) {
		t.Fatalf("snapshot write: %v", err)
	}
	_ = sd.Close()

	// A fresh pool object on the same directory sees everything (once the
	// first lets go of the pool's lock; Close writes nothing).
	_ = p.Close()
	p2 := openTestPool(t, dir)
	for _, name := range []string{"golden", "vdi-1", "vdi-2", "live-1"} {
		if _, err := p2.Volume(name); err != nil {
			t.Fatalf("after reopen: %v", err)
		}
	}
	v2, _ := p2.Volume("golden")
	if _, err := v2.Snapshot("v1"); err != nil {
		t.Fatal(err)
	}
	if err := v2.DeleteSnapshot(ctx, "v1"); err != nil {
		t.Fatal(err)
	}
	if err := p2.Delete(ctx, "golden"); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dir, "volumes", "golden")); !os.IsNotExist(err) {
		t.Fatal("deleted volume directory remains")
	}
	if ents, _ := os.ReadDir(filepath.Join(dir, "staging")); len(ents) != 0 {
		t.Fatalf("staging not empty: %v", ents)
	}
}

func TestConcurrentOperationsOnOneVolumeAreRefused(t *testing.T) {
	p := openTestPool(t, t.TempDir())
	mustCreate(t, p, vm3("web"))
	v, _ := p.Volume("web")
	unlock, err := v.lockOps("test")
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	ops := map[string]func() error{
		"snapshot": func() error { _, _, err := v.CreateSnapshot(ctx, "s", nil); return err },
		"delete":   func() error { return p.Delete(ctx, "web") },
		"add disk": func() error { _, err := v.AddDisk(ctx, DiskSpec{Name: "x", Size: mib}); return err },
		"clone": func() error {
			_, err := p.Clone(ctx, CloneRequest{Source: Source{Volume: "web"}, Names: []string{"c"}}, nil)
			return err
		},
	}
	for name, op := range ops {
		if err := op(); !errors.Is(err, ErrBusy) {
			t.Errorf("%s during another operation: %v, want ErrBusy", name, err)
		}
	}
	unlock()
	if _, _, err := v.CreateSnapshot(ctx, "s", nil); err != nil {
		t.Fatal(err)
	}
}

func TestOpenReclaimsLeftovers(t *testing.T) {
	dir := t.TempDir()
	p := openTestPool(t, dir)
	mustCreate(t, p, vm3("web"))
	v, _ := p.Volume("web")
	// Simulate crashes: a half-made volume in staging, a temp manifest, an
	// orphan image, a short image after an interrupted grow.
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(os.MkdirAll(filepath.Join(dir, "staging", "vol-abc", "disks"), 0o755))
	must(os.WriteFile(filepath.Join(v.dir, ".tmp-volume.json-1"), []byte("{"), 0o644))
	must(os.WriteFile(filepath.Join(v.disksDir(), "orphan.img"), []byte("x"), 0o644))
	must(os.Truncate(filepath.Join(v.disksDir(), "root.img"), mib))

	_ = p.Close() // writes nothing: the pool is as a crash left it
	openTestPool(t, dir)
	if ents, _ := os.ReadDir(filepath.Join(dir, "staging")); len(ents) != 0 {
		t.Fatalf("staging not reclaimed: %v", ents)
	}
	for _, gone := range []string{filepath.Join(v.dir, ".tmp-volume.json-1"), filepath.Join(v.disksDir(), "orphan.img")} {
		if _, err := os.Stat(gone); !os.IsNotExist(err) {
			t.Errorf("%s not reclaimed", gone)
		}
	}
	st, _ := os.Stat(filepath.Join(v.disksDir(), "root.img"))
	if st.Size() != 8*mib {
		t.Fatalf("short image not extended: %d", st.Size())
	}
}

func TestDiskHandleZeroTrimExtents(t *testing.T) {
	p := openTestPool(t, t.TempDir())
	mustCreate(t, p, vm3("web"))
	v, _ := p.Volume("web")
	d, err := v.OpenDisk("root")
	if err != nil {
		t.Fatal(err)
	}
	data := bytes.Repeat([]byte{0xAB}, int(mib))
	if err := d.WriteAt(data, 2*mib, false); err != nil {
		t.Fatal(err)
	}
	if err := d.Flush(); err != nil {
		t.Fatal(err)
	}
	ext, err := d.Extents(0, 8*mib, 0)
	if err != nil {
		t.Fatal(err)
	}
	want := []Extent{{0, 2 * mib, true}, {2 * mib, mib, false}, {3 * mib, 5 * mib, true}}
	if len(ext) != len(want) {
		t.Fatalf("extents %+v, want %+v", ext, want)
	}
	for i := range want {
		if ext[i] != want[i] {
			t.Fatalf("extents %+v, want %+v", ext, want)
		}
	}
	if err := d.Zero(2*mib, 4096, ZeroFUA); err != nil {
		t.Fatal(err)
	}
	if err := d.Trim(2*mib+4096, 4096, false); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 3*4096)
	if err := d.ReadAt(buf, 2*mib); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(buf[:8192], make([]byte, 8192)) || buf[8192] != 0xAB {
		t.Fatal("zero/trim did not zero exactly their range")
	}
}
