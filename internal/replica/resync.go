package replica

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/quiverstorage/quiver/internal/pool"
)

// ErrResync: a resync could not start or was stopped.
var ErrResync = errors.New("resync stopped")

// ErrBitmapLeft: Rejoin put the copy back in sync but could not remove its
// dirty bitmap (removed when the disk's Set next opens).
var ErrBitmapLeft = errors.New("copy in sync, but its dirty bitmap could not be removed")

// Resync brings one out-of-sync copy of a disk back (docs/cluster.md,
// "Degraded mode and resync"). From BeginResync on, every change of the disk
// goes to the copy as well (a mirror: a failure there stops the resync, not
// the request); Run copies the granules that were dirty when it began, each
// under its byte range lock, so a change to a granule being copied waits
// and lands after it, on both sides; Rejoin, with the gate held
// exclusively, flushes the copy and makes it in sync.
//
// Durability: the copy is out of sync until Rejoin, and its dirty bitmap
// covers every change it may lack until then. Every change mirrored to it
// is marked in the bitmap, durably, before it is applied, as while the copy
// was behind (a first change to a clean granule costs one bitmap write and
// fdatasync, none after); the bitmap keeps every bit until Rejoin removes
// it. So a resync that stops, however it stops (a failed request, Abort,
// a failed Rejoin, Retire, Close) or a crash of the primary, leaves in the
// bitmap the granules copied and every change mirrored since BeginResync,
// flushed on the copy or not, for the next resync to copy again. (Marking
// at the stop only what the copy had not flushed would spare those syncs,
// but a crash of the primary during the resync would leave the mirrored
// changes unmarked.)
type Resync struct {
	s      *Set
	node   string
	c      *conn
	ranges [][2]int64
	total  int64
	copied atomic.Int64 // bytes of granules done
	sent   atomic.Int64 // bytes of data sent (holes go as zeroes)

	mu  sync.Mutex
	err error
}

// BeginResync connects to the copy cp of an out-of-sync node and starts
// mirroring every change to it.
func (s *Set) BeginResync(ctx context.Context, cp Copy) (*Resync, error) {
	c, err := dial(ctx, cp.Addr, cp.export(), s.opts.Timeout)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrResync, err)
	}
	if c.size != s.size {
		c.close()
		return nil, fmt.Errorf("%w: copy on %s is %d bytes, the primary's disk %d", ErrResync, cp.Node, c.size, s.size)
	}
	s.mu.Lock()
	stale := s.inSync[cp.Node] != nil
	s.mu.Unlock()
	if stale {
		// The copy left the in-sync set through another disk of the
		// volume, and this disk's Set has not written it since: drop it
		// here too (the changes since the last flush are marked).
		if err := s.drop(cp.Node, errors.New("out of sync in the cluster"), 0, 0); err != nil {
			c.close()
			return nil, fmt.Errorf("%w: %w", ErrResync, err)
		}
	}
	s.gate.Lock() // no change in flight: each one before has marked the bitmap
	defer s.gate.Unlock()
	s.mu.Lock()
	defer s.mu.Unlock()
	b := s.bitmaps[cp.Node]
	switch {
	case s.closed:
		err = errors.New("the disk's replication is closed")
	case s.inSync[cp.Node] != nil:
		err = fmt.Errorf("copy on %s is in sync", cp.Node)
	case s.resync[cp.Node] != nil:
		err = fmt.Errorf("copy on %s is being resynced", cp.Node)
	case b == nil:
		err = fmt.Errorf("copy on %s has no dirty bitmap here", cp.Node)
	}
	if err != nil {
		c.close()
		return nil, fmt.Errorf("%w: %w", ErrResync, err)
	}
	r := &Resync{s: s, node: cp.Node, c: c, ranges: b.Ranges()}
	for _, rg := range r.ranges {
		r.total += rg[1]
	}
	s.resync[cp.Node] = r
	return r, nil
}

// Total is the bytes of the granules to copy; Copied those done so far;
// Sent the data bytes sent for them (less when some were holes).
func (r *Resync) Total() int64  { return r.total }
func (r *Resync) Copied() int64 { return r.copied.Load() }
func (r *Resync) Sent() int64   { return r.sent.Load() }

// Err is why the resync stopped, or nil.
func (r *Resync) Err() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.err
}

func (r *Resync) fail(err error) {
	r.mu.Lock()
	if r.err == nil {
		r.err = fmt.Errorf("%w: copy on %s: %w", ErrResync, r.node, err)
	}
	r.mu.Unlock()
	r.c.close()
}

// stopResync ends r: the copy is out of sync as before. Nothing is marked:
// every change mirrored to it, the failed one too, was marked in its bitmap
// before it was applied.
func (s *Set) stopResync(r *Resync, cause error) {
	s.mu.Lock()
	if s.resync[r.node] == r {
		delete(s.resync, r.node)
	}
	s.mu.Unlock()
	r.fail(cause)
}

