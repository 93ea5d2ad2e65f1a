package backup

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/quiverstorage/quiver/internal/objstore"
)

// repackBelow: a pack whose blocks still in use take less than this
// fraction of it is rewritten (its used blocks copied into new packs, as
// they are, still sealed) and removed. Packs above it are kept whole, the
// unused blocks in them included.
const repackBelow = 0.5

// Collect removes what no backup uses: packs none of whose blocks a
// manifest names (left by deleted backups, or stored by backups that failed
// midway, or without an index), and packs mostly unused, after copying
// their used blocks into new packs. It refuses to run beside a backup. It
// returns the packs removed and the bytes freed (less those of new packs).
//
// Order, so that a collection stopped at any point loses nothing: new
// packs and their indexes are stored first; then an old pack's index is
// removed, then the pack.
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
		return 0, 0, fmt.Errorf("%d backup manifests cannot be read (first: %w): nothing collected, as their blocks cannot be told apart",
			len(bad), bad[0])
	}
	used := map[BlockID]bool{}
	for _, m := range list {
		for _, d := range m.Disks {
			for _, id := range d.Blocks {
				used[id] = true
			}
		}
	}
	if err := r.refresh(ctx); err != nil {
		return 0, 0, err
	}
	indexed := r.idx.snapshot()
	packSize := map[string]int64{}
	err = r.store.List(ctx, "packs/", func(k string, size int64) error {
		if p := k[strings.LastIndexByte(k, '/')+1:]; validPack(p) {
			packSize[p] = size
		}
		return nil
	})
	if err != nil {
		return 0, 0, err
	}
	var drop, repack []string
	for p := range packSize {
		entries, ok := indexed[p]
		if !ok {
			drop = append(drop, p) // no index: a backup stopped between the two
			continue
		}
		var inUse int64
		for _, e := range entries {
			if used[e.ID] {
				inUse += int64(e.Length)
			}
		}
		switch {
		case inUse == 0:
			drop = append(drop, p)
		case float64(inUse) < repackBelow*float64(packSize[p]):
			repack = append(repack, p)
		}
	}
	slices.Sort(repack)
	written, err := r.repack(ctx, repack, indexed, used)
	if err != nil {
		return 0, 0, err
	}
	freed = -written
	for _, p := range append(drop, repack...) {
		if _, ok := indexed[p]; ok {
			if err := r.store.Delete(ctx, indexKey(p)); err != nil {
				return removed, freed, err
			}
		}
		if err := r.store.Delete(ctx, packKey(p)); err != nil {
			return removed, freed, err
		}
		removed++
		freed += packSize[p]
	}
	r.idx.keepOnly(withoutPacks(indexed, append(drop, repack...)))
	return removed, freed, nil
}

func withoutPacks(indexed map[string][]indexEntry, gone []string) map[string]int64 {
	keep := map[string]int64{}
	for p := range indexed {
		keep[p] = 0
	}
	for _, p := range gone {
		delete(keep, p)
	}
	return keep
}

// repack copies the used blocks of packs into new packs, unless a pack
// kept holds them too, and returns the bytes stored.
func (r *Repository) repack(ctx context.Context, packs []string, indexed map[string][]indexEntry, used map[BlockID]bool) (int64, error) {
	if len(packs) == 0 {
		return 0, nil
	}
	elsewhere := map[BlockID]bool{}
	for p, entries := range indexed {
		if !slices.Contains(packs, p) {
			for _, e := range entries {
				elsewhere[e.ID] = true
			}
		}
	}
	pk := newPacker(ctx, r)
	for _, p := range packs {
		data, err := r.store.Get(ctx, packKey(p), r.cfg.PackSize+4*BlockSize+1<<20)
		if errors.Is(err, objstore.ErrNotFound) {
			continue
		}
		if err != nil {
			pk.abandon()
			return 0, err
		}
		var blocks []sealedBlock
		for _, e := range indexed[p] {
			if !used[e.ID] || elsewhere[e.ID] || int64(e.Offset)+int64(e.Length) > int64(len(data)) {
				continue
			}
			elsewhere[e.ID] = true
			blocks = append(blocks, sealedBlock{e.ID, data[e.Offset : e.Offset+e.Length]})
		}
		if err := pk.add(blocks); err != nil {
			pk.abandon()
			return 0, err
		}
	}
	if err := pk.finish(); err != nil {
		return 0, fmt.Errorf("repack: %w", err)
	}
	return pk.sent.Load(), nil
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
