package pool

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/quiverstorage/quiver/internal/fscap"
	"github.com/quiverstorage/quiver/internal/testfs"
)

// TestChunksNoLostUpdates hammers a small disk (4 chunks of 1 MiB) from
// many goroutines, each owning every 16th 4 KiB block, so every chunk is
// written, trimmed and zeroed by all of them at once while chunks are
// rewritten whole and disowned again and again. A chunk rewrite that put
// back stale data over a concurrent change would show as a block differing
// from its owner's model. The pool runs on the test's temporary directory
// with chunks forced on, and on XFS where they are on by default.
func TestChunksNoLostUpdates(t *testing.T) {
	for _, fc := range []struct {
		name string
		dir  func(t *testing.T) string
	}{
		{"tempdir", func(t *testing.T) string { return t.TempDir() }},
		{"xfs", func(t *testing.T) string { return testfs.MountXFS(t, 1<<30) }},
	} {
		t.Run(fc.name, func(t *testing.T) {
			p := openTestPool(t, fc.dir(t))
			p.SetChunkSize(ChunkSize)
			const size, block, writers = 4 << 20, 4096, 16
			mustCreate(t, p, VolumeSpec{Name: "vm", Capacity: size, Disks: []DiskSpec{{Name: "root", Size: size}}})
			v, _ := p.Volume("vm")
			d, err := v.OpenDisk("root")
			if err != nil {
				t.Fatal(err)
			}
			defer d.Close()
			model := make([]byte, size)
			stop := make(chan struct{})
			var disowner sync.WaitGroup
			disowner.Add(1)
			go func() { // what a snapshot does to ownership, often
				defer disowner.Done()
				for {
					select {
					case <-stop:
						return
					default:
					}
					v.gate.Lock()
					v.disownChunks()
					v.gate.Unlock()
					time.Sleep(200 * time.Microsecond)
				}
			}()
			var wg sync.WaitGroup
			errs := make(chan error, writers)
			for g := range writers {
				wg.Add(1)
				go func() {
					defer wg.Done()
					rng := rand.New(rand.NewPCG(uint64(g), 7))
					buf := make([]byte, block)
					for n := range 600 {
						b := int64(rng.IntN(size/block/writers)*writers + g)
						off := b * block
						mine := model[off : off+block]
						var err error
						switch r := rng.IntN(10); {
						case r < 7:
							for i := range buf {
								buf[i] = byte(n) ^ byte(g<<4) ^ byte(i)
							}
							buf[0] = 1 // never all zeros
							err = d.WriteAt(buf, off, false)
							copy(mine, buf)
						case r < 9:
							err = d.Trim(off, block, false)
							clear(mine)
						default:
							err = d.Zero(off, block, 0)
							clear(mine)
						}
						if err != nil {
							errs <- fmt.Errorf("writer %d: %w", g, err)
							return
						}
					}
				}()
			}
			wg.Wait()
			close(stop)
			disowner.Wait()
			close(errs)
			for err := range errs {
				t.Fatal(err)
			}
			got := make([]byte, size)
			if err := d.ReadAt(got, 0); err != nil {
				t.Fatal(err)
			}
			for off := 0; off < size; off += block {
				if !bytes.Equal(got[off:off+block], model[off:off+block]) {
					t.Fatalf("block at %d (writer %d) lost an update", off, off/block%writers)
				}
			}
		})
	}
}

// TestChunksKeepExtentsFew: after a snapshot, random 4 KiB writes over a
// disk leave at most a few extent records per chunk with chunks on, where
// with chunks off every write splits records; and the disk reads back what
// was written either way.
func TestChunksKeepExtentsFew(t *testing.T) {
	mnt := testfs.MountXFS(t, 2<<30)
	count := map[bool]int{}
	for _, on := range []bool{false, true} {
		p := openTestPool(t, filepath.Join(mnt, fmt.Sprint(on)))
		if !on {
			p.SetChunkSize(0)
		}
		const size = 64 * mib
		mustCreate(t, p, VolumeSpec{Name: "vm", Capacity: size, Disks: []DiskSpec{{Name: "root", Size: size}}})
		v, _ := p.Volume("vm")
		d, err := v.OpenDisk("root")
		if err != nil {
			t.Fatal(err)
		}
		model := make([]byte, size)
		rng := rand.New(rand.NewPCG(1, 2))
		fill := func(off int64, n int) {
			b := make([]byte, n)
			for i := range b {
				b[i] = byte(rng.Uint32()) | 1
			}
			if err := d.WriteAt(b, off, false); err != nil {
				t.Fatal(err)
			}
			copy(model[off:], b)
		}
		fill(0, 16<<20)
		if _, _, err := v.CreateSnapshot(context.Background(), "s1", nil); err != nil {
			t.Fatal(err)
		}
		for range 4000 {
			fill(rng.Int64N(size/4096)*4096, 4096)
		}
		if err := d.Flush(); err != nil {
			t.Fatal(err)
		}
		got := make([]byte, size)
		if err := d.ReadAt(got, 0); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, model) {
			t.Fatalf("chunks %v: the disk does not read back what was written", on)
		}
		_ = d.Close()
		f, err := os.Open(v.Info().Disks[0].Path)
		if err != nil {
			t.Fatal(err)
		}
		count[on], err = fscap.Extents(f)
		_ = f.Close()
		if err != nil {
			t.Fatal(err)
		}
		// The snapshot still holds the data from before the writes.
		s, err := v.OpenSnapshotDisk("s1", "root")
		if err != nil {
			t.Fatal(err)
		}
		head := make([]byte, 4096)
		_ = s.ReadAt(head, 0)
		_ = s.Close()
		if bytes.Equal(head, make([]byte, 4096)) {
			t.Fatal("snapshot lost its data")
		}
	}
	t.Logf("extent records after 4000 random 4 KiB writes: %d with chunks, %d without", count[true], count[false])
	if count[true] > 64*4 {
		t.Errorf("%d extent records with chunks on a 64-chunk disk, want at most %d", count[true], 64*4)
	}
	if count[false] < 4*count[true] {
		t.Errorf("without chunks only %d records (with: %d): the test does not show the difference", count[false], count[true])
	}
}
