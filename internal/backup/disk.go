package backup

import (
	"container/list"
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/quiverstorage/quiver/internal/pool"
)

// ExportDisk is one disk of a backup served read-only straight from the store
// (the NBD export backup:<id>/<disk>, docs/backup.md "Booting from a
// backup"): a VM can boot from its backup before anything is restored.
// Blocks are fetched on first read with range GETs of their packs (with the
// blocks after them in the same pack, up to 1 MiB), checked against their
// addresses, and kept in a small cache; blocks of zeros are holes.
type ExportDisk struct {
	repo *Repository
	m    *Manifest
	d    DiskManifest

	mu    sync.Mutex
	cache map[BlockID]*list.Element // block id -> element holding a cached block
	lru   *list.List
	// fetching holds the blocks being fetched; readers of one wait.
	fetching map[BlockID]chan struct{}
	closed   bool
}

type cached struct {
	id   BlockID
	data []byte
}

// diskCacheBlocks bounds an ExportDisk's cache: 16 MiB.
const diskCacheBlocks = 256

// fetchTimeout bounds the fetch of one block from the store.
const fetchTimeout = 2 * time.Minute

var _ pool.Disk = (*ExportDisk)(nil)

// OpenDisk serves one disk of backup id.
func (r *Repository) OpenDisk(ctx context.Context, id, disk string) (*ExportDisk, error) {
	return r.openDisk(ctx, id, disk, false)
}

// openDisk is OpenDisk; with raw, the disk of a backup of an encrypted
// volume is served too, as the ciphertext it holds (for an instant
// restore, whose volume has the backup's data key).
func (r *Repository) openDisk(ctx context.Context, id, disk string, raw bool) (*ExportDisk, error) {
	m, err := r.Get(ctx, id)
	if err != nil {
		return nil, err
	}
	if m.Key != nil && !raw {
		return nil, fmt.Errorf("backup %s holds an encrypted volume's ciphertext, which cannot be served as a disk: restore it: %w", id, pool.ErrEncrypted)
	}
	i := slices.IndexFunc(m.Disks, func(d DiskManifest) bool { return d.Name == disk })
	if i < 0 {
		return nil, fmt.Errorf("backup %s has no disk %q: %w", id, disk, pool.ErrDiskNotFound)
	}
	if err := r.refresh(ctx); err != nil {
		return nil, err
	}
	return &ExportDisk{repo: r, m: m, d: m.Disks[i], cache: map[BlockID]*list.Element{}, lru: list.New(),
		fetching: map[BlockID]chan struct{}{}}, nil
}

func (d *ExportDisk) Size() int64    { return d.d.Size }
func (d *ExportDisk) ReadOnly() bool { return true }

func (d *ExportDisk) check(off, length int64) error {
	if off < 0 || length < 0 || off > d.d.Size || length > d.d.Size-off {
		return fmt.Errorf("[%d, +%d) on a disk of %d bytes: %w", off, length, d.d.Size, pool.ErrOutOfRange)
	}
	return nil
}

// ReadAt reads from the backup's blocks.
func (d *ExportDisk) ReadAt(p []byte, off int64) error {
	if err := d.check(off, int64(len(p))); err != nil {
		return err
	}
	for len(p) > 0 {
		i := off / BlockSize
		in := off - i*BlockSize
		n := min(int64(len(p)), BlockSize-in)
		id := d.d.Blocks[i]
		if id.IsZero() {
			clear(p[:n])
		} else {
			data, err := d.block(i)
			if err != nil {
				return fmt.Errorf("backup %s disk %s at %d: %w", d.m.ID, d.d.Name, i*BlockSize, err)
			}
			if in+n > int64(len(data)) {
				return fmt.Errorf("backup %s disk %s: block %s is short: %w", d.m.ID, d.d.Name, id, ErrCorrupt)
			}
			copy(p[:n], data[in:in+n])
		}
		p, off = p[n:], off+n
	}
	return nil
}

