package backup

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"

	"golang.org/x/sync/errgroup"

	"github.com/quiverstorage/quiver/internal/objstore"
)

// Sink receives a restore.
type Sink interface {
	// WriteAt writes into a disk that reads as zeros where nothing is
	// written.
	WriteAt(disk string, p []byte, off int64) error
}

// place is where a block of a backup goes.
type place struct {
	disk string
	off  int64
	n    int64
}

// need is one block a restore or a verify reads: where it is stored and
// where it goes.
type need struct {
	id     BlockID
	loc    location
	places []place
}

// fetch is one range GET of a pack and the blocks it holds.
type fetch struct {
	pack       string
	start, end int64
	needs      []*need
}

const (
	// fetchMax bounds one range GET: a pack read whole is read in a few
	// ranges, in parallel.
	fetchMax = 4 << 20
	// fetchGap: blocks of one pack closer than this are read in one GET
	// (the bytes between cost less than another request).
	fetchGap = 256 << 10
)

// plan finds where every non-zero block of backup m's disks (those named,
// when any) is stored and groups them into range GETs, in pack order.
// Blocks in no pack are returned in missing.
func (r *Repository) plan(m *Manifest, disks []string) (fetches []*fetch, missing []BadChunk, total int64) {
	byID := map[BlockID]*need{}
	byPack := map[string][]*need{}
	for _, d := range m.Disks {
		if len(disks) > 0 && !slices.Contains(disks, d.Name) {
			continue
		}
		total += d.Size
		for i, id := range d.Blocks {
			if id.IsZero() {
				continue
			}
			off := int64(i) * BlockSize
			pl := place{d.Name, off, min(BlockSize, d.Size-off)}
			if n := byID[id]; n != nil {
				n.places = append(n.places, pl)
				continue
			}
			loc, ok := r.idx.lookup(id)
			if !ok {
				missing = append(missing, BadChunk{ID: id.String(), Disk: d.Name, Offset: off,
					Error: fmt.Sprintf("block %s: in no pack of the repository", id)})
				continue
			}
			n := &need{id: id, loc: loc, places: []place{pl}}
			byID[id] = n
			byPack[loc.pack] = append(byPack[loc.pack], n)
		}
	}
	packs := make([]string, 0, len(byPack))
	for p := range byPack {
		packs = append(packs, p)
	}
	slices.Sort(packs)
	for _, p := range packs {
		needs := byPack[p]
		slices.SortFunc(needs, func(a, b *need) int { return int(a.loc.offset) - int(b.loc.offset) })
		var f *fetch
		for _, n := range needs {
			s, e := int64(n.loc.offset), int64(n.loc.offset)+int64(n.loc.length)
			if f == nil || s-f.end > fetchGap || e-f.start > fetchMax {
				f = &fetch{pack: p, start: s, end: e}
				fetches = append(fetches, f)
			}
			f.end = max(f.end, e)
			f.needs = append(f.needs, n)
		}
	}
	return fetches, missing, total
}

// get reads a fetch's range of its pack.
func (r *Repository) get(ctx context.Context, f *fetch) ([]byte, error) {
	data, err := r.store.GetRange(ctx, packKey(f.pack), f.start, f.end-f.start)
	if errors.Is(err, objstore.ErrNotFound) {
		return nil, fmt.Errorf("pack %s: missing from the store: %w", f.pack, ErrCorrupt)
	}
	if errors.Is(err, objstore.ErrShort) {
		return nil, fmt.Errorf("pack %s: shorter than its index says: %w", f.pack, ErrCorrupt)
	}
	return data, err
}

// blockOf opens need n's block in data, a fetch's range read from f.start.
// The range of data it opens is overwritten.
func (r *Repository) blockOf(f *fetch, data []byte, n *need, dst []byte, check bool) ([]byte, error) {
	s := int64(n.loc.offset) - f.start
	p, err := r.openBlock(data[s:s+int64(n.loc.length)], n.id, dst, check)
	if err != nil {
		return nil, fmt.Errorf("pack %s at %d: %w", f.pack, n.loc.offset, err)
	}
	if int64(len(p)) != n.places[0].n {
		return nil, fmt.Errorf("pack %s at %d: block %s holds %d bytes, want %d: %w", f.pack, n.loc.offset, n.id, len(p),
			n.places[0].n, ErrCorrupt)
	}
	return p, nil
}

