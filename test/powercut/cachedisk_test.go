package powercut

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"sync"

	"github.com/quiverstorage/quiver/internal/nbd"
	"github.com/quiverstorage/quiver/internal/pool"
)

// cacheBlock is the granule of the volatile cache: the unit a power cut
// keeps or loses whole, as a disk's physical sector is. The guest sees
// 4 KiB logical and physical blocks (QEMU's virtio-blk properties), so it
// never writes less.
const cacheBlock = 4096

// errPowerCut is what a request gets once the power is cut.
var errPowerCut = errors.New("power cut")

// medium is the disk's stable storage: a file on the host, which outlives
// every power cut of the guest (the host never loses power in this test,
// so it needs no fsync of its own).
type medium struct {
	f    *os.File
	size int64
}

// cacheDisk is a disk with a volatile write cache, as a SATA or NVMe drive
// without power-loss protection has: a write lands in the cache and is
// acknowledged; FLUSH writes the whole cache to the medium; a FUA write
// goes to the medium before it is acknowledged; a power cut (cut) throws
// the cache away, after writing a random subset of its blocks to the
// medium, as a drive may have destaged some of them by then. Reads see
// the cache over the medium. One cacheDisk lives for one boot: each boot
// serves the medium through a new one.
type cacheDisk struct {
	m *medium

	mu    sync.Mutex
	dirty map[int64][]byte // block number -> content not yet on the medium
	dead  bool
	stats cacheStats
}

// cacheStats counts what the disk was asked to do.
type cacheStats struct {
	Writes, FUAWrites, Flushes int64
	// FlushedBlocks are the dirty blocks flushes wrote to the medium.
	FlushedBlocks int64
}

func newCacheDisk(m *medium) *cacheDisk {
	return &cacheDisk{m: m, dirty: map[int64][]byte{}}
}

// cut is the power cut: every later request fails, and of the blocks still
// in the cache each reaches the medium with probability keep, the others
// are lost. It returns how many blocks were dirty and how many were kept.
func (d *cacheDisk) cut(keep float64, rng *rand.Rand) (dirty, kept int, err error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.dead = true
	for b, data := range d.dirty {
		if keep > 0 && rng.Float64() < keep {
			if _, werr := d.m.f.WriteAt(data, b*cacheBlock); werr != nil && err == nil {
				err = werr
			}
			kept++
		}
	}
	dirty = len(d.dirty)
	d.dirty = nil
	return dirty, kept, err
}

func (d *cacheDisk) snapshotStats() cacheStats {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.stats
}

// block returns the current content of block b: the cache's, else the
// medium's. Called with mu held.
func (d *cacheDisk) block(b int64) ([]byte, error) {
	if data, ok := d.dirty[b]; ok {
		return data, nil
	}
	data := make([]byte, cacheBlock)
	if _, err := d.m.f.ReadAt(data, b*cacheBlock); err != nil {
		return nil, err
	}
	return data, nil
}

func (d *cacheDisk) check(off, n int64) error {
	if d.dead {
		return errPowerCut
	}
	if off < 0 || n < 0 || off > d.m.size || n > d.m.size-off {
		return fmt.Errorf("[%d,+%d) outside a disk of %d bytes: %w", off, n, d.m.size, pool.ErrOutOfRange)
	}
	return nil
}

func (d *cacheDisk) readAt(p []byte, off int64) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if err := d.check(off, int64(len(p))); err != nil {
		return err
	}
	for done := int64(0); done < int64(len(p)); {
		b, in := (off+done)/cacheBlock, (off+done)%cacheBlock
		data, err := d.block(b)
		if err != nil {
			return err
		}
		done += int64(copy(p[done:], data[in:]))
	}
	return nil
}

// writeAt puts p in the cache (a partial block is merged with its current
// content); with fua the blocks it touched go to the medium at once.
func (d *cacheDisk) writeAt(p []byte, off int64, fua bool) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if err := d.check(off, int64(len(p))); err != nil {
		return err
	}
	d.stats.Writes++
	var touched []int64
	for done := int64(0); done < int64(len(p)); {
		b, in := (off+done)/cacheBlock, (off+done)%cacheBlock
		cur, err := d.block(b)
		if err != nil {
			return err
		}
		data := make([]byte, cacheBlock)
		copy(data, cur)
		done += int64(copy(data[in:], p[done:]))
		d.dirty[b] = data
		touched = append(touched, b)
	}
	if !fua {
		return nil
	}
	d.stats.FUAWrites++
	for _, b := range touched {
		if _, err := d.m.f.WriteAt(d.dirty[b], b*cacheBlock); err != nil {
			return err
		}
		delete(d.dirty, b)
	}
	return nil
}

// flush writes the whole cache to the medium.
func (d *cacheDisk) flush() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.dead {
		return errPowerCut
	}
	d.stats.Flushes++
	for b, data := range d.dirty {
		if _, err := d.m.f.WriteAt(data, b*cacheBlock); err != nil {
			return err
		}
		delete(d.dirty, b)
		d.stats.FlushedBlocks++
	}
	return nil
}

// cacheExports serves one cacheDisk as the NBD export cacheExport, through
// quiver's own NBD server (the guest's QEMU is its client).
type cacheExports struct{ d *cacheDisk }

const cacheExport = "powercut/pool"

var _ nbd.Exports = cacheExports{}

func (e cacheExports) List(context.Context) ([]nbd.ExportInfo, error) {
	return []nbd.ExportInfo{{Name: cacheExport, Description: "disk with a volatile write cache"}}, nil
}

func (e cacheExports) Open(_ context.Context, name, _ string) (nbd.Export, error) {
	if name != cacheExport {
		return nbd.Export{}, fmt.Errorf("export %q: %w", name, pool.ErrDiskNotFound)
	}
	return nbd.Export{Disk: cacheHandle{e.d}, Description: "disk with a volatile write cache"}, nil
}

// cacheHandle is a pool.Disk on a cacheDisk. Trim and zero write zeros
// through the cache, so they obey the same rules as writes.
type cacheHandle struct{ d *cacheDisk }

var _ pool.Disk = cacheHandle{}

func (h cacheHandle) Size() int64                                 { return h.d.m.size }
func (h cacheHandle) ReadOnly() bool                              { return false }
func (h cacheHandle) ReadAt(p []byte, off int64) error            { return h.d.readAt(p, off) }
func (h cacheHandle) WriteAt(p []byte, off int64, fua bool) error { return h.d.writeAt(p, off, fua) }
func (h cacheHandle) Flush() error                                { return h.d.flush() }
func (h cacheHandle) Trim(off, length int64, fua bool) error {
	return h.d.writeAt(make([]byte, length), off, fua)
}
func (h cacheHandle) Zero(off, length int64, flags pool.ZeroFlags) error {
	if flags&pool.ZeroFast != 0 {
		return pool.ErrNotSupported
	}
	return h.d.writeAt(make([]byte, length), off, flags&pool.ZeroFUA != 0)
}
func (h cacheHandle) Cache(off, length int64) error { return nil }
func (h cacheHandle) Extents(off, length int64, _ int) ([]pool.Extent, error) {
	return []pool.Extent{{Offset: off, Length: length}}, nil
}
func (h cacheHandle) Capabilities() pool.Capabilities { return pool.Capabilities{} }
func (h cacheHandle) Close() error                    { return nil }
