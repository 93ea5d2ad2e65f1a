package pool

import (
	"context"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"time"

	"github.com/quiverstorage/quiver/internal/durable"
	"github.com/quiverstorage/quiver/internal/storage"
)

// Capture methods recorded in snapshot manifests.
const (
	MethodReflink = "reflink"
	MethodCopy    = "copy"
)

// CreateSnapshot captures every disk of the volume at one instant; a
// snapshot of that name already there fails with ErrExists. See
// CreateSnapshotWith.
func (v *Volume) CreateSnapshot(ctx context.Context, name string, prog Progress) (SnapshotInfo, bool, error) {
	return v.CreateSnapshotWith(ctx, name, Idempotency{}, prog)
}

// CreateSnapshotWith captures every disk of the volume at one instant. A
// snapshot of that name already there fails with ErrExists, unless idem
// allows it: then it is returned with created false. When it returns nil the
// snapshot is durable; a crash before that leaves no trace of it.
func (v *Volume) CreateSnapshotWith(ctx context.Context, name string, idem Idempotency, prog Progress) (SnapshotInfo, bool, error) {
	if s, found, err := v.checkNewSnapshot(name, idem); found || err != nil {
		return s, false, err // checked before the hold too: a retry needs no lock
	}
	h, err := v.Hold("snapshot")
	if err != nil {
		return SnapshotInfo{}, false, err
	}
	return h.CreateSnapshot(ctx, name, idem, prog)
}

// checkNewSnapshot validates a snapshot's name and idempotency key and
// looks for a snapshot of that name: found with its info when idem allows
// returning it, ErrExists when it does not.
func (v *Volume) checkNewSnapshot(name string, idem Idempotency) (SnapshotInfo, bool, error) {
	if err := ValidateName("name", name); err != nil {
		return SnapshotInfo{}, false, err
	}
	if err := ValidateIdempotencyKey("idempotency key", idem.Key); err != nil {
		return SnapshotInfo{}, false, err
	}
	if idem.UID != "" {
		if err := ValidateName("snapshot UID", idem.UID); err != nil {
			return SnapshotInfo{}, false, err
		}
	}
	return v.existingSnapshot(name, idem)
}

// CreateSnapshot is Volume.CreateSnapshotWith under the hold, which it
// releases.
func (h *Hold) CreateSnapshot(ctx context.Context, name string, idem Idempotency, prog Progress) (SnapshotInfo, bool, error) {
	defer h.Release()
	v := h.v
	if s, found, err := v.checkNewSnapshot(name, idem); found || err != nil {
		return s, false, err
	}
	staged, err := v.pool.newStaging("snap")
	if err != nil {
		return SnapshotInfo{}, false, err
	}
	m := v.manifest()
	ck, err := v.beginCheckpoint(m.Disks)
	if err != nil {
		v.pool.discard(staged)
		return SnapshotInfo{}, false, fmt.Errorf("snapshot %s@%s: %w", v.name, name, err)
	}
	method, held, err := v.capture(ctx, staged, m, ck, orNop(prog))
	if err != nil {
		ck.abandon()
		v.pool.discard(staged)
		return SnapshotInfo{}, false, fmt.Errorf("snapshot %s@%s: %w", v.name, name, err)
	}
	uid := idem.UID
	if uid == "" {
		uid = newUID()
	}
	sm := &snapshotManifest{Kind: "Snapshot", Version: manifestVersion, Name: name, UID: uid, Volume: m.Name,
		VolumeUID: m.UID, Capacity: m.Capacity, Disks: m.Disks, Method: method, GateHeld: held, CreatedAt: time.Now().UTC(),
		IdempotencyKey: idem.Key, Checkpoint: ck.seq, CheckpointPool: v.pool.id}
	if err := v.pool.writeJSON(filepath.Join(staged, "snapshot.json"), sm); err != nil {
		v.pool.discard(staged)
		return SnapshotInfo{}, false, err // staged: uncertain or not, nothing refers to it
	}
	if err := durable.Rename(v.pool.fs, v.pool.rel(staged), v.pool.rel(v.snapshotDir(name))); err != nil {
		v.pool.discard(staged)
		return SnapshotInfo{}, false, fmt.Errorf("snapshot %s@%s: %w", v.name, name, v.metaError(err))
	}
	v.mu.Lock()
	v.snaps[name] = sm
	v.mu.Unlock()
	v.pinSnapshot(name, m.Disks)
	v.lazyChanges(sm)
	v.pruneChanges() // the epochs up to the oldest checkpoint: no delta reads them
	orNop(prog).Done(name)
	return v.snapshotInfo(sm), true, nil
}