// Abort stops the resync; the copy stays out of sync with its bitmap.
func (r *Resync) Abort(cause error) { r.s.stopResync(r, cause) }

// Run copies the dirty granules from src (a handle of the local disk),
// calling wait before each (a rate limit; nil: none). It returns when all
// are copied, or the resync stopped, or ctx ended (then the resync is
// aborted).
func (r *Resync) Run(ctx context.Context, src pool.Disk, wait func(ctx context.Context, n int) error) error {
	buf := make([]byte, r.s.opts.Granule)
	for _, rg := range r.ranges {
		if err := r.Err(); err != nil {
			return err
		}
		if wait != nil {
			if err := wait(ctx, int(rg[1])); err != nil {
				r.Abort(err)
				return r.Err()
			}
		}
		if err := ctx.Err(); err != nil {
			r.Abort(err)
			return r.Err()
		}
		if err := r.copyRange(src, rg[0], rg[1], buf); err != nil {
			r.Abort(err)
			return r.Err()
		}
		r.copied.Add(rg[1])
	}
	return r.Err()
}

// copyRange copies one granule under its range lock: data as writes, holes
// as zeroes that may trim.
func (r *Resync) copyRange(src pool.Disk, off, length int64, buf []byte) error {
	s := r.s
	lk := s.ranges.lock(off, length)
	defer s.ranges.unlock(lk)
	s.gate.RLock()
	defer s.gate.RUnlock()
	if err := r.Err(); err != nil {
		return err
	}
	exts, err := src.Extents(off, length, 0)
	if err != nil || len(exts) == 0 {
		exts = []pool.Extent{{Offset: off, Length: length}}
	}
	for _, e := range exts {
		if e.Hole {
			if err := r.c.zero(e.Offset, e.Length, true, false); err != nil {
				return err
			}
			continue
		}
		p := buf[:e.Length]
		if err := src.ReadAt(p, e.Offset); err != nil {
			return fmt.Errorf("read the primary's disk: %w", err)
		}
		if err := r.c.write(p, e.Offset, false); err != nil {
			return err
		}
		r.sent.Add(e.Length)
	}
	return nil
}

// Rejoin makes the copies of finished resyncs (one per disk of a volume,
// in one order for every caller) in sync: with every disk's gate held
// exclusively (no change in flight), it flushes each copy, calls commit
// (the etcd transaction that puts the copy back in the in-sync set), and
// from then on writes each copy as in sync and removes its bitmap. When
// commit fails the outcome is unknown, so the copy is recorded out of sync
// again (Options.Diverged, else Options.OutOfSync) before the gates open;
// if even that fails the disks' Sets refuse every change from then on
// (ErrNotAcknowledged), never acknowledging one that an in-sync copy might
// lack.
func Rejoin(rs []*Resync, commit func() error) error {
	for _, r := range rs {
		r.s.gate.Lock()
		defer r.s.gate.Unlock()
	}
	abort := func(err error) error {
		for _, r := range rs {
			r.s.stopResync(r, err)
		}
		return err
	}
	for _, r := range rs {
		if err := r.Err(); err != nil {
			return abort(err)
		}
		if r.Copied() != r.total {
			return abort(fmt.Errorf("%w: copy on %s: %d of %d bytes copied", ErrResync, r.node, r.Copied(), r.total))
		}
	}
	for _, r := range rs {
		if err := r.c.flush(); err != nil {
			return abort(fmt.Errorf("flush the copy on %s: %w", r.node, err))
		}
	}
	if err := commit(); err != nil {
		node := rs[0].node
		// The commit's outcome may be unknown: a put-back still on its
		// way must not take effect after this. Diverged records the copy
		// out of sync whatever the record says now (a cluster's rewrites
		// the record, so a commit that compares the record's revision can
		// no longer apply); OutOfSync leaves a record that already shows
		// the copy out of sync as it is.
		record := rs[0].s.opts.OutOfSync
		if d := rs[0].s.opts.Diverged; d != nil {
			record = d
		}
		if oerr := record(node, err); oerr != nil {
			for _, r := range rs {
				r.s.mu.Lock()
				r.s.closed = true
				r.s.mu.Unlock()
			}
			return abort(fmt.Errorf("%w: putting copy %s back in sync: %w (and recording it out of sync again: %w)",
				ErrNotAcknowledged, node, err, oerr))
		}
		return abort(fmt.Errorf("putting copy %s back in sync: %w", node, err))
	}
	var errs error
	for _, r := range rs {
		s := r.s
		s.mu.Lock()
		delete(s.resync, r.node)
		s.inSync[r.node] = r.c
		b := s.bitmaps[r.node]
		delete(s.bitmaps, r.node)
		s.mu.Unlock()
		if b != nil {
			errs = errors.Join(errs, b.Remove())
		}
	}
	if errs != nil {
		// The copy is in sync; a bitmap left behind is removed when the
		// disk's Set next opens with the copy in sync.
		return fmt.Errorf("%w: %w", ErrBitmapLeft, errs)
	}
	return nil
}
