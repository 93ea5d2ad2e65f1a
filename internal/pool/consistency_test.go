package pool

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/quiverstorage/quiver/internal/consistency"
	"github.com/quiverstorage/quiver/internal/testfs"
)

// TestSnapshotsAreConsistentCuts is acceptance 3 of the core issue:
// concurrent writers stamp a global sequence number into 3 disks of one
// volume through the disk handles while snapshots are taken; every snapshot
// must hold exactly the writes up to one point of the history. On reflink
// filesystems the writes also land between the passes of each live capture,
// which must catch them up.
func TestSnapshotsAreConsistentCuts(t *testing.T) {
	mountXFS := func(t testing.TB) string { return testfs.MountXFS(t, 1<<30) }
	filesystems := []struct {
		name   string
		mount  func(t testing.TB) string
		rounds bool // re-clone with the gate open while any range is dirty
	}{
		{"default", func(t testing.TB) string { return t.TempDir() }, false},
		{"xfs-reflink", mountXFS, false},
		{"xfs-reflink-rounds", mountXFS, true},
		{"btrfs-reflink", func(t testing.TB) string { return testfs.MountBtrfs(t, 1<<30) }, false},
		{"ext4-copy", func(t testing.TB) string { return testfs.MountExt4(t, 512<<20) }, false},
	}
	for _, fs := range filesystems {
		t.Run(fs.name, func(t *testing.T) {
			if fs.rounds {
				setRoundAbove(t, 0)
			}
			dir := fs.mount(t)
			checkCuts(t, filepath.Join(dir, "pool"), 4, 12)
		})
	}
}

func checkCuts(t *testing.T, dir string, writers, snapshots int) {
	const disks = 3
	const diskSize = 8 * mib
	p := openTestPool(t, dir)
	spec := VolumeSpec{Name: "vm", Capacity: disks * diskSize}
	for i := range disks {
		spec.Disks = append(spec.Disks, DiskSpec{Name: fmt.Sprintf("d%d", i), Size: diskSize})
	}
	mustCreate(t, p, spec)
	v, _ := p.Volume("vm")
	handles := make([]Disk, disks)
	for i := range handles {
		var err error
		if handles[i], err = v.OpenDisk(spec.Disks[i].Name); err != nil {
			t.Fatal(err)
		}
	}
	log := consistency.NewLog()
	maxSeq := int64(disks * diskSize / consistency.BlockSize)
	var stop atomic.Bool
	var running atomic.Int32 // writers still writing
	running.Store(int32(writers))
	var wg sync.WaitGroup
	errc := make(chan error, writers)
	for range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer running.Add(-1)
			block := make([]byte, consistency.BlockSize)
			for !stop.Load() {
				seq := log.Next()
				if seq >= maxSeq {
					return
				}
				d, off := consistency.Place(seq, disks)
				consistency.Stamp(block, seq)
				if err := handles[d].WriteAt(block, off, false); err != nil {
					errc <- err
					return
				}
				log.Ack(seq)
			}
		}()
	}
	// Between the first pass of a live capture and the closing of the gate,
	// wait until the writers have acknowledged more writes, so every
	// snapshot on a reflink filesystem has writes to catch up on (the
	// writers keep going during the first pass too).
	setCaptureHooks(t, func() {
		target := log.Acked() + 64
		for log.Acked() < target && running.Load() > 0 {
			time.Sleep(100 * time.Microsecond)
		}
	}, nil)
	ctx := context.Background()
	for i := range snapshots {
		if _, _, err := v.CreateSnapshot(ctx, fmt.Sprintf("s%d", i), nil); err != nil {
			t.Fatal(err)
		}
	}
	stop.Store(true)
	wg.Wait()
	close(errc)
	for err := range errc {
		t.Fatal(err)
	}
	nonTrivial := 0
	for i := range snapshots {
		name := fmt.Sprintf("s%d", i)
		present := map[int64]bool{}
		for d := range disks {
			img, err := os.ReadFile(filepath.Join(v.snapshotDir(name), spec.Disks[d].Name+".img"))
			if err != nil {
				t.Fatal(err)
			}
			if err := consistency.Scan(img, d, disks, present); err != nil {
				t.Fatalf("snapshot %s: %v", name, err)
			}
		}
		n, err := log.Check(present)
		if err != nil {
			t.Fatalf("snapshot %s: %v", name, err)
		}
		if n > 0 && n < log.Acked() {
			nonTrivial++
		}
		t.Logf("snapshot %s holds %d writes", name, n)
	}
	if nonTrivial == 0 {
		t.Fatalf("no snapshot was taken while writes were running (%d acked); the test proved nothing", log.Acked())
	}
}