// existingSnapshot returns the snapshot called name (found) when idem
// allows it as the answer, ErrExists when it does not, and nothing when
// there is no such snapshot.
func (v *Volume) existingSnapshot(name string, idem Idempotency) (SnapshotInfo, bool, error) {
	v.mu.Lock()
	s, ok := v.snaps[name]
	v.mu.Unlock()
	switch {
	case !ok:
		return SnapshotInfo{}, false, nil
	case !idem.allows(s.IdempotencyKey):
		return SnapshotInfo{}, false, idem.existsError(fmt.Sprintf("snapshot %s@%s", v.name, name), true)
	}
	return v.snapshotInfo(s), true, nil
}

// CheckSnapshot tells, before a snapshot job starts, whether
// CreateSnapshotWith would refuse name because it is taken.
func (v *Volume) CheckSnapshot(name string, idem Idempotency) error {
	if err := ValidateName("name", name); err != nil {
		return err
	}
	if err := ValidateIdempotencyKey("idempotency key", idem.Key); err != nil {
		return err
	}
	_, _, err := v.existingSnapshot(name, idem)
	return err
}

// capture copies every disk of m into dstDir as <disk>.img, crash-consistent
// across disks: the copies hold exactly the writes that returned before one
// instant, when the I/O gate was closed (in-flight requests finished, new
// ones held), and none that began after it.
//
// With reflink the gate stays closed only for what the VM wrote near the end
// of the capture (captureLive): writes are tracked, each image is cloned with
// the gate open, the ranges written meanwhile are cloned again, and the gate
// closes only while the last few are. Without reflink every image is copied
// with the gate closed (captureGated), so the VM pauses for the whole copy.
// Either way the copies are fsynced after the gate opens, and are durable
// when capture returns.
// The caller holds the volume's ops lock (shared or exclusive) so the disk
// set cannot change.
//
// It returns the method used and how long the gate was held for the cut:
// the catch-up pass, or the whole copy. A snapshot's change-tracking
// checkpoint ck (nil for a clone) is cut with the gate closed and sealed
// right after; on an error the caller abandons it.
func (v *Volume) capture(ctx context.Context, dstDir string, m volumeManifest, ck *checkpoint, prog Progress) (string, time.Duration, error) {
	srcs := make([]storage.File, 0, len(m.Disks))
	dsts := make([]storage.File, 0, len(m.Disks))
	defer func() {
		for _, f := range append(srcs, dsts...) {
			_ = f.Close()
		}
	}()
	for _, d := range m.Disks {
		src, err := v.pool.openImage(v.pool.rel(v.diskPath(d.Name)), os.O_RDONLY)
		if err != nil {
			return "", 0, err
		}
		srcs = append(srcs, src)
		// Write back dirty pages first, so little is left to write back
		// while the clone holds the file locked or new I/O waits.
		if err := v.syncSource(d.Name, src); err != nil {
			return "", 0, err
		}
		dst, err := v.pool.newImageFile(filepath.Join(dstDir, d.Name+".img"))
		if err != nil {
			return "", 0, err
		}
		dsts = append(dsts, dst)
	}
	var (
		method string
		held   time.Duration
		err    error
	)
	gated := !v.pool.caps.Reflink
	if !gated {
		method, held, err = v.captureLive(ctx, m.Disks, dsts, srcs, ck)
		if gated = errors.Is(err, ErrNotSupported); gated {
			v.pool.log.Info("cloning ranges is not supported; capturing with the gate closed",
				"volume", v.name, "op", "snapshot", "err", err)
		}
	}
	if gated {
		method, held, err = v.captureGated(ctx, dsts, srcs, ck, prog)
	}
	if err != nil {
		return "", held, err
	}
	if err := ck.seal(); err != nil {
		return "", held, err
	}
	// The copies hold what the page cache held at the cut; they are a
	// snapshot of the disks only if the sources' data reached the storage.
	for i, d := range m.Disks {
		if err := v.syncSource(d.Name, srcs[i]); err != nil {
			return "", held, err
		}
	}
	for _, dst := range dsts {
		if err := dst.Sync(); err != nil {
			return "", held, err
		}
	}
	// The copies' entries in dstDir become durable with the next sync of
	// it: the snapshot's manifest write, or the clone's stageVolume.
	return method, held, nil
}

