package replica

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"sync"
	"time"

	"github.com/quiverstorage/quiver/internal/pool"
)

// Copy says where one copy of a disk is served: the copy node's NBD address
// and how to name its export for a new connection.
type Copy struct {
	Node string
	Addr string
	// Session, when set, names the export of a new replication session
	// (Credential.Export, a new epoch for each call): every connection to
	// the copy is a session of its own, which fences the older ones.
	Session func() string
	// Export is a fixed export name, when Session is nil (a copy outside a
	// cluster: tests).
	Export string
}

// export names the copy's export for a new connection.
func (cp Copy) export() string {
	if cp.Session != nil {
		return cp.Session()
	}
	return cp.Export
}

// Options configure a Set.
type Options struct {
	// Timeout bounds each request to a copy (default 5 s): a copy that
	// does not answer in time is down.
	Timeout time.Duration
	// Granule is the unit of dirty tracking (default DefaultGranule).
	Granule int64
	// OutOfSync records, durably, that copy node no longer holds every
	// acknowledged write (for a cluster: an etcd transaction at the
	// primary's term). It is called once per copy that fails, before the
	// request that found the failure is answered; when it fails the request
	// fails too and is never acknowledged.
	OutOfSync func(node string, cause error) error
	// Diverged records, durably, that copy node may differ from the
	// primary anywhere, so that its resync copies it whole (a cluster's
	// MarkDiverged). An in-sync copy that fails when its dirty bitmap
	// cannot record its changes (the primary's pool failing) leaves the
	// in-sync set through Diverged instead of OutOfSync, so that it never
	// stays in sync without a change the primary applied. nil: such a copy
	// cannot leave, and the request is not acknowledged.
	Diverged func(node string, cause error) error
	// Bitmap opens the write-ahead dirty bitmap of this disk for copy node,
	// creating an empty one when there is none (created). nil: bitmaps in
	// memory only, lost with the process (tests).
	Bitmap func(node string) (b *Bitmap, created bool, err error)
	// Latency, when set, is told how long each change or flush took on a
	// copy (replication latency).
	Latency func(node string, d time.Duration)
	// Ranges orders overlapping changes: every Set of one disk must share
	// it (nil: a lock of the Set's own, right when it is the disk's one
	// Set).
	Ranges *RangeLock
	// Activity is the disk's activity log (nil: none), one holder's share
	// of it that the Set closes: every change is recorded in it before it
	// is applied anywhere, and ends in it when it returned.
	Activity *ActivityLog
}

// Set is the primary's replication state of one disk, shared by every
// handle of the disk (Disk): the connections to the in-sync copies, the
// dirty bitmaps of the copies out of sync, and the resyncs running.
//
// A change (WRITE, TRIM, WRITE_ZEROES) holds its byte range (RangeLock),
// is recorded in the disk's activity log (Options.Activity: durable before
// anything is applied; nothing to write for an extent already active), and
// holds the Set's gate shared. It is first marked, durably, in the bitmap of
// every copy not in sync (write-ahead): behind, being resynced (Resync), or
// leaving the in-sync set; then applied locally and on every in-sync and
// resyncing copy at once; it returns when all answered. A copy in sync that
// fails has the range marked, and the writes since its last completed FLUSH
// (they may be lost with it), before it is recorded out of sync
// (Options.OutOfSync); only then does the request return. The gate is
// taken exclusively to add a resyncing copy and to move a copy back in
// sync, so no change is in flight across either.
//
// Durability is the local disk's contract (pool.Disk) on every in-sync copy:
// a write is durable everywhere after a later Flush, a FUA one when
// acknowledged. Its methods are safe for concurrent use.
type Set struct {
	size   int64
	opts   Options
	ranges *RangeLock
	gate   sync.RWMutex
	dropMu sync.Mutex // one drop at a time: each marks its range

	mu        sync.Mutex
	inSync    map[string]*conn
	resync    map[string]*Resync
	bitmaps   map[string]*Bitmap // copies out of sync
	unflushed *Bitmap            // changed since the last flush began
	flushing  map[*Bitmap]struct{}
	// inflight are the changes not finished yet, by number: a change that
	// a flush overtook on a copy is not made durable there by it, so its
	// range stays known until it finishes (and is then marked in the
	// unflushed changes again).
	inflight   map[uint64][2]int64
	nextChange uint64
	closed     bool
}

