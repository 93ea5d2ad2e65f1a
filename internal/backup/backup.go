package backup

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/quiverstorage/quiver/internal/objstore"
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
	ChunkSize   int64             `json:"chunkSize"`
	Labels      map[string]string `json:"labels,omitempty"`
	Disks       []DiskManifest    `json:"disks"`
	Stats       Stats             `json:"stats"`
}

// DiskManifest is one disk of a backup: its chunks in order, "" for a chunk
// of zeros (not stored).
type DiskManifest struct {
	Name   string   `json:"name"`
	Size   int64    `json:"size"`
	Chunks []string `json:"chunks"`
}

// Stats say what a backup cost.
type Stats struct {
	BytesRead    int64         `json:"bytesRead"`    // read from the disks
	BytesSent    int64         `json:"bytesSent"`    // stored: new chunks, compressed and encrypted
	ChunksNew    int           `json:"chunksNew"`    // stored by this backup
	ChunksReused int           `json:"chunksReused"` // already in the repository (deduplicated)
	ChunksZero   int           `json:"chunksZero"`   // all zeros: not stored
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
	Parent   *Manifest
	Changes  map[string]Change
	Parallel int // chunks in flight (0: 4)
	Progress Progress
}

// Backup stores the source as a new backup and returns its manifest, which
// is stored last: on an error nothing is visible.
func (r *Repository) Backup(ctx context.Context, src Source, o Options) (*Manifest, error) {
	start := time.Now()
	if o.Volume == "" || o.Snapshot == "" {
		return nil, fmt.Errorf("a backup needs its volume and snapshot: %w", ErrInvalid)
	}
	if o.Parent != nil && (o.Parent.Volume != o.Volume || o.Parent.ChunkSize != r.cfg.ChunkSize) {
		return nil, fmt.Errorf("parent %s is of volume %s: %w", o.Parent.ID, o.Parent.Volume, ErrInvalid)
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
	known, err := r.chunkSet(ctx)
	if err != nil {
		return nil, err
	}
	cs := r.cfg.ChunkSize
	m := &Manifest{ID: time.Now().UTC().Format("20060102T150405Z") + "-" + randomID(3), Volume: o.Volume,
		VolumeUID: o.VolumeUID, Snapshot: o.Snapshot, SnapshotUID: o.SnapshotUID, Checkpoint: o.Checkpoint, CreatedAt: time.Now().UTC(),
		ChunkSize: cs, Labels: o.Labels}
	type job struct {
		disk  int
		index int64
	}
	var jobs []job
	for di, d := range src.Disks() {
		n := (d.Size + cs - 1) / cs
		dm := DiskManifest{Name: d.Name, Size: d.Size, Chunks: make([]string, n)}
		read := make([]bool, n)
		m.Stats.Logical += d.Size
		var prev *DiskManifest
		if o.Parent != nil {
			if i := slices.IndexFunc(o.Parent.Disks, func(p DiskManifest) bool { return p.Name == d.Name }); i >= 0 {
				prev = &o.Parent.Disks[i]
			}
		}
		ch, tracked := o.Changes[d.Name]
		if prev == nil || !tracked || ch.Whole {
			for i := range read {
				read[i] = true
			}
		} else {
			copy(dm.Chunks, prev.Chunks)
			for i := int64(len(prev.Chunks)); i < n; i++ {
				read[i] = true
			}
			if prev.Size%cs != 0 && int64(len(prev.Chunks)) > 0 && prev.Size < d.Size {
				read[len(prev.Chunks)-1] = true // its tail was short
			}
			for _, rg := range ch.Ranges {
				if rg.Length <= 0 {
					continue
				}
				for i := rg.Offset / cs; i <= (rg.Offset+rg.Length-1)/cs && i < n; i++ {
					read[i] = true
				}
			}
		}
		m.Disks = append(m.Disks, dm)
		for i, rd := range read {
			if rd {
				jobs = append(jobs, job{di, int64(i)})
				prog.AddTotal(min(cs, d.Size-int64(i)*cs))
			} else if dm.Chunks[i] != "" {
				m.Stats.ChunksReused++
			} else {
				m.Stats.ChunksZero++
			}
		}
	}
	var (
		mu                  sync.Mutex
		read, sent          atomic.Int64
		fresh, reused, zero atomic.Int64
	)
	g, gctx := errgroup.WithContext(ctx)
	par := o.Parallel
	if par <= 0 {
		par = 4
	}
	g.SetLimit(par)
	bufs := sync.Pool{New: func() any { b := make([]byte, cs); return &b }}
	for _, j := range jobs {
		if gctx.Err() != nil {
			break
		}
		g.Go(func() error {
			d := &m.Disks[j.disk]
			off := j.index * cs
			n := min(cs, d.Size-off)
			bp := bufs.Get().(*[]byte)
			defer bufs.Put(bp)
			p := (*bp)[:n]
			if err := src.ReadAt(d.Name, p, off); err != nil {
				return fmt.Errorf("read disk %s at %d: %w", d.Name, off, err)
			}
			read.Add(n)
			defer prog.Add(n)
			if allZero(p) {
				d.Chunks[j.index] = ""
				zero.Add(1)
				return nil
			}
			id := r.chunkID(p)
			d.Chunks[j.index] = id
			mu.Lock()
			have := known[id]
			known[id] = true
			mu.Unlock()
			if have {
				reused.Add(1)
				return nil
			}
			data, err := r.seal(p, "chunk:"+id)
			if err != nil {
				return err
			}
			if err := r.store.Put(gctx, chunkKey(id), data); err != nil {
				mu.Lock()
				delete(known, id)
				mu.Unlock()
				return err
			}
			sent.Add(int64(len(data)))
			fresh.Add(1)
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		return nil, fmt.Errorf("backup of %s@%s: %w (nothing of it is visible)", o.Volume, o.Snapshot, err)
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if o.Parent != nil {
		m.Parent = o.Parent.ID
	}
	m.Stats.BytesRead, m.Stats.BytesSent = read.Load(), sent.Load()
	m.Stats.ChunksNew, m.Stats.ChunksReused, m.Stats.ChunksZero = int(fresh.Load()), m.Stats.ChunksReused+int(reused.Load()),
		m.Stats.ChunksZero+int(zero.Load())
	m.Stats.Duration = time.Since(start)
	if err := r.putManifest(ctx, m); err != nil {
		return nil, fmt.Errorf("backup of %s@%s: %w (nothing of it is visible)", o.Volume, o.Snapshot, err)
	}
	return m, nil
}

func allZero(p []byte) bool {
	for len(p) >= 8 {
		if p[0]|p[1]|p[2]|p[3]|p[4]|p[5]|p[6]|p[7] != 0 {
			return false
		}
		p = p[8:]
	}
	for _, b := range p {
		if b != 0 {
			return false
		}
	}
	return true
}

// chunkSet lists the chunks in the store.
func (r *Repository) chunkSet(ctx context.Context) (map[string]bool, error) {
	known := map[string]bool{}
	err := r.store.List(ctx, "chunks/", func(k string, _ int64) error {
		if i := strings.LastIndexByte(k, '/'); i >= 0 {
			known[k[i+1:]] = true
		}
		return nil
	})
	return known, err
}

func (r *Repository) putManifest(ctx context.Context, m *Manifest) error {
	p, err := json.Marshal(m)
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
	var m Manifest
	if err := json.Unmarshal(p, &m); err != nil || m.ID != id || m.ChunkSize != r.cfg.ChunkSize {
		return nil, fmt.Errorf("backup %s: manifest unreadable: %w", id, ErrCorrupt)
	}
	for _, d := range m.Disks {
		if d.Size < 0 || int64(len(d.Chunks)) != (d.Size+m.ChunkSize-1)/m.ChunkSize {
			return nil, fmt.Errorf("backup %s: disk %s: chunk list does not match its size: %w", id, d.Name, ErrCorrupt)
		}
	}
	return &m, nil
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

// Sink receives a restore.
type Sink interface {
	// WriteAt writes into a disk that reads as zeros where nothing is
	// written.
	WriteAt(disk string, p []byte, off int64) error
}

// Restore writes the disks of backup m (only those named in disks, when
// not empty) into sink. Every chunk is checked against its address; the
// first damaged one fails the restore, naming it.
func (r *Repository) Restore(ctx context.Context, m *Manifest, disks []string, sink Sink, prog Progress, parallel int) error {
	if prog == nil {
		prog = nopProgress{}
	}
	for _, name := range disks {
		if !slices.ContainsFunc(m.Disks, func(d DiskManifest) bool { return d.Name == name }) {
			return fmt.Errorf("backup %s has no disk %q: %w", m.ID, name, ErrInvalid)
		}
	}
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(max(parallel, 1))
	for _, d := range m.Disks {
		if len(disks) > 0 && !slices.Contains(disks, d.Name) {
			continue
		}
		prog.AddTotal(d.Size)
		for i, id := range d.Chunks {
			off := int64(i) * m.ChunkSize
			n := min(m.ChunkSize, d.Size-off)
			if id == "" {
				prog.Add(n)
				continue
			}
			if gctx.Err() != nil {
				break
			}
			g.Go(func() error {
				p, err := r.readChunk(gctx, id)
				if err != nil {
					return fmt.Errorf("disk %s at %d: %w", d.Name, off, err)
				}
				if int64(len(p)) != n {
					return fmt.Errorf("disk %s at %d: chunk %s holds %d bytes, want %d: %w", d.Name, off, id, len(p), n, ErrCorrupt)
				}
				if err := sink.WriteAt(d.Name, p, off); err != nil {
					return err
				}
				prog.Add(n)
				return nil
			})
		}
	}
	if err := g.Wait(); err != nil {
		return fmt.Errorf("restore of backup %s: %w", m.ID, err)
	}
	return ctx.Err()
}

// BadChunk is a chunk that Verify could not read back intact.
type BadChunk struct {
	ID     string `json:"id"`
	Disk   string `json:"disk"`
	Offset int64  `json:"offset"`
	Error  string `json:"error"`
}

// Verify reads back every chunk of backup m and checks it; it returns the
// damaged ones. An error means the check could not run (the store).
func (r *Repository) Verify(ctx context.Context, m *Manifest, prog Progress, parallel int) ([]BadChunk, error) {
	if prog == nil {
		prog = nopProgress{}
	}
	type ref struct {
		disk string
		off  int64
	}
	first := map[string]ref{}
	var order []string
	for _, d := range m.Disks {
		for i, id := range d.Chunks {
			if _, ok := first[id]; id != "" && !ok {
				first[id] = ref{d.Name, int64(i) * m.ChunkSize}
				order = append(order, id)
			}
		}
	}
	prog.AddTotal(int64(len(order)) * m.ChunkSize)
	var mu sync.Mutex
	var bad []BadChunk
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(max(parallel, 1))
	for _, id := range order {
		g.Go(func() error {
			_, err := r.readChunk(gctx, id)
			prog.Add(m.ChunkSize)
			if errors.Is(err, ErrCorrupt) {
				mu.Lock()
				bad = append(bad, BadChunk{ID: id, Disk: first[id].disk, Offset: first[id].off, Error: err.Error()})
				mu.Unlock()
				return nil
			}
			return err
		})
	}
	if err := g.Wait(); err != nil {
		return nil, fmt.Errorf("verify of backup %s: %w", m.ID, err)
	}
	slices.SortFunc(bad, func(a, b BadChunk) int {
		if c := strings.Compare(a.Disk, b.Disk); c != 0 {
			return c
		}
		return int(a.Offset - b.Offset)
	})
	return bad, nil
}

// Delete removes a backup. Its chunks stay until Collect finds them used
// by no other backup. Other backups stay whole: each lists every chunk.
func (r *Repository) Delete(ctx context.Context, id string) error {
	if _, err := r.Get(ctx, id); err != nil && !errors.Is(err, ErrCorrupt) {
		return err
	}
	return r.store.Delete(ctx, "backups/"+id)
}

// Collect removes the chunks no backup names (left by deleted backups or
// by backups that failed midway). It refuses to run beside a backup.
func (r *Repository) Collect(ctx context.Context) (removed int, freed int64, err error) {
	unlock, err := r.lock(ctx, "collect")
	if err != nil {
		return 0, 0, err
	}
	defer unlock()
	list, bad, err := r.List(ctx, "")
	if err != nil {
		return 0, 0, err
	}
	if len(bad) > 0 {
		return 0, 0, fmt.Errorf("%d backup manifests cannot be read (first: %w): nothing collected, as their chunks cannot be told apart",
			len(bad), bad[0])
	}
	used := map[string]bool{}
	for _, m := range list {
		for _, d := range m.Disks {
			for _, id := range d.Chunks {
				used[id] = true
			}
		}
	}
	type obj struct {
		key  string
		size int64
	}
	var garbage []obj
	err = r.store.List(ctx, "chunks/", func(k string, size int64) error {
		if i := strings.LastIndexByte(k, '/'); i >= 0 && !used[k[i+1:]] {
			garbage = append(garbage, obj{k, size})
		}
		return nil
	})
	if err != nil {
		return 0, 0, err
	}
	for _, o := range garbage {
		if err := r.store.Delete(ctx, o.key); err != nil {
			return removed, freed, err
		}
		removed++
		freed += o.size
	}
	return removed, freed, nil
}

// lockTTL: a lock older than this is left by a process that died.
const lockTTL = 6 * time.Hour

type lockRecord struct {
	Kind      string    `json:"kind"`
	CreatedAt time.Time `json:"createdAt"`
}

// lock takes a lock of kind: backups share the repository, a collection
// holds it alone. The check after the write sees any rival that wrote
// first, so two rivals never both go ahead (both may back off).
func (r *Repository) lock(ctx context.Context, kind string) (func(), error) {
	id := "locks/" + kind + "-" + randomID(6)
	data, _ := json.Marshal(lockRecord{Kind: kind, CreatedAt: time.Now().UTC()})
	if err := r.store.Put(ctx, id, data); err != nil {
		return nil, err
	}
	release := func() { _ = r.store.Delete(context.WithoutCancel(ctx), id) }
	var rival string
	err := r.store.List(ctx, "locks/", func(k string, _ int64) error {
		if k == id || rival != "" {
			return nil
		}
		other := strings.TrimPrefix(k, "locks/")
		if kind == "backup" && !strings.HasPrefix(other, "collect-") {
			return nil
		}
		data, err := r.store.Get(ctx, k, 1<<12)
		if err != nil {
			return nil
		}
		var rec lockRecord
		if json.Unmarshal(data, &rec) == nil && time.Since(rec.CreatedAt) < lockTTL {
			rival = other
		}
		return nil
	})
	if err == nil && rival != "" {
		err = fmt.Errorf("%s holds it: %w", rival, ErrLocked)
	}
	if err != nil {
		release()
		return nil, err
	}
	return release, nil
}