// syncSource makes what was written to disk name durable, before or after
// it is captured: through the disk's open file when the volume is open for
// I/O, whose failed sync is final (sync), else through src, the capture's
// own file. A capture fails with a failed sync: the page cache it copies
// may hold writes that the storage lost.
func (v *Volume) syncSource(name string, src storage.File) error {
	v.gate.RLock()
	defer v.gate.RUnlock()
	if df := v.files[name]; df != nil {
		return v.sync(df)
	}
	if err := src.Sync(); err != nil {
		v.pool.syncFailures.Add(1)
		v.pool.log.Error("fdatasync of a disk being captured failed", "volume", v.name, "disk", name, "err", err)
		return fmt.Errorf("disk %q of volume %q: %w: %w", name, v.name, ErrSyncFailed, err)
	}
	return nil
}

// captureGated copies each src into its dst with the gate closed. A dst may
// hold part of an abandoned live capture; it is emptied first.
func (v *Volume) captureGated(ctx context.Context, dsts, srcs []storage.File, ck *checkpoint, prog Progress) (string, time.Duration, error) {
	for _, dst := range dsts {
		if err := dst.Truncate(0); err != nil {
			return "", 0, err
		}
	}
	useReflink := v.pool.caps.Reflink
	if !useReflink {
		for _, src := range srcs {
			n, err := storage.DataBytes(src)
			if err != nil {
				return "", 0, err
			}
			prog.AddTotal(n)
		}
	}
	v.gate.Lock()
	start := time.Now()
	method, err := cloneFiles(ctx, dsts, srcs, useReflink, prog)
	held := time.Since(start)
	if useReflink {
		v.disownChunks()
	}
	if err == nil {
		ck.cut()
	}
	v.gate.Unlock()
	return method, held, err
}

// afterFirstPass, when not nil, runs between the first pass of a live
// capture and the rounds that follow it. Tests set it to write while the
// snapshot is being taken.
var afterFirstPass func()

// reflinkRange is File.CloneRange; tests replace it to inject failures.
var reflinkRange = func(dst, src storage.File, off, length int64) error { return dst.CloneRange(src, off, length) }

// Rounds of a live capture. While more than roundAbove ranges are dirty
// after a pass, another pass re-clones them with the gate open, at most
// maxRounds times and only while each round at least halves the count: a VM
// that keeps writing dirties fewer ranges during a short round than during
// the long first pass, and the gate then closes on what is left. A variable
// so tests can force rounds.
var roundAbove = 256

const maxRounds = 4