// block returns block i's plaintext from the cache or the store.
func (d *ExportDisk) block(i int64) ([]byte, error) {
	id := d.d.Blocks[i]
	for {
		d.mu.Lock()
		if d.closed {
			d.mu.Unlock()
			return nil, pool.ErrClosed
		}
		if e, ok := d.cache[id]; ok {
			d.lru.MoveToFront(e)
			data := e.Value.(*cached).data
			d.mu.Unlock()
			return data, nil
		}
		if wait, ok := d.fetching[id]; ok {
			d.mu.Unlock()
			<-wait
			continue
		}
		done := make(chan struct{})
		d.fetching[id] = done
		d.mu.Unlock()

		ctx, cancel := context.WithTimeout(context.Background(), fetchTimeout)
		got, err := d.fetch(ctx, i)
		if errors.Is(err, ErrCorrupt) {
			// A collection may have moved the block (repacked) since
			// the index was loaded: look again, once.
			if err = d.repo.refresh(ctx); err == nil {
				got, err = d.fetch(ctx, i)
			}
		}
		cancel()
		d.mu.Lock()
		delete(d.fetching, id)
		close(done)
		if err == nil && !d.closed {
			for _, c := range got {
				if e, ok := d.cache[c.id]; ok {
					d.lru.MoveToFront(e)
					continue
				}
				d.cache[c.id] = d.lru.PushFront(c)
			}
			for d.lru.Len() > diskCacheBlocks {
				old := d.lru.Remove(d.lru.Back()).(*cached)
				delete(d.cache, old.id)
			}
		}
		d.mu.Unlock()
		if err != nil {
			return nil, err
		}
		return got[0].data, nil
	}
}

// fetch reads block i and the blocks of the disk after it that follow it
// in its pack (up to readRun blocks) in one range GET, and opens them.
func (d *ExportDisk) fetch(ctx context.Context, i int64) ([]*cached, error) {
	first, ok := d.repo.idx.lookup(d.d.Blocks[i])
	if !ok {
		return nil, fmt.Errorf("block %s: in no pack of the repository: %w", d.d.Blocks[i], ErrCorrupt)
	}
	f := &fetch{pack: first.pack, start: int64(first.offset), end: int64(first.offset) + int64(first.length)}
	for j := i; j < int64(len(d.d.Blocks)) && j < i+readRun; j++ {
		id := d.d.Blocks[j]
		loc, ok := d.repo.idx.lookup(id)
		if id.IsZero() || !ok || loc.pack != f.pack || (j > i && int64(loc.offset) != f.end) {
			break
		}
		f.end = int64(loc.offset) + int64(loc.length)
		f.needs = append(f.needs, &need{id: id, loc: loc, places: []place{{d.d.Name, j * BlockSize, min(BlockSize, d.d.Size-j*BlockSize)}}})
	}
	data, err := d.repo.get(ctx, f)
	if err != nil {
		return nil, err
	}
	out := make([]*cached, 0, len(f.needs))
	for _, n := range f.needs {
		p, err := d.repo.blockOf(f, data, n, make([]byte, BlockSize), true)
		if err != nil {
			if len(out) > 0 {
				break // the block asked for is good; the others are read when asked
			}
			return nil, err
		}
		out = append(out, &cached{n.id, p})
	}
	return out, nil
}

func (d *ExportDisk) WriteAt([]byte, int64, bool) error {
	return fmt.Errorf("backup %s: %w", d.m.ID, pool.ErrReadOnly)
}
func (d *ExportDisk) Trim(int64, int64, bool) error {
	return fmt.Errorf("backup %s: %w", d.m.ID, pool.ErrReadOnly)
}
func (d *ExportDisk) Zero(int64, int64, pool.ZeroFlags) error {
	return fmt.Errorf("backup %s: %w", d.m.ID, pool.ErrReadOnly)
}
func (d *ExportDisk) Flush() error                    { return nil }
func (d *ExportDisk) Cache(off, length int64) error   { return d.check(off, length) }
func (d *ExportDisk) Capabilities() pool.Capabilities { return pool.Capabilities{} }

// Extents reports blocks of zeros as holes.
func (d *ExportDisk) Extents(off, length int64, limit int) ([]pool.Extent, error) {
	if err := d.check(off, length); err != nil {
		return nil, err
	}
	var out []pool.Extent
	cs, end := int64(BlockSize), off+length
	for off < end {
		i := off / cs
		n := min(end, (i+1)*cs) - off
		hole := d.d.Blocks[i].IsZero()
		if k := len(out) - 1; k >= 0 && out[k].Hole == hole {
			out[k].Length += n
		} else {
			if limit > 0 && len(out) == limit {
				break
			}
			out = append(out, pool.Extent{Offset: off, Length: n, Hole: hole})
		}
		off += n
	}
	return out, nil
}

// Close drops the cache.
func (d *ExportDisk) Close() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.closed = true
	d.cache, d.lru = map[BlockID]*list.Element{}, list.New()
	return nil
}
