package replica

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"sync"

	"github.com/quiverstorage/quiver/internal/durable"
	"github.com/quiverstorage/quiver/internal/storage"
)

// Activity log defaults (docs/cluster.md, "Activity log"). An extent of
// 4 MiB is 64 granules: coarse enough that a guest's working set (a
// filesystem journal, a database's log and hot pages) stays in a few
// extents and a new extent is rare, fine enough that the extents active
// at a crash are a small part of a disk. 128 extents bound the regions
// an old primary's resync copies for its activity to 512 MiB a disk.
const (
	DefaultActivityExtent  = 4 << 20
	DefaultActivityExtents = 128
)

// ErrActivityLog: an activity log file is from a later term than the one
// opening it, or cannot be used.
var ErrActivityLog = errors.New("activity log unusable")

const (
	activityMagic  = "QVACTLG1"
	activityHeader = 32
	// activityUntrusted, in the header's flags: the log stopped tracking
	// at its term (every slot pinned, a damaged file found at its own
	// term): a resync for that term must copy the disk whole.
	activityUntrusted = 1
)

// ActivityLog is the write-ahead activity log of one disk on its primary:
// the extents (of Extent bytes) in which a change may be in flight, or may
// be applied here and not on the copies, or on the copies and not durably
// here. It is what a primary that went down may hold that its successor
// lacks: the successor resyncs the old primary's copy from its own dirty
// bitmap (every change since it took over) and these extents (Activity).
//
// It lives in a pool file: a 32-byte header (magic, term, extent size,
// slot count and flags) then one 8-byte word per slot, the active extent's
// index plus one (0: free). A Set calls Begin before it applies a change
// anywhere and End when the change returned. An extent already active
// costs nothing (no write, no sync, no allocation); a new one is written
// into a slot in place (one aligned word, which never straddles a sector,
// so a crash leaves it old or new) and the file fdatasync'd before Begin
// returns. A free slot is taken first; otherwise the least recently used
// extent is retired in the same word, only when it is retirable:
//
//   - no change in it is in flight;
//   - every change in it returned success, so that local disk and every
//     copy it was sent to applied it (a change that failed anywhere pins
//     its extents for the log's life: the copies may lack what is here);
//   - a local flush that began after its last change completed has
//     succeeded (ActivityFlushBegin, ActivityFlushed), so a power cut here
//     cannot lose what the copies have. When the only candidates are not
//     flushed, Begin flushes the local disk itself (one fdatasync).
//
// Durability: when Begin returns nil, every extent of its range is in the
// file, durable; an extent leaves the file only when retirable as above.
// So after a crash at any point the file holds every extent with a change
// that may differ between this disk and its copies. A failed sync is final:
// every later Begin fails with it, and no change is applied.
//
// Opened at a later term than its file's (this node promoted: its copy was
// in sync), the log starts empty at the new term. Opened at its own term
// again (a restart), the extents found are pinned: the previous process may
// have died with changes in flight there. When every slot is pinned, or
// the file is damaged at its own term, the log gives up for its term: it
// records itself untrusted (the resync of this copy is whole) and tracks
// nothing more. Its methods are safe for concurrent use.
type ActivityLog struct {
	fsys   storage.FS
	rel    string
	extent int64

	mu        sync.Mutex
	wake      *sync.Cond
	waiting   int
	f         storage.File
	term      uint64
	untrusted bool
	slots     []int64 // index+1 per slot, as on disk
	active    map[int64]*activeExtent
	tick      uint64 // LRU clock
	done      uint64 // changes ended
	flushed   uint64 // changes ended that a completed flush covers
	failed    error
	refs      int
}

type activeExtent struct {
	slot     int
	inflight int
	lastDone uint64
	used     uint64
	pinned   bool
}

// ActivityPath is where the pool keeps the activity log of disk of the
// local volume with uid: cluster/activity/<uid>/<disk>.
func ActivityPath(uid, disk string) string { return path.Join(ActivityDir(uid), disk) }

// ActivityDir holds the activity logs of the local volume with uid.
func ActivityDir(uid string) string { return path.Join("cluster", "activity", uid) }

// Activity is what an activity log file says: its term, extent size, the
// extents active in it, and whether it can be trusted at all.
type Activity struct {
	Term      uint64
	Extent    int64
	Extents   []int64
	Untrusted bool
}

// Ranges returns the active extents as byte ranges of a disk of size
// bytes (the last one cut at its end).
func (a Activity) Ranges(size int64) [][2]int64 {
	out := make([][2]int64, 0, len(a.Extents))
	for _, e := range a.Extents {
		off := e * a.Extent
		if off < size {
			out = append(out, [2]int64{off, min(a.Extent, size-off)})
		}
	}
	return out
}