// NewSet connects to the in-sync copies of a disk of size bytes and opens
// the bitmaps of the copies out of sync (behind). An
// in-sync copy that cannot be reached is recorded out of sync at once; if
// that fails, NewSet fails.
func NewSet(ctx context.Context, size int64, inSync []Copy, behind []string, opts Options) (*Set, error) {
	if opts.Timeout <= 0 {
		opts.Timeout = 5 * time.Second
	}
	if opts.Granule <= 0 {
		opts.Granule = DefaultGranule
	}
	if opts.Ranges == nil {
		opts.Ranges = NewRangeLock()
	}
	s := &Set{size: size, opts: opts, ranges: opts.Ranges, inSync: map[string]*conn{}, resync: map[string]*Resync{},
		bitmaps: map[string]*Bitmap{}, unflushed: MemoryBitmap(size, opts.Granule), flushing: map[*Bitmap]struct{}{},
		inflight: map[uint64][2]int64{}}
	for _, node := range behind {
		// A copy out of sync without a bitmap for this disk has missed no
		// change of it: every change since the copy left the in-sync set
		// went through a Set that made the bitmap before applying it.
		b, _, err := s.openBitmap(node)
		if err != nil {
			s.Close()
			return nil, err
		}
		s.bitmaps[node] = b
	}
	for _, cp := range inSync {
		c, err := dial(ctx, cp.Addr, cp.export(), opts.Timeout)
		if err == nil && c.size != size {
			c.close()
			err = fmt.Errorf("copy on %s is %d bytes, the primary's disk %d: %w", cp.Node, c.size, size, ErrCopyRefused)
		}
		if err != nil {
			if derr := s.dropUnconnected(cp.Node, err); derr != nil {
				s.Close()
				return nil, derr
			}
			continue
		}
		s.inSync[cp.Node] = c
	}
	return s, nil
}

func (s *Set) openBitmap(node string) (*Bitmap, bool, error) {
	if s.opts.Bitmap == nil {
		return MemoryBitmap(s.size, s.opts.Granule), true, nil
	}
	b, created, err := s.opts.Bitmap(node)
	if err != nil {
		return nil, false, fmt.Errorf("dirty bitmap for copy %s: %w", node, err)
	}
	return b, created, nil
}

// MarkWhole marks every granule dirty for a new copy (a rebuild), tracked
// as out of sync from now on if it was not: a resync then copies it whole
// (holes as zeroes that may trim, so only allocated ranges move data).
func (s *Set) MarkWhole(node string) error { return s.MarkRanges(node, [][2]int64{{0, s.size}}) }

// MarkRanges marks ranges dirty for a copy out of sync, tracked as out of
// sync from now on if it was not: an old primary's copy coming back, whose
// activity log (Activity.Ranges) says where it may differ beyond what the
// bitmap holds. Durable when it returns nil.
func (s *Set) MarkRanges(node string, ranges [][2]int64) error {
	s.gate.Lock() // no change in flight: each later one sees the bitmap
	defer s.gate.Unlock()
	s.mu.Lock()
	b := s.bitmaps[node]
	inSync := s.inSync[node] != nil || s.resync[node] != nil
	s.mu.Unlock()
	if inSync {
		return fmt.Errorf("copy on %s is written already", node)
	}
	if b == nil {
		var err error
		if b, _, err = s.openBitmap(node); err != nil {
			return err
		}
		s.mu.Lock()
		s.bitmaps[node] = b
		s.mu.Unlock()
	}
	for _, r := range ranges {
		if err := b.Mark(r[0], r[1]); err != nil {
			return err
		}
	}
	return nil
}

