package backup

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/quiverstorage/quiver/internal/crypt"
	"github.com/quiverstorage/quiver/internal/objstore"
	"github.com/quiverstorage/quiver/internal/pool"
)

// Manifest is one backup: a whole VM at one snapshot's cut.
type Manifest struct {
	ID        string `json:"id"`
	Volume    string `json:"volume"`
	VolumeUID string `json:"volumeUID,omitempty"`
	Snapshot  string `json:"snapshot"`
	// SnapshotUID names the snapshot's point: the same on every copy of a
	// cluster's volume, so that whichever copy is primary finds its base.
	SnapshotUID string            `json:"snapshotUID,omitempty"`
	Checkpoint  uint64            `json:"checkpoint,omitempty"`
	Parent      string            `json:"parent,omitempty"` // the backup it was made incrementally from
	CreatedAt   time.Time         `json:"createdAt"`
	BlockSize   int64             `json:"blockSize"`
	Labels      map[string]string `json:"labels,omitempty"`
	Disks       []DiskManifest    `json:"disks"`
	Stats       Stats             `json:"stats"`
	// Key, for a backup of an encrypted volume, is its data key wrapped
	// under the volume's backup KEK (pool.Volume.BackupKey): the blocks
	// are its ciphertext, as the pool holds it, and restoring them needs
	// that KEK. KeyUID names the data key. Neither is set for a volume in
	// the clear.
	Key    *crypt.WrappedKey `json:"key,omitempty"`
	KeyUID string            `json:"keyUID,omitempty"`
}

// DiskManifest is one disk of a backup: its blocks in order, the zero
// BlockID for a block of zeros (not stored).
type DiskManifest struct {
	Name   string    `json:"name"`
	Size   int64     `json:"size"`
	Blocks []BlockID `json:"-"` // in the manifest's binary part
}

// Stats say what a backup cost. The Chunks* counters count blocks
// (BlockSize): the names are the API's.
type Stats struct {
	BytesRead    int64         `json:"bytesRead"`    // read from the disks
	BytesSent    int64         `json:"bytesSent"`    // stored: new blocks (compressed, encrypted) and their indexes
	ChunksNew    int           `json:"chunksNew"`    // blocks stored by this backup
	ChunksReused int           `json:"chunksReused"` // blocks already in the repository (deduplicated)
	ChunksZero   int           `json:"chunksZero"`   // blocks of zeros: not stored
	Packs        int           `json:"packs"`        // packs stored by this backup
	Logical      int64         `json:"logical"`      // the disks' total size
	Duration     time.Duration `json:"durationNs"`
}

// Range is a byte range of a disk.
type Range struct{ Offset, Length int64 }

// Disk is a disk of the source.
type Disk struct {
	Name string
	Size int64
}

// Source is the snapshot a backup reads.
type Source interface {
	Disks() []Disk
	ReadAt(disk string, p []byte, off int64) error
}

// Change is what changed in a disk since the parent's snapshot.
type Change struct {
	Whole  bool
	Ranges []Range
}

// Progress hears how far a long operation is, in bytes.
type Progress interface {
	AddTotal(n int64)
	Add(n int64)
}

type nopProgress struct{}

func (nopProgress) AddTotal(int64) {}
func (nopProgress) Add(int64)      {}

// Options of a backup.
type Options struct {
	Volume, VolumeUID, Snapshot, SnapshotUID string
	Checkpoint                               uint64
	Labels                                   map[string]string
	// Parent, when set, is the backup of an earlier snapshot of the same
	// volume, and Changes what changed in each disk since that snapshot
	// (a disk missing from Changes, or from Parent, is read whole).
	Parent  *Manifest
	Changes map[string]Change
	// Parallel is the reads in flight, of up to 1 MiB each (0: 16: an
	// incremental backup reads small blocks scattered over cold disks,
	// and waits on each).
	Parallel int
	Progress Progress
	// Key and KeyUID, for a source that reads an encrypted volume's
	// ciphertext, go into the manifest (Manifest.Key).
	Key    *crypt.WrappedKey
	KeyUID string
}

// readRun is the most blocks read from a disk at once.
const readRun = 16

