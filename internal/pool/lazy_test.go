package pool

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"

	"github.com/quiverstorage/quiver/internal/testfs"
)

// TestLazyChangesRecovered: on XFS, writes after a snapshot are recorded in
// memory only (no live map write); after the filesystem crashes (XFS shut
// down without its log flushed, then mounted again), and after the process
// goes away without a clean close (writes still in the page cache), the
// delta from the snapshot covers every 64 KiB that differs, read from both
// sides; deleting the snapshot first writes the lazily recorded regions
// into the live map.
func TestLazyChangesRecovered(t *testing.T) {
	testfs.RequireRoot(t)
	for _, crash := range []string{"filesystem", "process"} {
		t.Run(crash, func(t *testing.T) { lazyRecovered(t, crash) })
	}
}

func lazyRecovered(t *testing.T, crash string) {
	ctx := context.Background()
	mnt := testfs.MountXFS(t, 300<<20)
	dir := filepath.Join(mnt, "pool")
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	p, err := Open(ctx, dir, log)
	if err != nil {
		t.Fatal(err)
	}
	closed := false
	defer func() {
		if !closed {
			_ = p.Close()
		}
	}()
	const size = 16 * mib
	mustCreate(t, p, VolumeSpec{Name: "vm", Capacity: 2 * size, Disks: []DiskSpec{{Name: "root", Size: size}, {Name: "data", Size: size}}})
	v, _ := p.Volume("vm")
	rng := rand.New(rand.NewPCG(9, 10))
	handles := map[string]Disk{}
	for _, d := range []string{"root", "data"} {
		h, err := v.OpenDisk(d)
		if err != nil {
			t.Fatal(err)
		}
		handles[d] = h
		full := make([]byte, size)
		for i := range full {
			full[i] = byte(rng.UintN(256))
		}
		if err := h.WriteAt(full, 0, true); err != nil {
			t.Fatal(err)
		}
	}
	if _, _, err := v.CreateSnapshot(ctx, "s1", nil); err != nil {
		t.Fatal(err)
	}
	for _, d := range []string{"root", "data"} {
		v.gate.RLock()
		lazy := v.files[d].chg.lazy.Load()
		v.gate.RUnlock()
		if !lazy {
			t.Fatalf("disk %s: changes after the snapshot are still written ahead", d)
		}
	}
	live := filepath.Join(dir, "volumes", "vm", "changes", "root.live")
	before, err := os.ReadFile(live)
	if err != nil {
		t.Fatal(err)
	}
	// Scattered writes, some flushed, into regions the live map does not
	// hold.
	for i := range 60 {
		d := []string{"root", "data"}[i%2]
		off := rng.Int64N(size-8192) &^ 4095
		if err := handles[d].WriteAt(bytes.Repeat([]byte{byte(i + 1)}, 4096+int(rng.Int64N(2))*4096), off, false); err != nil {
			t.Fatal(err)
		}
		if i%7 == 0 {
			if err := handles[d].Flush(); err != nil {
				t.Fatal(err)
			}
		}
	}
	if after, err := os.ReadFile(live); err != nil || !bytes.Equal(after, before) {
		t.Fatalf("the live map changed on the write path (%v)", err)
	}

	switch crash {
	case "filesystem":
		if err := testfs.ShutdownXFS(mnt); err != nil {
			t.Fatal(err)
		}
		for _, h := range handles {
			_ = h.Close()
		}
		_ = p.Close()
		if err := testfs.Remount(mnt); err != nil {
			t.Fatal(err)
		}
	case "process":
		// The handles and the pool go without a flush or a clean close
		// of the change tracking: what a killed process leaves.
		for _, h := range handles {
			_ = h.Close()
		}
		v.gate.Lock()
		for _, df := range v.files {
			_ = df.f.Close()
		}
		v.files = nil
		v.gate.Unlock()
		v.chgOnce.Lock()
		for _, dc := range v.chg.disks {
			if dc.f != nil {
				_ = dc.f.Close()
			}
		}
		v.chg = nil
		v.chgOnce.Unlock()
		_ = p.Close()
	}
	p, err = Open(ctx, dir, log)
	if err != nil {
		t.Fatal(err)
	}
	v, err = p.Volume("vm")
	if err != nil {
		t.Fatal(err)
	}
	ds, err := v.Changes(ctx, "s1", "")
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range []string{"root", "data"} {
		covered(t, fmt.Sprintf("%s after a %s crash", d, crash), readAll(t, v, "s1", d), readAll(t, v, "", d), deltaOf(t, ds, d))
	}
	// Deleting the snapshot the recovery read (the live map not open for
	// writing yet) writes what was recovered into the live map first.
	if err := v.DeleteSnapshot(ctx, "s1"); err != nil {
		t.Fatal(err)
	}
	m, err := os.ReadFile(live)
	if err != nil {
		t.Fatal(err)
	}
	if m[24]&changeLazy != 0 || bytes.Count(m[changeHeader:], []byte{0}) == len(m)-changeHeader {
		t.Fatalf("after the recovery's snapshot went, the live map still names it (flags %08b) or holds no region", m[24])
	}
	// Deleting the checkpoint's snapshot writes what is recorded into the
	// live map first: a later crash has no snapshot to recover from.
	if _, _, err := v.CreateSnapshot(ctx, "s2", nil); err != nil {
		t.Fatal(err)
	}
	h, err := v.OpenDisk("root")
	if err != nil {
		t.Fatal(err)
	}
	if err := h.WriteAt(bytes.Repeat([]byte{0xfe}, 4096), 3*mib+8192, false); err != nil {
		t.Fatal(err)
	}
	h.Close()
	if err := v.DeleteSnapshot(ctx, "s2"); err != nil {
		t.Fatal(err)
	}
	m, err = os.ReadFile(live)
	if err != nil {
		t.Fatal(err)
	}
	if m[changeHeader+0]&(1<<3) == 0 || m[24]&changeLazy != 0 {
		t.Fatalf("after its snapshot's deletion the live map lacks the region written lazily (byte %08b) or still names the checkpoint (flags %08b)",
			m[changeHeader], m[24])
	}
	p.Close()
	closed = true
}