// Forget drops the bitmap of a copy that was replaced by another node's
// (its file too).
func (s *Set) Forget(node string) error {
	s.gate.Lock() // no change in flight marks it
	defer s.gate.Unlock()
	s.mu.Lock()
	b := s.bitmaps[node]
	delete(s.bitmaps, node)
	s.mu.Unlock()
	if b == nil {
		return nil
	}
	return b.Remove()
}

// Freeze waits until no change of the disk is in flight and holds every
// new one until the returned function is called: the cut at which a
// snapshot is taken on every copy.
func (s *Set) Freeze() (thaw func()) {
	s.gate.Lock()
	return s.gate.Unlock
}

// InSync lists the copies written to and in sync now.
func (s *Set) InSync() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]string, 0, len(s.inSync))
	for n := range s.inSync {
		out = append(out, n)
	}
	sort.Strings(out)
	return out
}

// Bitmap is the dirty bitmap of a copy not in sync (out of sync, being
// resynced, or leaving the in-sync set), or nil.
func (s *Set) Bitmap(node string) *Bitmap {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.bitmaps[node]
}

// Close closes the copies' connections and the bitmaps (they stay on
// disk) and aborts the resyncs.
func (s *Set) Close() {
	s.gate.Lock()
	defer s.gate.Unlock()
	s.mu.Lock()
	s.closed = true
	cs, rs, bs := s.inSync, s.resync, s.bitmaps
	s.inSync, s.resync = map[string]*conn{}, map[string]*Resync{}
	s.mu.Unlock()
	for _, c := range cs {
		c.close()
	}
	for _, r := range rs {
		r.fail(errors.New("the disk's replication closed"))
	}
	for _, b := range bs {
		_ = b.Close()
	}
	if s.opts.Activity != nil {
		_ = s.opts.Activity.Close()
	}
}

// Disk returns a handle that writes through the Set: local is this
// handle's own local disk. Closing the handle closes local only.
func (s *Set) Disk(local pool.Disk) *Disk { return &Disk{local: local, set: s} }

// change applies one change of [off, off+length) (length 0: a flush)
// locally and on every copy written to, as the Set's comment says.
// flush flushes the local disk (for the activity log).
func (s *Set) change(off, length int64, local func() error, remote func(*conn) error, read func([]byte, int64) error,
	flush func() error) error {
	if length > 0 {
		r := s.ranges.lock(off, length)
		defer s.ranges.unlock(r)
	}
	return s.changeLocked(off, length, false, local, remote, read, flush)
}

