package backup

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
)

// sealedBlock is a block ready for a pack.
type sealedBlock struct {
	id   BlockID
	data []byte
}

// packer appends sealed blocks into packs and stores each pack, then its
// index, a few at a time. A pack's blocks are known to the repository's
// index (and so to deduplication and reads) only once both are stored.
type packer struct {
	r        *Repository
	ctx      context.Context
	mu       sync.Mutex
	buf      []byte
	entries  []indexEntry
	inflight chan struct{} // one token per pack being stored
	wg       sync.WaitGroup
	errMu    sync.Mutex
	err      error
	sent     atomic.Int64 // bytes stored: packs and indexes
	packs    atomic.Int64
}

// packUploads is how many packs are stored at once.
const packUploads = 4

func newPacker(ctx context.Context, r *Repository) *packer {
	return &packer{r: r, ctx: ctx, inflight: make(chan struct{}, packUploads)}
}

func (p *packer) failed() error {
	p.errMu.Lock()
	defer p.errMu.Unlock()
	return p.err
}

func (p *packer) fail(err error) {
	p.errMu.Lock()
	defer p.errMu.Unlock()
	if p.err == nil {
		p.err = err
	}
}

// add appends blocks to the open pack, one after the other, and stores the
// pack once it is full. It blocks while packUploads packs are being
// stored.
func (p *packer) add(blocks []sealedBlock) error {
	if err := p.failed(); err != nil {
		return err
	}
	if len(blocks) == 0 {
		return nil
	}
	p.mu.Lock()
	if p.buf == nil {
		p.buf = make([]byte, 0, p.r.cfg.PackSize+2*BlockSize)
	}
	for _, b := range blocks {
		p.entries = append(p.entries, indexEntry{ID: b.id, Offset: uint32(len(p.buf)), Length: uint32(len(b.data))})
		p.buf = append(p.buf, b.data...)
	}
	var full []byte
	var entries []indexEntry
	if int64(len(p.buf)) >= p.r.cfg.PackSize {
		full, entries = p.buf, p.entries
		p.buf, p.entries = nil, nil
	}
	p.mu.Unlock()
	if full != nil {
		return p.store(full, entries)
	}
	return nil
}

// store stores one pack and its index, in the background.
func (p *packer) store(data []byte, entries []indexEntry) error {
	select {
	case p.inflight <- struct{}{}:
	case <-p.ctx.Done():
		return p.ctx.Err()
	}
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		defer func() { <-p.inflight }()
		if p.failed() != nil {
			return
		}
		if err := p.r.storePack(p.ctx, data, entries, &p.sent); err != nil {
			p.fail(err)
			return
		}
		p.packs.Add(1)
	}()
	return p.failed()
}

// finish stores the last pack and waits until every pack and index is
// stored: after a nil return, every block added is in the repository.
func (p *packer) finish() error {
	p.mu.Lock()
	data, entries := p.buf, p.entries
	p.buf, p.entries = nil, nil
	p.mu.Unlock()
	var err error
	if len(entries) > 0 {
		err = p.store(data, entries)
	}
	p.wg.Wait()
	if ferr := p.failed(); ferr != nil {
		return ferr
	}
	return err
}

// abandon drops the open pack and waits for the packs being stored (they
// are garbage for Collect once no manifest names their blocks).
func (p *packer) abandon() {
	p.mu.Lock()
	p.buf, p.entries = nil, nil
	p.mu.Unlock()
	p.wg.Wait()
}

// storePack stores a pack, then its index (the order that makes a pack
// usable only once whole), then makes its blocks known.
func (r *Repository) storePack(ctx context.Context, data []byte, entries []indexEntry, sent *atomic.Int64) error {
	pack := randomID(16)
	if err := r.store.Put(ctx, packKey(pack), data); err != nil {
		return fmt.Errorf("pack %s: %w", pack, err)
	}
	idx, err := r.seal(encodeIndex(entries), "index:"+pack)
	if err != nil {
		return err
	}
	if err := r.store.Put(ctx, indexKey(pack), idx); err != nil {
		return fmt.Errorf("index of pack %s: %w", pack, err)
	}
	sent.Add(int64(len(data) + len(idx)))
	r.cacheIndex(pack, idx)
	r.idx.add(pack, entries)
	return nil
}