// ReadActivity reads the activity log rel: fs.ErrNotExist when there is
// none, ErrActivityLog when it is damaged.
func ReadActivity(fsys storage.FS, rel string) (Activity, error) {
	f, err := fsys.OpenRegular(rel, os.O_RDONLY)
	if err != nil {
		return Activity{}, fmt.Errorf("activity log %s: %w", rel, err)
	}
	defer f.Close()
	a, err := readActivity(f)
	if err != nil {
		return Activity{}, fmt.Errorf("activity log %s: %w", rel, err)
	}
	return a, nil
}

func readActivity(f storage.File) (Activity, error) {
	head := make([]byte, activityHeader)
	if _, err := f.ReadAt(head, 0); err != nil {
		return Activity{}, fmt.Errorf("%w: %w", ErrActivityLog, err)
	}
	if string(head[:8]) != activityMagic {
		return Activity{}, fmt.Errorf("%w: bad magic", ErrActivityLog)
	}
	a := Activity{Term: binary.LittleEndian.Uint64(head[8:]), Extent: int64(binary.LittleEndian.Uint64(head[16:]))}
	n := int(binary.LittleEndian.Uint32(head[24:]))
	a.Untrusted = binary.LittleEndian.Uint32(head[28:])&activityUntrusted != 0
	if a.Extent <= 0 || n <= 0 || n > 1<<20 {
		return Activity{}, fmt.Errorf("%w: extent %d, %d slots", ErrActivityLog, a.Extent, n)
	}
	buf := make([]byte, 8*n)
	if _, err := f.ReadAt(buf, activityHeader); err != nil {
		return Activity{}, fmt.Errorf("%w: %w", ErrActivityLog, err)
	}
	seen := map[int64]bool{}
	for i := range n {
		v := binary.LittleEndian.Uint64(buf[8*i:])
		if v == 0 {
			continue
		}
		if v > 1<<48 || seen[int64(v-1)] {
			return Activity{}, fmt.Errorf("%w: slot %d holds %d", ErrActivityLog, i, v)
		}
		seen[int64(v-1)] = true
		a.Extents = append(a.Extents, int64(v-1))
	}
	return a, nil
}

func encodeActivity(term uint64, extent int64, slots []int64, untrusted bool) []byte {
	buf := make([]byte, activityHeader+8*len(slots))
	copy(buf, activityMagic)
	binary.LittleEndian.PutUint64(buf[8:], term)
	binary.LittleEndian.PutUint64(buf[16:], uint64(extent))
	binary.LittleEndian.PutUint32(buf[24:], uint32(len(slots)))
	if untrusted {
		binary.LittleEndian.PutUint32(buf[28:], activityUntrusted)
	}
	for i, v := range slots {
		binary.LittleEndian.PutUint64(buf[activityHeader+8*i:], uint64(v))
	}
	return buf
}

// OpenActivityLog opens the activity log rel of a disk for its primary at
// term, with extents of extent bytes and slots slots (0: the defaults), as
// the type's comment says: a new or reset file is durable, with its
// directory entry, when it returns. A file from a later term is
// ErrActivityLog.
func OpenActivityLog(fsys storage.FS, rel string, term uint64, extent int64, slots int) (*ActivityLog, error) {
	if extent <= 0 {
		extent = DefaultActivityExtent
	}
	if slots <= 0 {
		slots = DefaultActivityExtents
	}
	l := &ActivityLog{fsys: fsys, rel: rel, extent: extent, term: term, slots: make([]int64, slots),
		active: map[int64]*activeExtent{}, refs: 1}
	l.wake = sync.NewCond(&l.mu)
	fresh, untrusted := true, false
	f, err := fsys.OpenRegular(rel, os.O_RDWR)
	switch {
	case errors.Is(err, fs.ErrNotExist):
	case err != nil:
		return nil, fmt.Errorf("activity log %s: %w", rel, err)
	default:
		a, rerr := readActivity(f)
		switch {
		case rerr == nil && a.Term > term:
			f.Close()
			return nil, fmt.Errorf("activity log %s is of term %d, later than %d: %w", rel, a.Term, term, ErrActivityLog)
		case rerr == nil && a.Term == term && a.Extent == extent && len(a.Extents) <= slots &&
			fileSlots(f) == slots:
			// A restart at the same term: what was active may differ
			// between here and the copies; pinned for the term.
			fresh, untrusted = false, a.Untrusted
			l.untrusted = untrusted
			l.readSlots(f)
		case rerr == nil && a.Term < term:
			// This node was promoted: its copy was in sync.
		default:
			// Damaged, or of another shape, at this term: what it held
			// is lost, so this term's log cannot be trusted.
			untrusted = rerr != nil || a.Term == term
		}
		if fresh {
			f.Close()
		} else {
			l.f = f
		}
	}
	if fresh {
		if err := mkdirAll(fsys, path.Dir(rel)); err != nil {
			return nil, fmt.Errorf("activity log %s: %w", rel, err)
		}
		l.untrusted = untrusted
		if err := durable.WriteFile(fsys, rel, encodeActivity(term, extent, l.slots, untrusted), 0o600); err != nil {
			return nil, err
		}
		if l.f, err = fsys.OpenRegular(rel, os.O_RDWR); err != nil {
			return nil, fmt.Errorf("activity log %s: %w", rel, err)
		}
	}
	return l, nil
}

