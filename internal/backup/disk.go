package backup

import (
	"container/list"
	"context"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/quiverstorage/quiver/internal/pool"
)

// ExportDisk is one disk of a backup served read-only straight from the store
// (the NBD export backup:<id>/<disk>, docs/backup.md "Booting from a
// backup"): a VM can boot from its backup before anything is restored.
// Chunks are fetched on first read, checked against their addresses, and
// kept in a small cache; chunks of zeros are holes.
type ExportDisk struct {
	repo *Repository
	m    *Manifest
	d    DiskManifest

	mu    sync.Mutex
	cache map[string]*list.Element // chunk id -> element holding a cached chunk
	lru   *list.List
	// fetching holds the chunks being fetched; readers of one wait.
	fetching map[string]chan struct{}
	closed   bool
}

type cached struct {
	id   string
	data []byte
}

// diskCacheChunks bounds an ExportDisk's cache: 64 chunks (64 MiB at 1 MiB chunks).
const diskCacheChunks = 64

// fetchTimeout bounds the fetch of one chunk from the store.
const fetchTimeout = 2 * time.Minute

var _ pool.Disk = (*ExportDisk)(nil)

// OpenDisk serves one disk of backup id.
func (r *Repository) OpenDisk(ctx context.Context, id, disk string) (*ExportDisk, error) {
	m, err := r.Get(ctx, id)
	if err != nil {
		return nil, err
	}
	i := slices.IndexFunc(m.Disks, func(d DiskManifest) bool { return d.Name == disk })
	if i < 0 {
		return nil, fmt.Errorf("backup %s has no disk %q: %w", id, disk, pool.ErrDiskNotFound)
	}
	return &ExportDisk{repo: r, m: m, d: m.Disks[i], cache: map[string]*list.Element{}, lru: list.New(),
		fetching: map[string]chan struct{}{}}, nil
}

func (d *ExportDisk) Size() int64    { return d.d.Size }
func (d *ExportDisk) ReadOnly() bool { return true }

func (d *ExportDisk) check(off, length int64) error {
	if off < 0 || length < 0 || off > d.d.Size || length > d.d.Size-off {
		return fmt.Errorf("[%d, +%d) on a disk of %d bytes: %w", off, length, d.d.Size, pool.ErrOutOfRange)
	}
	return nil
}

// ReadAt reads from the backup's chunks.
func (d *ExportDisk) ReadAt(p []byte, off int64) error {
	if err := d.check(off, int64(len(p))); err != nil {
		return err
	}
	cs := d.m.ChunkSize
	for len(p) > 0 {
		i := off / cs
		in := off - i*cs
		n := min(int64(len(p)), cs-in)
		id := d.d.Chunks[i]
		if id == "" {
			clear(p[:n])
		} else {
			data, err := d.chunk(id)
			if err != nil {
				return fmt.Errorf("backup %s disk %s at %d: %w", d.m.ID, d.d.Name, i*cs, err)
			}
			if in+n > int64(len(data)) {
				return fmt.Errorf("backup %s disk %s: chunk %s is short: %w", d.m.ID, d.d.Name, id, ErrCorrupt)
			}
			copy(p[:n], data[in:in+n])
		}
		p, off = p[n:], off+n
	}
	return nil
}

// chunk returns a chunk's plaintext from the cache or the store.
func (d *ExportDisk) chunk(id string) ([]byte, error) {
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
		data, err := d.repo.readChunk(ctx, id)
		cancel()
		d.mu.Lock()
		delete(d.fetching, id)
		close(done)
		if err == nil && !d.closed {
			d.cache[id] = d.lru.PushFront(&cached{id, data})
			for d.lru.Len() > diskCacheChunks {
				old := d.lru.Remove(d.lru.Back()).(*cached)
				delete(d.cache, old.id)
			}
		}
		d.mu.Unlock()
		return data, err
	}
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

// Extents reports chunks of zeros as holes.
func (d *ExportDisk) Extents(off, length int64, limit int) ([]pool.Extent, error) {
	if err := d.check(off, length); err != nil {
		return nil, err
	}
	var out []pool.Extent
	cs, end := d.m.ChunkSize, off+length
	for off < end {
		i := off / cs
		n := min(end, (i+1)*cs) - off
		hole := d.d.Chunks[i] == ""
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
	d.cache, d.lru = map[string]*list.Element{}, list.New()
	return nil
}
