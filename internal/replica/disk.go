package replica

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/quiverstorage/quiver/internal/pool"
)

// Copy says where one copy of a disk is served: the copy node's NBD address
// and the export name (with the token of the primary's attachment there).
type Copy struct {
	Node   string
	Addr   string
	Export string
}

// Options configure a Disk.
type Options struct {
	// Timeout bounds each request to a copy (default 5 s): a copy that
	// does not answer in time is down.
	Timeout time.Duration
	// Granule is the unit of dirty tracking (default 1 MiB).
	Granule int64
	// OutOfSync records, durably, that copy node no longer holds every
	// acknowledged write (for a cluster: an etcd transaction at the
	// primary's term). It is called once per copy that fails, before the
	// request that found the failure is answered; when it fails the request
	// fails too and is never acknowledged.
	OutOfSync func(node string, cause error) error
	// Ranges orders overlapping changes: every handle of one disk must
	// share it (nil: a lock of this handle's own, right only when it is the
	// disk's one handle).
	Ranges *RangeLock
}

// Disk is a primary's disk handle that keeps every in-sync copy as the
// local disk: WRITE, TRIM, WRITE_ZEROES and FLUSH are applied locally and on
// each in-sync copy at once and answered when all have answered; changes
// that overlap one in flight wait for it (Options.Ranges). Durability
// is the local disk's contract (pool.Disk) on every in-sync copy: a write is
// durable everywhere after a later Flush, a FUA one when acknowledged. Reads
// are local. Its methods are safe for concurrent use.
type Disk struct {
	local pool.Disk
	opts  Options

	mu     sync.Mutex
	copies map[string]*conn // in sync
	dirty  *Dirty
}

var _ pool.Disk = (*Disk)(nil)

// Open connects to every copy and returns the replicated handle. A copy
// that cannot be reached is recorded out of sync at once (OutOfSync); if
// that fails, Open fails.
func Open(ctx context.Context, local pool.Disk, copies []Copy, opts Options) (*Disk, error) {
	if opts.Timeout <= 0 {
		opts.Timeout = 5 * time.Second
	}
	if opts.Granule <= 0 {
		opts.Granule = 1 << 20
	}
	if opts.Ranges == nil {
		opts.Ranges = NewRangeLock()
	}
	d := &Disk{local: local, opts: opts, copies: map[string]*conn{}, dirty: newDirty(local.Size(), opts.Granule)}
	for _, cp := range copies {
		c, err := dial(ctx, cp.Addr, cp.Export, opts.Timeout)
		if err == nil && c.size != local.Size() {
			c.close()
			err = fmt.Errorf("copy on %s is %d bytes, the primary's disk %d: %w", cp.Node, c.size, local.Size(), ErrCopyRefused)
		}
		if err != nil {
			if oerr := opts.OutOfSync(cp.Node, err); oerr != nil {
				d.closeCopies()
				return nil, fmt.Errorf("%w: copy on %s: %w (recording it out of sync: %w)", ErrNotAcknowledged, cp.Node, err, oerr)
			}
			continue
		}
		d.copies[cp.Node] = c
	}
	return d, nil
}

// InSync lists the copies written to now.
func (d *Disk) InSync() []string {
	d.mu.Lock()
	defer d.mu.Unlock()
	out := make([]string, 0, len(d.copies))
	for n := range d.copies {
		out = append(out, n)
	}
	return out
}

// Dirty is what changed since a copy left the in-sync set.
func (d *Disk) Dirty() *Dirty { return d.dirty }

// replicate runs local and remote (on every in-sync copy) at once and
// returns local's error. A copy that fails is recorded out of sync before
// this returns; if that cannot be recorded, the request fails. Whenever the
// copies may differ afterwards (a copy failed, or the local disk failed
// while copies applied the change) the range is marked dirty.
func (d *Disk) replicate(off, length int64, local func() error, remote func(*conn) error) error {
	if length > 0 {
		r := d.opts.Ranges.lock(off, length)
		defer d.opts.Ranges.unlock(r)
	}
	return d.replicateLocked(off, length, local, remote)
}