// fileSlots is the slot count in f's header (read already once).
func fileSlots(f storage.File) int {
	head := make([]byte, activityHeader)
	if _, err := f.ReadAt(head, 0); err != nil {
		return -1
	}
	return int(binary.LittleEndian.Uint32(head[24:]))
}

// readSlots loads f's slots, every extent pinned.
func (l *ActivityLog) readSlots(f storage.File) {
	buf := make([]byte, 8*len(l.slots))
	if _, err := f.ReadAt(buf, activityHeader); err != nil {
		return
	}
	for i := range l.slots {
		v := int64(binary.LittleEndian.Uint64(buf[8*i:]))
		l.slots[i] = v
		if v != 0 {
			l.active[v-1] = &activeExtent{slot: i, pinned: true}
		}
	}
}

// Extent is the log's extent size.
func (l *ActivityLog) Extent() int64 { return l.extent }

// Span is the most bytes one change may cover (a quarter of the slots): a
// longer TRIM or WRITE_ZEROES is applied in spans of this size.
func (l *ActivityLog) Span() int64 { return l.extent * int64(max(len(l.slots)/4, 1)) }

// Begin records [off, off+length) active, durably, before the change is
// applied; held says whether the caller must call End with the change's
// outcome (false: the log tracks nothing more, or length is 0). flush
// flushes the local disk, when an extent must be retired that no flush
// covers yet. An error leaves the change unapplied: it must fail.
func (l *ActivityLog) Begin(off, length int64, flush func() error) (held bool, err error) {
	if length <= 0 || off < 0 {
		return false, nil
	}
	first, last := off/l.extent, (off+length-1)/l.extent
	l.mu.Lock()
	defer l.mu.Unlock()
	next := first // the extents before next are taken (inflight counted)
	release := func() {
		for e := first; e < next; e++ {
			l.active[e].inflight--
		}
		next = first
	}
	for {
		if l.failed != nil {
			release()
			return false, l.failed
		}
		if l.untrusted {
			release()
			return false, nil
		}
		for ; next <= last; next++ {
			a := l.active[next]
			if a == nil {
				break
			}
			a.inflight++
			l.tick++
			a.used = l.tick
		}
		if next > last {
			return true, nil
		}
		if int(last-first+1) > len(l.slots) {
			release()
			return false, l.giveUp()
		}
		slot, victim, needFlush := l.pick()
		switch {
		case slot >= 0:
			if err := l.writeSlot(slot, next, victim); err != nil {
				release()
				return false, err
			}
		case needFlush:
			gen := l.done
			l.mu.Unlock()
			ferr := flush()
			l.mu.Lock()
			if ferr != nil {
				release()
				return false, fmt.Errorf("activity log %s: flush the disk to retire an extent: %w", l.rel, ferr)
			}
			l.flushed = max(l.flushed, gen)
		case l.allPinned():
			release()
			return false, l.giveUp()
		default:
			// Every unpinned extent has a change in flight: wait for one
			// to end, holding none (so that waiters cannot hold each
			// other's extents).
			release()
			l.waiting++
			l.wake.Wait()
			l.waiting--
		}
	}
}

// End ends a change that Begin held: ok says whether it succeeded
// everywhere it was sent (else its extents are pinned).
func (l *ActivityLog) End(off, length int64, ok bool) {
	first, last := off/l.extent, (off+length-1)/l.extent
	l.mu.Lock()
	defer l.mu.Unlock()
	l.done++
	for e := first; e <= last; e++ {
		a := l.active[e]
		if a == nil {
			continue // dropped by a later term's reset
		}
		a.inflight--
		a.lastDone = l.done
		if !ok {
			a.pinned = true
		}
	}
	if l.waiting > 0 {
		l.wake.Broadcast()
	}
}

// FlushBegin is called as a flush of the local disk begins; Flushed(gen)
// once it succeeded: the changes ended before it are durable here.
func (l *ActivityLog) FlushBegin() (gen uint64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.done
}