// captureLive captures with reflink in passes, so that the gate is closed
// only while the last one runs:
//
//  1. With the gate closed for an instant (in-flight requests finish),
//     start tracking writes: every later write, trim or zero records the
//     granules it changes (dirty.go).
//  2. With the gate open, clone each image into its dst, a piece at a time
//     (cloneInPieces). Writes go on; those that land are tracked.
//  3. While many ranges are dirty: with the gate closed for an instant,
//     swap in fresh dirty sets; with the gate open, clone again the ranges
//     of the old ones (recloneRound). Each dst then equals its src as of
//     the swap, except for what the fresh sets record.
//  4. With the gate closed, clone again the ranges the current sets record
//     (catchUp): each dst then equals its src at this instant, the cut.
//     Stop tracking and open the gate.
//
// A disk whose dirty set overflowed is cloned whole: in step 3 with the gate
// open, in step 4 with it closed, as is a disk whose ranges turn out not to
// clone in step 4. When ranges cannot be cloned in steps 2 or 3,
// captureLive returns an error wrapping ErrNotSupported and the
// caller captures with the gate closed instead. It returns the method used
// and how long step 4 held the gate; the other closures last only as long as
// storing a pointer.
func (v *Volume) captureLive(ctx context.Context, disks []DiskSpec, dsts, srcs []storage.File, ck *checkpoint) (string, time.Duration, error) {
	v.capturing.Lock()
	defer v.capturing.Unlock()
	sizes := make([]int64, len(srcs))
	for i, src := range srcs {
		st, err := src.Stat()
		if err != nil {
			return "", 0, err
		}
		sizes[i] = st.Size()
	}
	t := v.trackWrites(disks)
	defer v.dirty.Store(nil) // on early returns; step 4 stops tracking under the gate

	start := time.Now()
	for i := range srcs {
		if err := cloneInPieces(ctx, dsts[i], srcs[i], sizes[i]); err != nil {
			return "", 0, fmt.Errorf("disk %q: %w", disks[i].Name, err)
		}
	}
	first := time.Since(start)
	if afterFirstPass != nil {
		afterFirstPass()
	}
	rounds, last := 0, math.MaxInt
	for ; rounds < maxRounds; rounds++ {
		n := t.count()
		if n <= roundAbove || n > last/2 {
			break
		}
		last = n
		old := t
		t = v.trackWrites(disks)
		if err := recloneRound(ctx, old, disks, dsts, srcs, sizes); err != nil {
			return "", 0, err
		}
	}
	for i, src := range srcs { // less to write back with the gate closed
		if err := v.syncSource(disks[i].Name, src); err != nil {
			return "", 0, err
		}
	}
	if err := ctx.Err(); err != nil {
		return "", 0, err
	}

	v.gate.Lock()
	start = time.Now()
	method, ranges, err := catchUp(ctx, t, disks, dsts, srcs, sizes)
	v.dirty.Store(nil)
	v.disownChunks() // every chunk is shared with the capture now
	if err == nil {
		ck.cut()
	}
	held := time.Since(start)
	v.gate.Unlock()
	v.pool.log.Debug("live capture", "volume", v.name, "op", "snapshot", "first_pass", first,
		"rounds", rounds, "gate_held", held, "ranges", ranges, "err", err)
	return method, held, err
}

// trackWrites starts recording writes to disks in fresh dirty sets, in place
// of any earlier ones. It closes the gate for an instant, so every write
// that has not returned yet, and every later one, is recorded in them.
func (v *Volume) trackWrites(disks []DiskSpec) *dirtyTracker {
	t := newDirtyTracker(disks)
	v.gate.Lock()
	v.dirty.Store(t)
	v.gate.Unlock()
	return t
}

// recloneRound, with the gate open, clones again into each dst the ranges
// that t recorded; a disk whose set overflowed is cloned again whole.
func recloneRound(ctx context.Context, t *dirtyTracker, disks []DiskSpec, dsts, srcs []storage.File, sizes []int64) error {
	for i, d := range disks {
		spans, ok := t.disks[d.Name].ranges(sizes[i])
		var err error
		if ok {
			err = recloneSpans(dsts[i], srcs[i], spans)
		} else if err = dsts[i].Truncate(0); err == nil {
			err = cloneInPieces(ctx, dsts[i], srcs[i], sizes[i])
		}
		if err != nil {
			return fmt.Errorf("disk %q: %w", d.Name, err)
		}
	}
	return nil
}

// First-pass pieces. Each piece is one FICLONERANGE call, which holds the
// source's inode lock, so the VM's writes to that disk wait for it (reads
// too, on older kernels). A whole-file FICLONE of a fragmented image holds
// it for about a second; pieces sized to take about pieceTarget each keep
// that wait short. Sizes stay multiples of minPiece, itself a multiple of
// dirtyGranule.
const (
	firstPiece  = 64 << 20
	minPiece    = 1 << 20
	maxPiece    = 1 << 30
	pieceTarget = 10 * time.Millisecond
)

// cloneInPieces clones the first size bytes of src into the empty dst, a
// piece at a time, walking src's data runs (storage.DataRuns): holes are
// skipped rather than cloned, and stay holes either way. Pieces start on a
// dirtyGranule boundary. src may change meanwhile: the changes are tracked
// and cloned again later.
func cloneInPieces(ctx context.Context, dst, src storage.File, size int64) error {
	if err := dst.Truncate(size); err != nil {
		return err
	}
	piece := int64(firstPiece)
	done := int64(0) // everything below done is cloned
	return storage.DataRuns(src, 0, size, func(start, end int64) error {
		off := max(done, start&^(dirtyGranule-1))
		end = min((end+dirtyGranule-1)&^(dirtyGranule-1), size)
		for off < end {
			if err := ctx.Err(); err != nil {
				return err
			}
			n := min(piece, end-off)
			began := time.Now()
			if err := reflinkRange(dst, src, off, n); err != nil {
				return err
			}
			switch took := time.Since(began); {
			case took > pieceTarget && piece > minPiece:
				piece /= 2
			case took < pieceTarget/4 && piece < maxPiece:
				piece *= 2
			}
			off += n
		}
		done = max(done, end)
		return nil
	})
}