// Restore writes the disks of backup m (only those named in disks, when
// not empty) into sink: the blocks it needs, grouped by pack, are read in
// range GETs (parallel at most at once), opened (authenticated: see
// openBlock), and written at their offsets, adjacent blocks in one write.
// The first damaged block fails the restore, naming it and its pack.
func (r *Repository) Restore(ctx context.Context, m *Manifest, disks []string, sink Sink, prog Progress, parallel int) error {
	if prog == nil {
		prog = nopProgress{}
	}
	for _, name := range disks {
		if !slices.ContainsFunc(m.Disks, func(d DiskManifest) bool { return d.Name == name }) {
			return fmt.Errorf("backup %s has no disk %q: %w", m.ID, name, ErrInvalid)
		}
	}
	if err := r.refresh(ctx); err != nil {
		return fmt.Errorf("restore of backup %s: %w", m.ID, err)
	}
	fetches, missing, total := r.plan(m, disks)
	if len(missing) > 0 {
		b := missing[0]
		return fmt.Errorf("restore of backup %s: disk %s at %d: %s: %w", m.ID, b.Disk, b.Offset, b.Error, ErrCorrupt)
	}
	prog.AddTotal(total)
	stored := int64(0)
	for _, f := range fetches {
		for _, n := range f.needs {
			for _, pl := range n.places {
				stored += pl.n
			}
		}
	}
	prog.Add(total - stored) // the blocks of zeros
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(max(parallel, 1))
	for _, f := range fetches {
		if gctx.Err() != nil {
			break
		}
		g.Go(func() error { return r.restoreFetch(gctx, f, sink, prog) })
	}
	if err := g.Wait(); err != nil {
		return fmt.Errorf("restore of backup %s: %w", m.ID, err)
	}
	return ctx.Err()
}

// run is adjacent blocks of one disk, written at once.
type run struct {
	disk string
	off  int64
	buf  []byte
}

func (r *Repository) restoreFetch(ctx context.Context, f *fetch, sink Sink, prog Progress) error {
	data, err := r.get(ctx, f)
	if err != nil {
		return err
	}
	var cur run
	flush := func() error {
		if len(cur.buf) == 0 {
			return nil
		}
		if err := sink.WriteAt(cur.disk, cur.buf, cur.off); err != nil {
			return err
		}
		prog.Add(int64(len(cur.buf)))
		cur.buf = cur.buf[:0]
		return nil
	}
	block := make([]byte, BlockSize)
	for _, n := range f.needs {
		p, err := r.blockOf(f, data, n, block, false)
		if err != nil {
			pl := n.places[0]
			return fmt.Errorf("disk %s at %d: %w", pl.disk, pl.off, err)
		}
		for _, pl := range n.places {
			if len(cur.buf) == 0 || cur.disk != pl.disk || cur.off+int64(len(cur.buf)) != pl.off {
				if err := flush(); err != nil {
					return err
				}
				cur.disk, cur.off = pl.disk, pl.off
			}
			cur.buf = append(cur.buf, p...)
		}
	}
	return flush()
}

// BadChunk is a block that Verify could not read back intact (the name is
// the API's).
type BadChunk struct {
	ID     string `json:"id"`
	Pack   string `json:"pack,omitempty"`
	Disk   string `json:"disk"`
	Offset int64  `json:"offset"`
	Error  string `json:"error"`
}

// Verify reads every pack holding a block of backup m (the ranges that
// hold them) and checks every such block: it decrypts, decompresses and
// matches its address. It returns the damaged ones, each with the first
// disk and offset that use it. An error means the check could not run
// (the store).
func (r *Repository) Verify(ctx context.Context, m *Manifest, prog Progress, parallel int) ([]BadChunk, error) {
	if prog == nil {
		prog = nopProgress{}
	}
	if err := r.refresh(ctx); err != nil {
		return nil, fmt.Errorf("verify of backup %s: %w", m.ID, err)
	}
	fetches, bad, _ := r.plan(m, nil)
	for _, f := range fetches {
		prog.AddTotal(f.end - f.start)
	}
	var mu sync.Mutex
	report := func(f *fetch, n *need, err error) {
		mu.Lock()
		defer mu.Unlock()
		bad = append(bad, BadChunk{ID: n.id.String(), Pack: f.pack, Disk: n.places[0].disk, Offset: n.places[0].off,
			Error: err.Error()})
	}
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(max(parallel, 1))
	for _, f := range fetches {
		g.Go(func() error {
			defer prog.Add(f.end - f.start)
			data, err := r.get(gctx, f)
			if errors.Is(err, ErrCorrupt) {
				for _, n := range f.needs {
					report(f, n, err)
				}
				return nil
			}
			if err != nil {
				return err
			}
			block := make([]byte, BlockSize)
			for _, n := range f.needs {
				if _, err := r.blockOf(f, data, n, block, true); err != nil {
					report(f, n, err)
				}
			}
			return nil
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