// changeLocked is change with the range held by the caller. With
// localFirst the local change runs alone first, and the copies get the
// change only when it succeeded.
func (s *Set) changeLocked(off, length int64, localFirst bool, local func() error, remote func(*conn) error,
	read func([]byte, int64) error, flush func() error) (err error) {
	if al := s.opts.Activity; al != nil {
		if length > 0 {
			held, aerr := al.Begin(off, length, flush)
			if aerr != nil {
				return fmt.Errorf("%w: recording the change in the activity log: %w", ErrNotAcknowledged, aerr)
			}
			if held {
				// A change that failed anywhere pins its extents.
				defer func() { al.End(off, length, err == nil) }()
			}
		} else {
			lflush := local
			local = func() error {
				gen := al.FlushBegin()
				err := lflush()
				if err == nil {
					al.Flushed(gen)
				}
				return err
			}
		}
	}
	s.gate.RLock()
	defer s.gate.RUnlock()
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return fmt.Errorf("%w: the disk's replication is closed", ErrNotAcknowledged)
	}
	targets := make(map[string]*conn, len(s.inSync)+len(s.resync))
	mirror := map[string]*Resync{}
	for n, c := range s.inSync {
		targets[n] = c
	}
	for n, r := range s.resync {
		targets[n], mirror[n] = r.c, r
	}
	// Every copy with a bitmap is marked, write-ahead: out of sync
	// (behind), being resynced (mirror), or leaving the in-sync set (drop).
	marks := make([]*Bitmap, 0, len(s.bitmaps))
	for _, b := range s.bitmaps {
		marks = append(marks, b)
	}
	var flushed *Bitmap
	if length > 0 {
		_ = s.unflushed.Mark(off, length) // in memory
		// A flush that begins while this change is in flight may reach a
		// copy before it (the connection is pipelined: NBD's FLUSH covers
		// only what completed before it was sent), and end before it: the
		// change stays in flight until it finishes, then is among the
		// changes the next flush must cover.
		id := s.nextChange
		s.nextChange++
		s.inflight[id] = [2]int64{off, length}
		defer func() {
			s.mu.Lock()
			delete(s.inflight, id)
			_ = s.unflushed.Mark(off, length)
			s.mu.Unlock()
		}()
	} else {
		// A flush makes durable what changed before it began.
		flushed = s.unflushed
		s.unflushed = MemoryBitmap(s.size, s.opts.Granule)
		s.flushing[flushed] = struct{}{}
	}
	s.mu.Unlock()
	if flushed != nil {
		defer func() {
			s.mu.Lock()
			delete(s.flushing, flushed)
			s.mu.Unlock()
		}()
	}
	if length > 0 {
		for _, b := range marks {
			if err := b.Mark(off, length); err != nil {
				return fmt.Errorf("%w: recording the change for a copy not in sync: %w", ErrNotAcknowledged, err)
			}
		}
	}

	if localFirst {
		if err := local(); err != nil {
			return err
		}
		local = func() error { return nil }
	}
	errs := make(map[string]error, len(targets))
	var wg sync.WaitGroup
	var emu sync.Mutex
	for n, c := range targets {
		wg.Add(1)
		go func() {
			defer wg.Done()
			start := time.Now()
			err := remote(c)
			if s.opts.Latency != nil && err == nil {
				s.opts.Latency(n, time.Since(start))
			}
			if err != nil {
				emu.Lock()
				errs[n] = err
				emu.Unlock()
			}
		}()
	}
	lerr := local()
	wg.Wait()
	if lerr != nil && length > 0 && read != nil && len(errs) < len(targets) {
		// Copies applied what the local disk did not (a full or failing
		// disk here): give them the local range back, so that no copy
		// holds a change the primary lacks. A copy that cannot take it
		// leaves the in-sync set like any copy that fails.
		buf := make([]byte, length)
		rerr := read(buf, off)
		for n, c := range targets {
			if errs[n] != nil {
				continue
			}
			if rerr != nil {
				errs[n] = fmt.Errorf("the primary failed the change (%w) and cannot read it back: %w", lerr, rerr)
			} else if err := c.write(buf, off, false); err != nil {
				errs[n] = err
			}
		}
	}
	var failed error
	for n, err := range errs {
		if r := mirror[n]; r != nil {
			s.stopResync(r, err) // the change is in its bitmap already
			continue
		}
		if err := s.drop(n, err, off, length); err != nil {
			failed = errors.Join(failed, err)
		}
	}
	if failed != nil {
		return failed
	}
	return lerr
}