// Flushed: the flush that began at gen succeeded.
func (l *ActivityLog) Flushed(gen uint64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.flushed = max(l.flushed, gen)
	if l.waiting > 0 {
		l.wake.Broadcast()
	}
}

// pick finds a slot for a new extent: a free one (victim -1), or the
// least recently used retirable extent's. needFlush: none is retirable
// but one would be after a flush.
func (l *ActivityLog) pick() (slot int, victim int64, needFlush bool) {
	for i, v := range l.slots {
		if v == 0 {
			return i, -1, false
		}
	}
	var best, unflushed *activeExtent
	bestE := int64(-1)
	for e, a := range l.active {
		if a.pinned || a.inflight > 0 {
			continue
		}
		if a.lastDone > l.flushed {
			if unflushed == nil || a.used < unflushed.used {
				unflushed = a
			}
			continue
		}
		if best == nil || a.used < best.used {
			best, bestE = a, e
		}
	}
	if best != nil {
		return best.slot, bestE, false
	}
	return -1, -1, unflushed != nil
}

func (l *ActivityLog) allPinned() bool {
	for _, a := range l.active {
		if !a.pinned {
			return false
		}
	}
	return len(l.active) == len(l.slots)
}

// writeSlot makes slot hold extent e (retiring victim, if not -1) on disk,
// then in memory.
func (l *ActivityLog) writeSlot(slot int, e, victim int64) error {
	var buf [8]byte
	binary.LittleEndian.PutUint64(buf[:], uint64(e+1))
	if _, err := l.f.WriteAt(buf[:], activityHeader+8*int64(slot)); err != nil {
		return fmt.Errorf("activity log %s: %w", l.rel, err)
	}
	if err := l.sync(); err != nil {
		return err
	}
	if victim >= 0 {
		delete(l.active, victim)
	}
	l.slots[slot] = e + 1
	l.active[e] = &activeExtent{slot: slot}
	return nil
}

func (l *ActivityLog) sync() error {
	if err := l.f.Sync(); err != nil {
		l.failed = fmt.Errorf("activity log %s: a sync failed, the file can promise nothing more: %w", l.rel, err)
		return l.failed
	}
	return nil
}

// giveUp records the log untrusted for its term, durably (the header's
// flags word, in place); from then on it tracks nothing.
func (l *ActivityLog) giveUp() error {
	var buf [8]byte
	binary.LittleEndian.PutUint32(buf[0:], uint32(len(l.slots)))
	binary.LittleEndian.PutUint32(buf[4:], activityUntrusted)
	if _, err := l.f.WriteAt(buf[:], 24); err != nil {
		return fmt.Errorf("activity log %s: %w", l.rel, err)
	}
	if err := l.sync(); err != nil {
		return err
	}
	l.untrusted = true
	return nil
}

// Advance moves the log to a later term (this node promoted again while a
// Set of an older term still shares the log): the extents with a change in
// flight stay, the others are dropped, in one atomic rewrite of the file.
func (l *ActivityLog) Advance(term uint64) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if term == l.term {
		return nil
	}
	if term < l.term {
		return fmt.Errorf("activity log %s is of term %d, later than %d: %w", l.rel, l.term, term, ErrActivityLog)
	}
	if l.failed != nil {
		return l.failed
	}
	slots := make([]int64, len(l.slots))
	active := map[int64]*activeExtent{}
	for e, a := range l.active {
		if a.inflight > 0 {
			slots[a.slot] = e + 1
			active[e] = &activeExtent{slot: a.slot, inflight: a.inflight, used: a.used}
		}
	}
	if err := durable.WriteFile(l.fsys, l.rel, encodeActivity(term, l.extent, slots, false), 0o600); err != nil {
		return err
	}
	f, err := l.fsys.OpenRegular(l.rel, os.O_RDWR)
	if err != nil {
		return fmt.Errorf("activity log %s: %w", l.rel, err)
	}
	_ = l.f.Close()
	l.f, l.term, l.slots, l.active, l.untrusted = f, term, slots, active, false
	return nil
}

// Term is the term the log is for.
func (l *ActivityLog) Term() uint64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.term
}

// Share returns l for one more holder (each closes it once), if its file
// is still open; otherwise nil.
func (l *ActivityLog) Share() *ActivityLog {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.f == nil {
		return nil
	}
	l.refs++
	return l
}

// Close closes the file once its last holder closed it; the log stays on
// disk.
func (l *ActivityLog) Close() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.f == nil {
		return nil
	}
	if l.refs--; l.refs > 0 {
		return nil
	}
	err := l.f.Close()
	l.f = nil
	return err
}