// catchUp (gate held exclusively) makes each dst equal its src by cloning
// again the ranges written since tracking began. A disk whose dirty set
// overflowed, whose size changed, or whose ranges turn out not to clone, is
// cloned whole. It returns the method used and how many ranges it cloned.
func catchUp(ctx context.Context, t *dirtyTracker, disks []DiskSpec, dsts, srcs []storage.File, sizes []int64) (string, int, error) {
	method, cloned := MethodReflink, 0
	for i, d := range disks {
		st, err := srcs[i].Stat()
		if err != nil {
			return "", cloned, err
		}
		spans, ok := t.disks[d.Name].ranges(st.Size())
		if ok && st.Size() == sizes[i] {
			err := recloneSpans(dsts[i], srcs[i], spans)
			cloned += len(spans)
			if err == nil {
				continue
			}
			if !errors.Is(err, ErrNotSupported) {
				return "", cloned, fmt.Errorf("disk %q: %w", d.Name, err)
			}
		}
		m, err := recloneWhole(ctx, dsts[i], srcs[i])
		if err != nil {
			return "", cloned, fmt.Errorf("disk %q: %w", d.Name, err)
		}
		if m == MethodCopy {
			method = MethodCopy
		}
	}
	return method, cloned, nil
}

func recloneSpans(dst, src storage.File, spans []span) error {
	for _, sp := range spans {
		if err := reflinkRange(dst, src, sp.off, sp.end-sp.off); err != nil {
			return err
		}
	}
	return nil
}

// recloneWhole makes dst, whatever it holds, a copy of src
// (storage.CloneOrCopy: a whole-file reflink, which replaces dst's extents,
// holes included, else a copy).
func recloneWhole(ctx context.Context, dst, src storage.File) (string, error) {
	return storage.CloneOrCopy(ctx, dst, src, true, nil)
}

// cloneFiles makes each dst a copy of the matching src by reflink, falling
// back to a sparse copy (storage.CloneOrCopy). It does not sync.
func cloneFiles(ctx context.Context, dsts, srcs []storage.File, reflink bool, prog Progress) (string, error) {
	method := MethodReflink
	for i, src := range srcs {
		m, err := storage.CloneOrCopy(ctx, dsts[i], src, reflink, prog.Add)
		if err != nil {
			return "", err
		}
		if m == storage.MethodCopy {
			method = MethodCopy
		}
	}
	return method, nil
}

// DeleteSnapshot removes a snapshot: one rename into staging, durable on
// return.
func (v *Volume) DeleteSnapshot(ctx context.Context, name string) error {
	if err := ValidateName("snapshot", name); err != nil {
		return err
	}
	unlock, err := v.lockOps("delete snapshot")
	if err != nil {
		return err
	}
	defer unlock()
	snap, err := v.Snapshot(name)
	if err != nil {
		return err
	}
	// What was recorded lazily against its checkpoint is written ahead
	// first: without the snapshot, a crash could not recover it (lazy.go).
	if err := v.endLazy(snap); err != nil {
		return fmt.Errorf("delete snapshot %s@%s: %w", v.name, name, err)
	}
	v.unpinSnapshot(name) // so that its space is freed with it
	trash := filepath.Join(v.pool.stagingDir(), "del-"+newUID())
	if err := durable.Rename(v.pool.fs, v.pool.rel(v.snapshotDir(name)), v.pool.rel(trash)); err != nil {
		return fmt.Errorf("delete snapshot %s@%s: %w", v.name, name, v.metaError(err))
	}
	v.mu.Lock()
	delete(v.snaps, name)
	v.mu.Unlock()
	v.pool.discard(trash)
	v.pruneChanges()
	return nil
}

// disownChunks (gate held exclusively) forgets which chunks the disks own.
func (v *Volume) disownChunks() {
	for _, df := range v.files {
		if df.ch != nil {
			df.ch.disown()
		}
		// The capture shares the image's blocks with another file now: a
		// block the image made its own since the pin may be shared again
		// (unshare.go). A snapshot pins anew once committed.
		df.pinAll = nil
	}
}