// drop takes a failed copy out of the in-sync set: it marks the failed
// range and every change since the last completed flush in the copy's
// bitmap (durably), then records the copy out of sync. A copy already
// dropped has the range marked only.
//
// The bitmap joins the Set's bitmaps before the unflushed changes are
// taken, so a change that begins while the copy is leaving, and may still
// be sent to it, is marked in it write-ahead like any change for a copy
// not in sync; every change begun before is in the unflushed changes taken.
func (s *Set) drop(node string, cause error, off, length int64) error {
	s.dropMu.Lock()
	defer s.dropMu.Unlock()
	s.mu.Lock()
	b := s.bitmaps[node]
	s.mu.Unlock()
	var opened *Bitmap
	if b == nil {
		var err error
		if opened, _, err = s.openBitmap(node); err != nil {
			return s.diverge(node, cause, err)
		}
	}
	s.mu.Lock()
	if s.bitmaps[node] == nil {
		s.bitmaps[node] = opened
	}
	b = s.bitmaps[node]
	c := s.inSync[node]
	var unflushed []*Bitmap
	var inflight [][2]int64
	if c != nil {
		unflushed = append(unflushed, s.unflushed)
		for f := range s.flushing {
			unflushed = append(unflushed, f)
		}
		for _, r := range s.inflight {
			inflight = append(inflight, r)
		}
	}
	s.mu.Unlock()
	if opened != nil && opened != b {
		_ = opened.Close()
	}
	err := b.Mark(off, length)
	for _, r := range inflight {
		if err == nil {
			err = b.Mark(r[0], r[1])
		}
	}
	for _, u := range unflushed {
		for _, r := range u.Ranges() {
			if err == nil {
				err = b.Mark(r[0], r[1])
			}
		}
	}
	if err != nil {
		if c == nil {
			return fmt.Errorf("%w: copy on %s: %w (recording its changes: %w)", ErrNotAcknowledged, node, cause, err)
		}
		return s.diverge(node, cause, err)
	}
	if c == nil {
		return nil
	}
	if err := s.opts.OutOfSync(node, cause); err != nil {
		return fmt.Errorf("%w: copy on %s: %w (recording it out of sync: %w)", ErrNotAcknowledged, node, cause, err)
	}
	s.mu.Lock()
	if s.inSync[node] == c {
		delete(s.inSync, node)
	}
	s.mu.Unlock()
	c.close()
	return nil
}

// diverge takes a failed in-sync copy out of the in-sync set when its
// dirty bitmap could not record its changes (berr): recorded diverged
// (Options.Diverged: its resync copies it whole, so no bitmap need track
// it), it is written no more and its bitmap is dropped from the Set. Without
// Options.Diverged, or when that fails, the request is not acknowledged.
func (s *Set) diverge(node string, cause, berr error) error {
	s.mu.Lock()
	c := s.inSync[node]
	s.mu.Unlock()
	if c == nil || s.opts.Diverged == nil {
		return fmt.Errorf("%w: copy on %s: %w (recording its changes: %w)", ErrNotAcknowledged, node, cause, berr)
	}
	if err := s.opts.Diverged(node, fmt.Errorf("%w; its dirty bitmap could not record its changes: %w", cause, berr)); err != nil {
		return fmt.Errorf("%w: copy on %s: %w (recording its changes: %w; recording it diverged: %w)",
			ErrNotAcknowledged, node, cause, berr, err)
	}
	s.mu.Lock()
	if s.inSync[node] == c {
		delete(s.inSync, node)
	}
	b := s.bitmaps[node]
	delete(s.bitmaps, node)
	s.mu.Unlock()
	c.close()
	if b != nil {
		_ = b.Close()
	}
	return nil
}

// dropUnconnected records an in-sync copy that could not be reached out of
// sync: a bitmap first, then the record.
func (s *Set) dropUnconnected(node string, cause error) error {
	b, _, err := s.openBitmap(node)
	if err != nil {
		return fmt.Errorf("%w: copy on %s: %w (%w)", ErrNotAcknowledged, node, cause, err)
	}
	s.mu.Lock()
	s.bitmaps[node] = b
	s.mu.Unlock()
	if err := s.opts.OutOfSync(node, cause); err != nil {
		return fmt.Errorf("%w: copy on %s: %w (recording it out of sync: %w)", ErrNotAcknowledged, node, cause, err)
	}
	return nil
}

// Disk is a primary's disk handle that keeps every in-sync copy as the
// local disk, through its Set. Reads are local. Its methods are safe for
// concurrent use.
type Disk struct {
	local pool.Disk
	set   *Set
	owned bool // Close closes the Set too (Open)
}

var _ pool.Disk = (*Disk)(nil)