// Backup stores the source as a new backup and returns its manifest, which
// is stored last, after every pack and index holding its new blocks: on an
// error nothing is visible (packs already stored are garbage for Collect).
func (r *Repository) Backup(ctx context.Context, src Source, o Options) (*Manifest, error) {
	start := time.Now()
	if o.Volume == "" || o.Snapshot == "" {
		return nil, fmt.Errorf("a backup needs its volume and snapshot: %w", ErrInvalid)
	}
	if o.Parent != nil && (o.Parent.Volume != o.Volume || o.Parent.BlockSize != BlockSize) {
		return nil, fmt.Errorf("parent %s is of volume %s: %w", o.Parent.ID, o.Parent.Volume, ErrInvalid)
	}
	var logical int64
	for _, d := range src.Disks() {
		logical += d.Size
	}
	if logical > maxBackupSize {
		return nil, fmt.Errorf("%s@%s: %d bytes of disks, a backup holds at most %d: %w", o.Volume, o.Snapshot, logical,
			int64(maxBackupSize), ErrInvalid)
	}
	prog := o.Progress
	if prog == nil {
		prog = nopProgress{}
	}
	unlock, err := r.lock(ctx, "backup")
	if err != nil {
		return nil, err
	}
	defer unlock()
	// Under the lock no collection runs: what the index holds now stays.
	if err := r.refresh(ctx); err != nil {
		return nil, err
	}
	m := &Manifest{ID: time.Now().UTC().Format("20060102T150405Z") + "-" + randomID(3), Volume: o.Volume,
		VolumeUID: o.VolumeUID, Snapshot: o.Snapshot, SnapshotUID: o.SnapshotUID, Checkpoint: o.Checkpoint, CreatedAt: time.Now().UTC(),
		BlockSize: BlockSize, Labels: o.Labels, Key: o.Key, KeyUID: o.KeyUID}
	type job struct {
		disk         int
		first, count int64 // blocks
	}
	var jobs []job
	for di, d := range src.Disks() {
		n := (d.Size + BlockSize - 1) / BlockSize
		dm := DiskManifest{Name: d.Name, Size: d.Size, Blocks: make([]BlockID, n)}
		read := r.toRead(&dm, o, n)
		m.Stats.Logical += d.Size
		m.Disks = append(m.Disks, dm)
		for i := int64(0); i < n; {
			if !read[i] {
				if dm.Blocks[i].IsZero() {
					m.Stats.ChunksZero++
				} else {
					m.Stats.ChunksReused++
				}
				i++
				continue
			}
			j := i
			for j < n && read[j] && j-i < readRun {
				j++
			}
			jobs = append(jobs, job{di, i, j - i})
			prog.AddTotal(min(j*BlockSize, d.Size) - i*BlockSize)
			i = j
		}
	}
	var (
		mu                  sync.Mutex
		pending             = map[BlockID]bool{} // stored by this backup
		read                atomic.Int64
		fresh, reused, zero atomic.Int64
	)
	pk := newPacker(ctx, r)
	g, gctx := errgroup.WithContext(ctx)
	par := o.Parallel
	if par <= 0 {
		par = 16
	}
	g.SetLimit(par)
	bufs := sync.Pool{New: func() any { b := make([]byte, readRun*BlockSize); return &b }}
	for _, j := range jobs {
		if gctx.Err() != nil {
			break
		}
		g.Go(func() error {
			d := &m.Disks[j.disk]
			off := j.first * BlockSize
			n := min(j.count*BlockSize, d.Size-off)
			bp := bufs.Get().(*[]byte)
			defer bufs.Put(bp)
			p := (*bp)[:n]
			if err := src.ReadAt(d.Name, p, off); err != nil {
				return fmt.Errorf("read disk %s at %d: %w", d.Name, off, err)
			}
			read.Add(n)
			defer prog.Add(n)
			var sealed []sealedBlock
			for k := int64(0); k < j.count; k++ {
				b := p[k*BlockSize : min((k+1)*BlockSize, n)]
				if pool.IsZero(b) {
					d.Blocks[j.first+k] = BlockID{}
					zero.Add(1)
					continue
				}
				id := r.blockID(b)
				d.Blocks[j.first+k] = id
				mu.Lock()
				have := pending[id] || r.idx.has(id)
				pending[id] = true
				mu.Unlock()
				if have {
					reused.Add(1)
					continue
				}
				data, err := r.sealBlock(b, id)
				if err != nil {
					return err
				}
				sealed = append(sealed, sealedBlock{id, data})
				fresh.Add(1)
			}
			return pk.add(sealed)
		})
	}
	if err = g.Wait(); err == nil {
		err = pk.finish()
	} else {
		pk.abandon()
	}
	if err == nil {
		err = ctx.Err()
	}
	if err != nil {
		return nil, fmt.Errorf("backup of %s@%s: %w (nothing of it is visible)", o.Volume, o.Snapshot, err)
	}
	if o.Parent != nil {
		m.Parent = o.Parent.ID
	}
	m.Stats.BytesRead, m.Stats.BytesSent, m.Stats.Packs = read.Load(), pk.sent.Load(), int(pk.packs.Load())
	m.Stats.ChunksNew, m.Stats.ChunksReused, m.Stats.ChunksZero = int(fresh.Load()), m.Stats.ChunksReused+int(reused.Load()),
		m.Stats.ChunksZero+int(zero.Load())
	m.Stats.Duration = time.Since(start)
	if err := r.putManifest(ctx, m); err != nil {
		return nil, fmt.Errorf("backup of %s@%s: %w (nothing of it is visible)", o.Volume, o.Snapshot, err)
	}
	return m, nil
}

