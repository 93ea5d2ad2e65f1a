package backup

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"

	"golang.org/x/sync/errgroup"

	"github.com/quiverstorage/quiver/internal/objstore"
)

// location is where a block is stored.
type location struct {
	pack   string
	offset uint32
	length uint32
}

// index is the repository's pack indexes, as last loaded: which block is
// in which pack. It is what deduplication and every read go by, refreshed
// from a listing of index/ before each use (refresh).
type index struct {
	mu     sync.RWMutex
	packs  map[string][]indexEntry // pack -> its entries
	blocks map[BlockID]location
}

func newIndex() *index {
	return &index{packs: map[string][]indexEntry{}, blocks: map[BlockID]location{}}
}

func (x *index) lookup(id BlockID) (location, bool) {
	x.mu.RLock()
	defer x.mu.RUnlock()
	l, ok := x.blocks[id]
	return l, ok
}

func (x *index) has(id BlockID) bool {
	_, ok := x.lookup(id)
	return ok
}

// add makes a pack's blocks known; a block already known elsewhere keeps
// its first location.
func (x *index) add(pack string, entries []indexEntry) {
	x.mu.Lock()
	defer x.mu.Unlock()
	x.addLocked(pack, entries)
}

func (x *index) addLocked(pack string, entries []indexEntry) {
	x.packs[pack] = entries
	for _, e := range entries {
		if _, ok := x.blocks[e.ID]; !ok {
			x.blocks[e.ID] = location{pack, e.Offset, e.Length}
		}
	}
}

// keepOnly drops every pack not in names.
func (x *index) keepOnly(names map[string]int64) {
	x.mu.Lock()
	defer x.mu.Unlock()
	gone := false
	for p := range x.packs {
		if _, ok := names[p]; !ok {
			delete(x.packs, p)
			gone = true
		}
	}
	if gone {
		x.blocks = map[BlockID]location{}
		for p, entries := range x.packs {
			x.addLocked(p, entries)
		}
	}
}

func (x *index) snapshot() map[string][]indexEntry {
	x.mu.RLock()
	defer x.mu.RUnlock()
	out := make(map[string][]indexEntry, len(x.packs))
	for p, e := range x.packs {
		out[p] = e
	}
	return out
}

func packKey(pack string) string  { return "packs/" + pack[:2] + "/" + pack }
func indexKey(pack string) string { return "index/" + pack }

// validPack checks a pack name read from the store.
func validPack(name string) bool {
	if len(name) != 32 {
		return false
	}
	for _, c := range name {
		if !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f') {
			return false
		}
	}
	return true
}

// refresh brings the index up to the store's: it lists index/, drops the
// packs no longer there and loads the indexes it has not seen, from the
// local cache when it holds them, else from the store (and caches them).
func (r *Repository) refresh(ctx context.Context) error {
	names := map[string]int64{}
	err := r.store.List(ctx, "index/", func(k string, size int64) error {
		if p := strings.TrimPrefix(k, "index/"); validPack(p) {
			names[p] = size
		}
		return nil
	})
	if err != nil {
		return err
	}
	r.idx.keepOnly(names)
	have := r.idx.snapshot()
	r.pruneCache(names)
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(8)
	for p, size := range names {
		if _, ok := have[p]; ok {
			continue
		}
		g.Go(func() error {
			entries, err := r.loadIndex(gctx, p, size)
			if err != nil {
				return err
			}
			r.idx.add(p, entries)
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		return fmt.Errorf("loading the pack indexes: %w", err)
	}
	return nil
}

func (r *Repository) cacheDir() string {
	if r.opts.CacheDir == "" {
		return ""
	}
	return filepath.Join(r.opts.CacheDir, r.cfg.ID, "index")
}

// loadIndex reads one pack's index: the cached copy when it is the size
// listed and opens (authenticated under the repository's key, bound to the
// pack's name), else the store's.
func (r *Repository) loadIndex(ctx context.Context, pack string, size int64) ([]indexEntry, error) {
	if dir := r.cacheDir(); dir != "" {
		if data, err := os.ReadFile(filepath.Join(dir, pack)); err == nil && int64(len(data)) == size {
			if entries, err := r.openIndex(pack, data); err == nil {
				return entries, nil
			}
		}
	}
	data, err := r.store.Get(ctx, indexKey(pack), maxMeta)
	if errors.Is(err, objstore.ErrNotFound) {
		return nil, nil // removed since the listing: nothing in it
	}
	if err != nil {
		return nil, err
	}
	entries, err := r.openIndex(pack, data)
	if err != nil {
		return nil, err
	}
	r.cacheIndex(pack, data)
	return entries, nil
}

func (r *Repository) openIndex(pack string, data []byte) ([]indexEntry, error) {
	p, err := r.open(data, "index:"+pack, maxMeta)
	if err != nil {
		return nil, err
	}
	entries, err := decodeIndex(p)
	if err != nil {
		return nil, fmt.Errorf("index of pack %s: %w: %w", pack, err, ErrCorrupt)
	}
	return entries, nil
}

// cacheIndex keeps a copy of an index object (best effort: a cache that
// cannot be written only costs a later GET; a torn copy fails to open and
// is fetched again).
func (r *Repository) cacheIndex(pack string, data []byte) {
	dir := r.cacheDir()
	if dir == "" {
		return
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return
	}
	tmp, err := os.CreateTemp(dir, ".tmp-*")
	if err != nil {
		return
	}
	_, err = tmp.Write(data)
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp.Name(), filepath.Join(dir, pack))
	}
	if err != nil {
		_ = os.Remove(tmp.Name())
	}
}

// pruneCache removes cached indexes of packs that are gone, and leftovers
// of interrupted writes.
func (r *Repository) pruneCache(names map[string]int64) {
	dir := r.cacheDir()
	if dir == "" {
		return
	}
	ents, err := os.ReadDir(dir)
	if err != nil {
		return
	}
	for _, e := range ents {
		if _, ok := names[e.Name()]; !ok {
			_ = os.Remove(filepath.Join(dir, e.Name()))
		}
	}
}