// replicateLocked is replicate with the range held by the caller.
func (d *Disk) replicateLocked(off, length int64, local func() error, remote func(*conn) error) error {
	d.mu.Lock()
	copies := make(map[string]*conn, len(d.copies))
	for n, c := range d.copies {
		copies[n] = c
	}
	if len(d.copies) == 0 && length > 0 {
		d.dirty.mark(off, length) // degraded: every change is for the resync
	}
	d.mu.Unlock()
	errs := make(map[string]error, len(copies))
	var wg sync.WaitGroup
	var emu sync.Mutex
	for n, c := range copies {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := remote(c); err != nil {
				emu.Lock()
				errs[n] = err
				emu.Unlock()
			}
		}()
	}
	lerr := local()
	wg.Wait()
	if lerr != nil && len(errs) < len(copies) && length > 0 {
		d.dirty.mark(off, length)
	}
	var failed error
	for n, err := range errs {
		if length > 0 {
			d.dirty.mark(off, length)
		}
		if err := d.drop(n, err); err != nil {
			failed = errors.Join(failed, err)
		}
	}
	if failed != nil {
		return failed
	}
	return lerr
}

// drop takes a failed copy out of the in-sync set, once it is recorded.
func (d *Disk) drop(node string, cause error) error {
	d.mu.Lock()
	c, ok := d.copies[node]
	d.mu.Unlock()
	if !ok {
		return nil // dropped by a concurrent request
	}
	if err := d.opts.OutOfSync(node, cause); err != nil {
		return fmt.Errorf("%w: copy on %s: %w (recording it out of sync: %w)", ErrNotAcknowledged, node, cause, err)
	}
	d.mu.Lock()
	if d.copies[node] == c {
		delete(d.copies, node)
	}
	d.mu.Unlock()
	c.close()
	return nil
}

func (d *Disk) Size() int64                      { return d.local.Size() }
func (d *Disk) ReadOnly() bool                   { return d.local.ReadOnly() }
func (d *Disk) ReadAt(p []byte, off int64) error { return d.local.ReadAt(p, off) }
func (d *Disk) Cache(off, length int64) error    { return d.local.Cache(off, length) }
func (d *Disk) Extents(off, length int64, limit int) ([]pool.Extent, error) {
	return d.local.Extents(off, length, limit)
}

// WriteAt writes p locally and on every in-sync copy.
func (d *Disk) WriteAt(p []byte, off int64, fua bool) error {
	return d.replicate(off, int64(len(p)), func() error { return d.local.WriteAt(p, off, fua) },
		func(c *conn) error { return c.write(p, off, fua) })
}

// Flush makes every acknowledged write durable locally and on every in-sync
// copy.
func (d *Disk) Flush() error {
	return d.replicate(0, 0, d.local.Flush, (*conn).flush)
}

func (d *Disk) Trim(off, length int64, fua bool) error {
	return d.replicate(off, length, func() error { return d.local.Trim(off, length, fua) },
		func(c *conn) error { return c.trim(off, length, fua) })
}

// Zero zeroes locally and on the copies. A fast zero the local disk cannot
// do is not sent: the client falls back to writing zeros.
func (d *Disk) Zero(off, length int64, flags pool.ZeroFlags) error {
	mayTrim, fua := flags&pool.ZeroMayTrim != 0, flags&pool.ZeroFUA != 0
	if flags&pool.ZeroFast != 0 {
		r := d.opts.Ranges.lock(off, length)
		defer d.opts.Ranges.unlock(r)
		if err := d.local.Zero(off, length, flags); err != nil {
			return err
		}
		return d.replicateLocked(off, length, func() error { return nil },
			func(c *conn) error { return c.zero(off, length, mayTrim, fua) })
	}
	return d.replicate(off, length, func() error { return d.local.Zero(off, length, flags) },
		func(c *conn) error { return c.zero(off, length, mayTrim, fua) })
}

// Close closes the local handle and the copies' connections.
func (d *Disk) Close() error {
	d.closeCopies()
	return d.local.Close()
}

func (d *Disk) closeCopies() {
	d.mu.Lock()
	cs := d.copies
	d.copies = map[string]*conn{}
	d.mu.Unlock()
	for _, c := range cs {
		c.close()
	}
}