// toRead says which blocks of disk dm (of n blocks) to read; the others
// it fills from the parent's manifest. A block is taken from the parent
// only when the parent has the disk, the disk's changes are tracked, the
// block is not in them, and the block is in the repository now (a parent
// deleted and collected since leaves its blocks to be read again).
func (r *Repository) toRead(dm *DiskManifest, o Options, n int64) []bool {
	read := make([]bool, n)
	var prev *DiskManifest
	if o.Parent != nil {
		if i := slices.IndexFunc(o.Parent.Disks, func(p DiskManifest) bool { return p.Name == dm.Name }); i >= 0 {
			prev = &o.Parent.Disks[i]
		}
	}
	ch, tracked := o.Changes[dm.Name]
	if prev == nil || !tracked || ch.Whole {
		for i := range read {
			read[i] = true
		}
		return read
	}
	copy(dm.Blocks, prev.Blocks)
	for i := int64(len(prev.Blocks)); i < n; i++ {
		read[i] = true
	}
	if prev.Size%BlockSize != 0 && len(prev.Blocks) > 0 && prev.Size < dm.Size {
		read[len(prev.Blocks)-1] = true // its tail was short
	}
	for _, rg := range ch.Ranges {
		if rg.Length <= 0 {
			continue
		}
		for i := rg.Offset / BlockSize; i <= (rg.Offset+rg.Length-1)/BlockSize && i < n; i++ {
			read[i] = true
		}
	}
	for i, id := range dm.Blocks {
		if !read[i] && !id.IsZero() && !r.idx.has(id) {
			read[i] = true
		}
	}
	return read
}

func (r *Repository) putManifest(ctx context.Context, m *Manifest) error {
	p, err := encodeManifest(m)
	if err != nil {
		return err
	}
	data, err := r.seal(p, "backup:"+m.ID)
	if err != nil {
		return err
	}
	return r.store.Put(ctx, "backups/"+m.ID, data)
}

// validID checks a backup id from a caller.
func validID(id string) error {
	if id == "" || len(id) > 64 || strings.ContainsAny(id, "/\\") || strings.Contains(id, "..") {
		return fmt.Errorf("backup id %q: %w", id, ErrInvalid)
	}
	for _, c := range id {
		if !(c >= '0' && c <= '9' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c == '-') {
			return fmt.Errorf("backup id %q: %w", id, ErrInvalid)
		}
	}
	return nil
}

// Get returns one backup's manifest.
func (r *Repository) Get(ctx context.Context, id string) (*Manifest, error) {
	if err := validID(id); err != nil {
		return nil, err
	}
	data, err := r.store.Get(ctx, "backups/"+id, maxMeta)
	if errors.Is(err, objstore.ErrNotFound) {
		return nil, fmt.Errorf("backup %s: %w", id, ErrNotFound)
	}
	if err != nil {
		return nil, err
	}
	p, err := r.open(data, "backup:"+id, maxMeta)
	if err != nil {
		return nil, err
	}
	m, err := decodeManifest(p)
	if err != nil || m.ID != id || m.BlockSize != BlockSize {
		return nil, fmt.Errorf("backup %s: manifest unreadable: %w", id, ErrCorrupt)
	}
	return m, nil
}

// List returns every backup (of volume, when not ""), oldest first. A
// manifest that cannot be read is skipped and reported in bad.
func (r *Repository) List(ctx context.Context, volume string) (list []*Manifest, bad []error, err error) {
	var ids []string
	err = r.store.List(ctx, "backups/", func(k string, _ int64) error {
		ids = append(ids, strings.TrimPrefix(k, "backups/"))
		return nil
	})
	if err != nil {
		return nil, nil, err
	}
	for _, id := range ids {
		m, err := r.Get(ctx, id)
		if err != nil {
			if errors.Is(err, ErrCorrupt) || errors.Is(err, ErrInvalid) {
				bad = append(bad, err)
				continue
			}
			return nil, nil, err
		}
		if volume == "" || m.Volume == volume {
			list = append(list, m)
		}
	}
	slices.SortFunc(list, func(a, b *Manifest) int { return a.CreatedAt.Compare(b.CreatedAt) })
	return list, bad, nil
}

// Delete removes a backup. Its blocks stay until Collect finds them used
// by no other backup. Other backups stay whole: each lists every block.
func (r *Repository) Delete(ctx context.Context, id string) error {
	if _, err := r.Get(ctx, id); err != nil && !errors.Is(err, ErrCorrupt) {
		return err
	}
	return r.store.Delete(ctx, "backups/"+id)
}