// Open connects to every copy and returns a handle with a Set of its own,
// closed with it: for a disk with one handle only.
func Open(ctx context.Context, local pool.Disk, copies []Copy, opts Options) (*Disk, error) {
	s, err := NewSet(ctx, local.Size(), copies, nil, opts)
	if err != nil {
		return nil, err
	}
	d := s.Disk(local)
	d.owned = true
	return d, nil
}

// Set is the replication state the handle writes through.
func (d *Disk) Set() *Set { return d.set }

// InSync lists the copies written to now.
func (d *Disk) InSync() []string { return d.set.InSync() }

func (d *Disk) Size() int64                      { return d.local.Size() }
func (d *Disk) ReadOnly() bool                   { return d.local.ReadOnly() }
func (d *Disk) ReadAt(p []byte, off int64) error { return d.local.ReadAt(p, off) }
func (d *Disk) Cache(off, length int64) error    { return d.local.Cache(off, length) }
func (d *Disk) Extents(off, length int64, limit int) ([]pool.Extent, error) {
	return d.local.Extents(off, length, limit)
}

// Capabilities offers none of the local handle's: a write tried through
// them (pool.Nonblocking, pool.Batcher) would change the local disk alone,
// not the copies.
func (d *Disk) Capabilities() pool.Capabilities { return pool.Capabilities{} }

// WriteAt writes p locally and on every in-sync copy.
func (d *Disk) WriteAt(p []byte, off int64, fua bool) error {
	return d.set.change(off, int64(len(p)), func() error { return d.local.WriteAt(p, off, fua) },
		func(c *conn) error { return c.write(p, off, fua) }, d.local.ReadAt, d.local.Flush)
}

// Flush makes every acknowledged write durable locally and on every in-sync
// copy.
func (d *Disk) Flush() error {
	return d.set.change(0, 0, d.local.Flush, (*conn).flush, nil, nil)
}

func (d *Disk) Trim(off, length int64, fua bool) error {
	return d.spans(off, length, func(off, length int64) error {
		return d.set.change(off, length, func() error { return d.local.Trim(off, length, fua) },
			func(c *conn) error { return c.trim(off, length, fua) }, d.local.ReadAt, d.local.Flush)
	})
}

// Zero zeroes locally and on the copies. A fast zero the local disk cannot
// do is not sent: the client falls back to writing zeros.
func (d *Disk) Zero(off, length int64, flags pool.ZeroFlags) error {
	mayTrim, fua := flags&pool.ZeroMayTrim != 0, flags&pool.ZeroFUA != 0
	return d.spans(off, length, func(off, length int64) error {
		if flags&pool.ZeroFast != 0 {
			r := d.set.ranges.lock(off, length)
			defer d.set.ranges.unlock(r)
			return d.set.changeLocked(off, length, true, func() error { return d.local.Zero(off, length, flags) },
				func(c *conn) error { return c.zero(off, length, mayTrim, fua) }, d.local.ReadAt, d.local.Flush)
		}
		return d.set.change(off, length, func() error { return d.local.Zero(off, length, flags) },
			func(c *conn) error { return c.zero(off, length, mayTrim, fua) }, d.local.ReadAt, d.local.Flush)
	})
}

// spans applies a TRIM or WRITE_ZEROES longer than the activity log's span
// (ActivityLog.Span) as changes of at most that span, in order, each
// recorded in the log before it is applied; the first that fails ends it
// (NBD allows a failed TRIM or WRITE_ZEROES to have changed part of its
// range).
func (d *Disk) spans(off, length int64, fn func(off, length int64) error) error {
	al := d.set.opts.Activity
	if al == nil || length <= al.Span() {
		return fn(off, length)
	}
	span := al.Span()
	for length > 0 {
		n := min(length, span-off%span)
		if err := fn(off, n); err != nil {
			return err
		}
		off, length = off+n, length-n
	}
	return nil
}

// Close closes the local handle (and the Set, for a handle from Open).
func (d *Disk) Close() error {
	if d.owned {
		d.set.Close()
	}
	return d.local.Close()
}
