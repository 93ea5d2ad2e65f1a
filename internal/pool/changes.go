package pool

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"io/fs"
	"math/bits"
	"os"
	"path"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/quiverstorage/quiver/internal/durable"
	"github.com/quiverstorage/quiver/internal/storage"
)

// Change tracking: which blocks of each disk changed since a checkpoint, for
// incremental backups and replication (issue 33). Every whole-VM snapshot
// is a checkpoint, taken at the snapshot's cut, so a delta between two
// snapshots (or a snapshot and the live disks) is the same crash-consistent
// cut across every disk of the VM.
//
// Granularity. Changes are recorded per changeGranule (64 KiB) in memory,
// and written ahead per changeRegion (1 MiB) on the pool: before a write,
// trim or zero changes a region not yet recorded since the last checkpoint,
// the region's bit is written into the disk's live map and the map
// fdatasync'd. A region already recorded costs one atomic load. After a
// crash the live map is all that is left of the current epoch, so the
// changes since the last checkpoint are reported per region (1 MiB) until
// the next checkpoint: over-reported, never under-reported.
//
// Files, in volumes/<vol>/changes/:
//
//	<disk>.live   the live map: every region changed since the last sealed
//	              epoch (a superset), written ahead as above
//	<disk>.<seq>  a sealed epoch: every granule changed between checkpoint
//	              seq-1 (or the disk's creation) and checkpoint seq, written
//	              whole and atomically (durable.WriteFile) with a checksum
//
// A checkpoint (cut, then seal) works so that a crash anywhere loses
// nothing:
//
//  1. at the cut, with the I/O gate closed, the in-memory granules of each
//     disk are swapped for empty ones: they are the epoch being sealed;
//  2. the sealed epoch is written (durable on return) as <disk>.<seq>;
//  3. only then is the live map rewritten to hold the regions of the new
//     epoch's granules, under the map's lock so no new region is written
//     meanwhile. A crash mid-rewrite leaves, sector by sector, the old map
//     (a superset) or the new one: both hold every region of the new epoch.
//  4. the snapshot is committed with checkpoint seq in its manifest.
//
// A seq whose snapshot never committed (a crash or a failure after step 2)
// leaves an orphan sealed epoch. Sequence numbers are never reused, and a
// delta from checkpoint a is the union of every sealed epoch after a and of
// the live map, so an orphan only adds what it holds: nothing is lost and
// nothing is mixed. Sealed epochs are removed once no snapshot at or before
// them remains (pruneChanges).
//
// Whole-disk changes (a rollback, a disk added under a name a checkpoint may
// know) set the live map's all flag before the change; a damaged sealed
// epoch or live map reads as all changed, with a warning. A sealed epoch
// missing for a checkpoint that a snapshot names fails the delta
// (ErrNoCheckpoint): nothing proves what changed then.
//
// What it does not see: writes to an image outside quiver's I/O path (a VM
// given the image file itself, on a single node's Filesystem-mode PVC).
const (
	changeGranule = 64 << 10
	changeRegion  = 1 << 20
)

// ErrNoCheckpoint: a delta needs a checkpoint that the snapshot does not
// carry (taken before change tracking, or its record is missing).
var ErrNoCheckpoint = errors.New("no change-tracking checkpoint")

const (
	liveMagic   = "QVCHGLV1"
	sealedMagic = "QVCHGSE1"
	// Headers: magic (8), granule or region size (8), disk size (8),
	// flags (8). The live map's header is one sector, so its flag word is
	// written alone.
	changeHeader = 32
	changeAll    = 1 // flags: every block of the disk changed
	// changeLazy (flags): the map may miss regions changed since
	// checkpoint flags>>8, whose snapshot's images recover them (lazy.go).
	changeLazy = 2
)

// bitset is a set of unit-sized pieces of a disk, safe for concurrent
// adds under the gate held shared; it is resized only under the gate held
// exclusively.
type bitset struct {
	unit  int64
	words []atomic.Uint64
}

func newBitset(unit, size int64) *bitset {
	b := &bitset{unit: unit}
	b.resize(size)
	return b
}

func (b *bitset) resize(size int64) {
	n := int((size + b.unit*64 - 1) / (b.unit * 64))
	if n <= len(b.words) {
		return
	}
	w := make([]atomic.Uint64, n)
	for i := range b.words {
		w[i].Store(b.words[i].Load())
	}
	b.words = w
}

// add sets the pieces of [off, off+length).
func (b *bitset) add(off, length int64) {
	for i := off / b.unit; i*b.unit < off+length; i++ {
		w := &b.words[i/64]
		m := uint64(1) << (i % 64)
		if w.Load()&m == 0 {
			w.Or(m)
		}
	}
}

// count returns how many pieces are set.
func (b *bitset) count() int {
	n := 0
	for i := range b.words {
		n += bits.OnesCount64(b.words[i].Load())
	}
	return n
}

func (b *bitset) empty() bool {
	for i := range b.words {
		if b.words[i].Load() != 0 {
			return false
		}
	}
	return true
}

func (b *bitset) has(i int64) bool {
	return i/64 < int64(len(b.words)) && b.words[i/64].Load()&(1<<(i%64)) != 0
}

// or adds every piece of o (its unit a multiple of b's or equal).
func (b *bitset) or(o *bitset) {
	if o.unit == b.unit {
		for i := range o.words {
			if i < len(b.words) {
				b.words[i].Or(o.words[i].Load())
			}
		}
		return
	}
	o.each(func(i int64) { b.add(i*o.unit, o.unit) })
}

func (b *bitset) each(fn func(i int64)) {
	for wi := range b.words {
		w := b.words[wi].Load()
		for w != 0 {
			t := bits.TrailingZeros64(w)
			fn(int64(wi)*64 + int64(t))
			w &^= 1 << t
		}
	}
}

func (b *bitset) bytes() []byte {
	out := make([]byte, 8*len(b.words))
	for i := range b.words {
		binary.LittleEndian.PutUint64(out[8*i:], b.words[i].Load())
	}
	return out
}

func (b *bitset) load(p []byte) {
	for i := range b.words {
		if 8*i+8 <= len(p) {
			b.words[i].Store(binary.LittleEndian.Uint64(p[8*i:]))
		}
	}
}

// diskChanges tracks one disk's changes since the last checkpoint.
type diskChanges struct {
	c    *changeLog
	name string
	// fine: the granules changed in the current epoch. Swapped at a cut
	// and resized under the gate held exclusively.
	fine atomic.Pointer[bitset]
	all  atomic.Bool // the whole disk changed this epoch
	// lazy: changes are recorded in memory only, the live map's header
	// naming the checkpoint whose snapshot recovers them after a crash
	// (lazy.go). Set after that snapshot is committed; cleared with the
	// gate held exclusively.
	lazy atomic.Bool
	// lazySeq (under mu) is the checkpoint the live map's header names
	// for recovery (changeLazy); 0: none.
	lazySeq uint64

	mu      sync.Mutex // guards what follows; the live map is written under it or by the batch's leader
	f       storage.File
	regions *bitset // regions durable in the live map
	size    int64
	err     error // a failed sync of the live map: final

	// Marks are group-committed: a writer adds the words of its regions
	// to pending and waits until a batch that took them is synced; the
	// first writer that finds no batch running leads the next one, writes
	// every pending word and syncs once for all (markRegions).
	batchDone   *sync.Cond       // on mu: a batch ended
	pending     map[int64]uint64 // words to write, ORed
	syncing     bool             // a leader writes and syncs a batch outside mu
	next        uint64           // the batch that pending goes into
	done        uint64           // the last batch ended
	failedBatch map[uint64]error // batches that failed without a final error
}

// changeLog is a volume's change tracking.
type changeLog struct {
	v     *Volume
	mu    sync.Mutex // guards disks and next
	disks map[string]*diskChanges
	next  uint64 // the next checkpoint's sequence number
	// legacy: the volume has no changes directory yet (made before change
	// tracking); set at load, cleared by the first live map made.
	legacy bool
}

func (v *Volume) changesDir() string { return path.Join("volumes", v.name, "changes") }

// loadedChanges returns the volume's change log if it is loaded, else nil.
func (v *Volume) loadedChanges() *changeLog {
	v.chgOnce.Lock()
	defer v.chgOnce.Unlock()
	return v.chg
}

// changes returns the volume's change log, loading it on first use.
func (v *Volume) changes() (*changeLog, error) {
	v.chgOnce.Lock()
	defer v.chgOnce.Unlock()
	if v.chg != nil {
		return v.chg, nil
	}
	v.mu.Lock()
	deleted := v.deleted
	v.mu.Unlock()
	if deleted {
		return nil, fmt.Errorf("volume %q: %w", v.name, ErrVolumeNotFound)
	}
	c := &changeLog{v: v, disks: map[string]*diskChanges{}, next: 1}
	if err := c.load(); err != nil {
		return nil, err
	}
	v.chg = c
	return c, nil
}

// load finds the highest sequence number in use, sealed or named by a
// snapshot. A volume without a changes directory predates change tracking.
func (c *changeLog) load() error {
	v := c.v
	es, err := v.pool.fs.ReadDir(v.changesDir())
	switch {
	case errors.Is(err, fs.ErrNotExist):
		c.legacy = true
	case err != nil:
		return hostile(err)
	}
	for _, e := range es {
		if _, seq, ok := sealedName(e.Name()); ok && seq >= c.next {
			c.next = seq + 1
		}
	}
	v.mu.Lock()
	for _, s := range v.snaps {
		if s.Checkpoint >= c.next {
			c.next = s.Checkpoint + 1
		}
	}
	v.mu.Unlock()
	return nil
}

// sealedName parses "<disk>.<seq>".
func sealedName(name string) (string, uint64, bool) {
	disk, s, ok := strings.Cut(name, ".")
	if !ok || ValidateName("disk", disk) != nil {
		return "", 0, false
	}
	seq, err := strconv.ParseUint(s, 10, 64)
	if err != nil || seq == 0 || strconv.FormatUint(seq, 10) != s {
		return "", 0, false
	}
	return disk, seq, true
}

// disk returns the tracking of disk d, reading its live map. A live map
// is made on the first change after the volume's creation or a checkpoint
// that left it empty; a missing one is therefore empty, except in a volume
// from before change tracking (its disks count as changed whole until the
// next checkpoint). A damaged one counts as all changed.
func (c *changeLog) disk(d DiskSpec) (*diskChanges, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if dc := c.disks[d.Name]; dc != nil {
		return dc, nil
	}
	v := c.v
	dc := &diskChanges{c: c, name: d.Name, size: d.Size, regions: newBitset(changeRegion, d.Size),
		pending: map[int64]uint64{}, failedBatch: map[uint64]error{}, next: 1}
	dc.batchDone = sync.NewCond(&dc.mu)
	dc.fine.Store(newBitset(changeGranule, d.Size))
	f, err := v.pool.fs.OpenRegular(dc.rel(), os.O_RDWR)
	if errors.Is(err, storage.ErrReadOnly) || v.pool.readOnly {
		// Read-only for now: read it; a change waits for the pool to be
		// writable again (open).
		f, err = v.pool.fs.OpenRegular(dc.rel(), os.O_RDONLY)
	}
	switch {
	case errors.Is(err, fs.ErrNotExist):
		dc.all.Store(c.legacy)
	case err != nil:
		return nil, hostile(err)
	default:
		if err := dc.readLive(f); err != nil {
			v.pool.log.Warn("live change map damaged; the disk counts as changed whole since the last checkpoint",
				"volume", v.name, "disk", d.Name, "err", err)
			dc.all.Store(true)
		}
		_ = f.Close() // reopened for writing by the first change (open)
		// What the live map holds is the current epoch, per region.
		dc.fine.Load().or(dc.regions)
	}
	c.disks[d.Name] = dc
	return dc, nil
}

func (dc *diskChanges) rel() string { return path.Join(dc.c.v.changesDir(), dc.name+".live") }

// open makes the live map when there is none yet (caller holds mu, no
// batch running), with the all flag as it is and regions.
func (dc *diskChanges) open(regions *bitset) error {
	f, err := dc.create(regions)
	if err != nil {
		return err
	}
	dc.f = f
	return nil
}

// create opens the live map for writing, or makes it, and writes the all
// flag as it is and regions into it, synced with its directory entry. It
// does not touch dc's fields but the all flag's load.
func (dc *diskChanges) create(regions *bitset) (storage.File, error) {
	v := dc.c.v
	if err := v.pool.checkWritable("change tracking of disk " + dc.name); err != nil {
		return nil, err
	}
	if err := dc.c.ensureDir(); err != nil {
		return nil, err
	}
	// A map read at load (regions holds what it held, so rewriting it
	// never drops a region, whatever part of the rewrite a crash keeps),
	// or a new one.
	f, err := v.pool.fs.OpenRegular(dc.rel(), os.O_RDWR)
	created := errors.Is(err, fs.ErrNotExist)
	if created {
		f, err = v.pool.fs.OpenFile(dc.rel(), os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
	}
	if err != nil {
		return nil, hostile(err)
	}
	if err := dc.writeMap(f, regions); err != nil {
		_ = f.Close()
		return nil, err
	}
	if created {
		if err := v.pool.fs.SyncDir(v.changesDir()); err != nil {
			_ = f.Close()
			return nil, fmt.Errorf("%w: %w", errMapSync, err)
		}
	}
	return f, nil
}

// ensureDir makes the changes directory of a volume from before change
// tracking.
func (c *changeLog) ensureDir() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.legacy {
		return nil
	}
	v := c.v
	if err := v.pool.fs.Mkdir(v.changesDir(), 0o700); err != nil && !errors.Is(err, fs.ErrExist) {
		return err
	}
	if err := v.pool.fs.SyncDir(path.Dir(v.changesDir())); err != nil {
		return fmt.Errorf("%w: %w", errMapSync, err)
	}
	c.legacy = false
	return nil
}

// writeMap writes the header (all flag as it is) and regions into f, and
// syncs it.
func (dc *diskChanges) writeMap(f storage.File, regions *bitset) error {
	p := append(dc.header(dc.flags()), regions.bytes()...)
	if _, err := f.WriteAt(p, 0); err != nil {
		return err
	}
	if err := f.Truncate(int64(len(p))); err != nil {
		return err
	}
	if err := f.Sync(); err != nil {
		return fmt.Errorf("%w: %w", errMapSync, err)
	}
	return nil
}

// flags (mu held) is the live map's flag word: the all flag, and the
// checkpoint that recovers lazily recorded changes (lazy.go).
func (dc *diskChanges) flags() uint64 {
	var flags uint64
	if dc.all.Load() {
		flags = changeAll
	}
	if dc.lazySeq != 0 {
		flags |= changeLazy | dc.lazySeq<<8
	}
	return flags
}

func (dc *diskChanges) header(flags uint64) []byte {
	h := make([]byte, changeHeader)
	copy(h, liveMagic)
	binary.LittleEndian.PutUint64(h[8:], changeRegion)
	binary.LittleEndian.PutUint64(h[16:], uint64(dc.size))
	binary.LittleEndian.PutUint64(h[24:], flags)
	return h
}

func (dc *diskChanges) readLive(f storage.File) error {
	st, err := f.Stat()
	if err != nil {
		return err
	}
	if st.Size() < changeHeader {
		return fmt.Errorf("%d bytes, not a live change map", st.Size())
	}
	// A longer file (a disk removed and added smaller under its name) is
	// read as far as this disk goes.
	p := make([]byte, min(st.Size(), changeHeader+8*int64(len(dc.regions.words))))
	if _, err := f.ReadAt(p, 0); err != nil && !errors.Is(err, io.EOF) {
		return err
	}
	if string(p[:8]) != liveMagic || binary.LittleEndian.Uint64(p[8:]) != changeRegion {
		return errors.New("bad header")
	}
	flags := binary.LittleEndian.Uint64(p[24:])
	if flags&changeAll != 0 {
		dc.all.Store(true)
	}
	dc.regions.load(p[changeHeader:])
	if flags&changeLazy != 0 {
		return dc.recoverLazy(flags >> 8)
	}
	return nil
}

// mark records that [off, off+length) is about to change: in memory, and
// ahead in the live map for a region not yet there. The caller holds the
// gate shared and calls it before changing the image; when it fails the
// change must not be made.
func (dc *diskChanges) mark(off, length int64) error {
	if length <= 0 {
		return nil
	}
	dc.fine.Load().add(off, length)
	if dc.lazy.Load() {
		return nil
	}
	first, last := off/changeRegion, (off+length-1)/changeRegion
	for i := first; i <= last; i++ {
		if !dc.regions.has(i) {
			return dc.markRegions(first, last)
		}
	}
	return nil
}

// tryMark is mark without waiting: false when a region of the range is not
// in the live map yet (the caller takes the path that may wait).
func (dc *diskChanges) tryMark(off, length int64) bool {
	if length <= 0 {
		return true
	}
	if dc.lazy.Load() {
		dc.fine.Load().add(off, length)
		return true
	}
	for i := off / changeRegion; i <= (off+length-1)/changeRegion; i++ {
		if !dc.regions.has(i) {
			return false
		}
	}
	dc.fine.Load().add(off, length)
	return true
}

// markRegions writes the missing regions of [first, last] into the live map
// and syncs it; only then are they set in memory, so a region found set
// there is durable. Concurrent marks share one sync (group commit).
func (dc *diskChanges) markRegions(first, last int64) error {
	dc.mu.Lock()
	defer dc.mu.Unlock()
	missing := false
	for i := first; i <= last; i++ {
		if !dc.regions.has(i) {
			missing = true
			dc.pending[i/64] |= 1 << (i % 64)
		}
	}
	if !missing {
		return dc.err
	}
	want := dc.next
	for {
		if dc.err != nil {
			return dc.err
		}
		if err, ok := dc.failedBatch[want]; ok {
			return err
		}
		if dc.done >= want {
			return nil
		}
		if !dc.syncing {
			dc.lead()
			continue
		}
		dc.batchDone.Wait()
	}
}

// lead (mu held) writes and syncs every pending word as batch next, with
// mu released meanwhile, then sets them durable in memory.
func (dc *diskChanges) lead() {
	batch, words := dc.next, dc.pending
	dc.next++
	dc.pending = map[int64]uint64{}
	dc.syncing = true
	f := dc.f
	next := newBitset(changeRegion, dc.size)
	next.or(dc.regions)
	for wi, w := range words {
		if int(wi) < len(next.words) {
			next.words[wi].Or(w)
		}
	}
	dc.mu.Unlock()
	var err error
	if f == nil {
		f, err = dc.create(next)
	} else {
		var b [8]byte
		for wi := range words {
			if int(wi) >= len(next.words) {
				continue
			}
			binary.LittleEndian.PutUint64(b[:], next.words[wi].Load())
			if _, err = f.WriteAt(b[:], changeHeader+8*wi); err != nil {
				break
			}
		}
		if err == nil {
			if serr := f.Sync(); serr != nil {
				err = fmt.Errorf("%w: %w", errMapSync, serr)
			}
		}
	}
	dc.mu.Lock()
	dc.syncing = false
	dc.done = batch
	switch {
	case err == nil:
		if dc.f == nil {
			dc.f = f
		}
		for wi, w := range words {
			if int(wi) < len(dc.regions.words) {
				dc.regions.words[wi].Or(w)
			}
		}
	default:
		err = dc.failed(err)
		if dc.err == nil {
			dc.failedBatch[batch] = err
			delete(dc.failedBatch, batch-64) // long seen by its waiters
		}
	}
	dc.batchDone.Broadcast()
}

// idle (mu held) waits until no batch is being written: a writer of the
// whole map (reset, markAll) holds mu from then on, so none starts.
func (dc *diskChanges) idle() {
	for dc.syncing {
		dc.batchDone.Wait()
	}
}

// errMapSync marks a failed sync of a live map: final, since what the
// kernel failed to write may be lost while it reads back as written.
var errMapSync = errors.New("sync of the live change map failed")

// failed maps an error writing the live map: a failed sync is final (every
// later change is refused); anything else (a read-only remount, no space)
// fails this change only, as nothing was recorded.
func (dc *diskChanges) failed(err error) error {
	err = fmt.Errorf("change tracking of disk %q: the live change map cannot be written, so the change is not made: %w", dc.name, err)
	if errors.Is(err, errMapSync) {
		dc.err = fmt.Errorf("%w: %w", ErrIO, err)
		return dc.err
	}
	return err
}

// markAll records, ahead, that the whole disk changes.
func (dc *diskChanges) markAll() error {
	dc.mu.Lock()
	defer dc.mu.Unlock()
	dc.idle()
	if dc.err != nil {
		return dc.err
	}
	was := dc.all.Swap(true)
	var err error
	if dc.f == nil {
		err = dc.open(dc.regions)
	} else {
		err = dc.writeMap(dc.f, dc.regions)
	}
	if err != nil {
		dc.all.Store(was)
		return dc.failed(err)
	}
	return nil
}

// resize (gate held exclusively) follows a disk that grew.
func (dc *diskChanges) resize(size int64) {
	dc.mu.Lock()
	defer dc.mu.Unlock()
	dc.idle()
	if size <= dc.size {
		return
	}
	dc.size = size
	dc.regions.resize(size)
	dc.fine.Load().resize(size)
}

// epoch is what a cut took from a disk: its granules and all flag.
type epoch struct {
	dc   *diskChanges
	fine *bitset
	all  bool
}

// cut (gate held exclusively) ends the current epoch of every disk of m,
// returning each one's changes for sealing.
func (c *changeLog) cut(disks []*diskChanges) []epoch {
	out := make([]epoch, 0, len(disks))
	for _, dc := range disks {
		// The new epoch is written ahead until its snapshot is committed
		// (lazy.go); the live map still names the old one's for recovery
		// until the reset after the seal.
		dc.lazy.Store(false)
		fresh := newBitset(changeGranule, dc.size)
		out = append(out, epoch{dc: dc, fine: dc.fine.Swap(fresh), all: dc.all.Swap(false)})
	}
	return out
}

// tracked opens the tracking of every disk of disks (before a cut: it may
// write).
func (c *changeLog) tracked(disks []DiskSpec) ([]*diskChanges, error) {
	out := make([]*diskChanges, 0, len(disks))
	for _, d := range disks {
		dc, err := c.disk(d)
		if err != nil {
			return nil, err
		}
		out = append(out, dc)
	}
	return out, nil
}

// reserve returns the next checkpoint's sequence number, never given again.
func (c *changeLog) reserve() uint64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	seq := c.next
	c.next++
	return seq
}

// seal writes each epoch as sealed epoch seq (durable on return), then
// resets each live map to the regions of the epoch begun at the cut.
func (c *changeLog) seal(seq uint64, eps []epoch) error {
	v := c.v
	if err := c.ensureDir(); err != nil {
		return fmt.Errorf("seal changes: %w", err)
	}
	for _, e := range eps {
		var flags uint64
		if e.all {
			flags = changeAll
		}
		p := make([]byte, changeHeader, changeHeader+8*len(e.fine.words)+4)
		copy(p, sealedMagic)
		binary.LittleEndian.PutUint64(p[8:], changeGranule)
		binary.LittleEndian.PutUint64(p[16:], uint64(e.dc.size))
		binary.LittleEndian.PutUint64(p[24:], flags)
		p = append(p, e.fine.bytes()...)
		p = binary.LittleEndian.AppendUint32(p, crc32.ChecksumIEEE(p))
		rel := path.Join(v.changesDir(), e.dc.name+"."+strconv.FormatUint(seq, 10))
		if err := durable.WriteFile(v.pool.fs, rel, p, 0o600); err != nil {
			return fmt.Errorf("seal changes of disk %q: %w", e.dc.name, hostile(err))
		}
	}
	for _, e := range eps {
		if err := e.dc.reset(); err != nil {
			return err
		}
	}
	return nil
}

// reset rewrites the live map to hold the regions of the current epoch's
// granules, and its all flag. Regions not in it become free to be written
// ahead again.
func (dc *diskChanges) reset() error {
	dc.mu.Lock()
	defer dc.mu.Unlock()
	dc.idle()
	if dc.err != nil {
		return dc.err
	}
	regions := newBitset(changeRegion, dc.size)
	regions.or(dc.fine.Load())
	// The epoch recovered through lazySeq's snapshot is sealed now; the
	// new one was written ahead since the cut.
	dc.lazySeq = 0
	if dc.f == nil {
		if regions.empty() && !dc.all.Load() {
			return nil // no live map is an empty one
		}
		if err := dc.open(regions); err != nil {
			return dc.failed(err)
		}
		return nil
	}
	// While the file is rewritten, a region is durable only if both its
	// old and its new content hold it: memory keeps just those, and a mark
	// of any other region waits for mu.
	for i := range dc.regions.words {
		dc.regions.words[i].And(regions.words[i].Load())
	}
	if err := dc.writeMap(dc.f, regions); err != nil {
		return dc.failed(err)
	}
	for i := range dc.regions.words {
		dc.regions.words[i].Store(regions.words[i].Load())
	}
	return nil
}

// readSealed reads sealed epoch seq of disk: its granules, or nil when it
// is missing. A damaged one reads as all changed.
func (c *changeLog) readSealed(disk string, seq uint64, size int64) (fine *bitset, all bool, err error) {
	v := c.v
	rel := path.Join(v.changesDir(), disk+"."+strconv.FormatUint(seq, 10))
	f, err := v.pool.fs.OpenRegular(rel, os.O_RDONLY)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, false, nil
	}
	if err != nil {
		return nil, false, hostile(err)
	}
	defer f.Close()
	maxLen := changeHeader + 8*((MaxSize/changeGranule+63)/64) + 4
	p, err := io.ReadAll(io.LimitReader(io.NewSectionReader(f, 0, maxLen+1), maxLen+1))
	if err != nil {
		return nil, false, err
	}
	bad := func(why string) (*bitset, bool, error) {
		v.pool.log.Warn("sealed change epoch damaged; the disk counts as changed whole in it",
			"volume", v.name, "disk", disk, "checkpoint", seq, "why", why)
		return newBitset(changeGranule, size), true, nil
	}
	if len(p) < changeHeader+4 || int64(len(p)) > maxLen {
		return bad("size")
	}
	body, sum := p[:len(p)-4], binary.LittleEndian.Uint32(p[len(p)-4:])
	if crc32.ChecksumIEEE(body) != sum {
		return bad("checksum")
	}
	if string(body[:8]) != sealedMagic || binary.LittleEndian.Uint64(body[8:]) != changeGranule {
		return bad("header")
	}
	sealedSize := int64(binary.LittleEndian.Uint64(body[16:]))
	if sealedSize < 0 || sealedSize > MaxSize {
		return bad("disk size")
	}
	fine = newBitset(changeGranule, max(size, sealedSize))
	fine.load(body[changeHeader:])
	return fine, binary.LittleEndian.Uint64(body[24:])&changeAll != 0, nil
}

// ChangedRange is a range of a disk that may differ between two points.
type ChangedRange struct {
	Offset int64 `json:"offset"`
	Length int64 `json:"length"`
}

// DiskDelta is what changed in one disk between two points: every byte
// that differs is in Ranges (more may be: tracking is per 64 KiB granule,
// and per 1 MiB region after a crash). Whole says every byte may differ:
// the disk is new since the base, or was replaced whole (a rollback).
type DiskDelta struct {
	Disk     string         `json:"disk"`
	Size     int64          `json:"size"`
	BaseSize int64          `json:"baseSize"` // 0: the disk is not in the base
	Whole    bool           `json:"whole"`
	Ranges   []ChangedRange `json:"ranges"`
	// Changed is the bytes in Ranges.
	Changed int64 `json:"changed"`
}

// Changes returns, disk by disk, what changed between snapshot from and
// snapshot to (the live disks when to is empty). Both snapshots must be
// checkpoints (ErrNoCheckpoint otherwise); to may be older than from. The
// disks listed are those of to (or of the volume).
func (v *Volume) Changes(ctx context.Context, from, to string) ([]DiskDelta, error) {
	if err := ValidateName("from", from); err != nil {
		return nil, err
	}
	if to != "" {
		if err := ValidateName("to", to); err != nil {
			return nil, err
		}
	}
	unlock, err := v.rlockOps("changes")
	if err != nil {
		return nil, err
	}
	defer unlock()
	base, err := v.snapshotManifest(from)
	if err != nil {
		return nil, err
	}
	if err := v.checkpointHere(base); err != nil {
		return nil, err
	}
	disks, lo, hi, live := v.manifest().Disks, base.Checkpoint, uint64(0), true
	if to != "" {
		target, err := v.snapshotManifest(to)
		if err != nil {
			return nil, err
		}
		if err := v.checkpointHere(target); err != nil {
			return nil, err
		}
		disks, hi, live = target.Disks, target.Checkpoint, false
		if hi < lo {
			lo, hi = hi, lo
		}
	}
	c, err := v.changes()
	if err != nil {
		return nil, err
	}
	named := map[uint64]string{}
	v.mu.Lock()
	for _, s := range v.snaps {
		if s.Checkpoint != 0 {
			named[s.Checkpoint] = s.Name
		}
	}
	v.mu.Unlock()
	c.mu.Lock()
	end := c.next
	c.mu.Unlock()
	if !live {
		end = hi + 1
	}
	out := make([]DiskDelta, 0, len(disks))
	for _, d := range disks {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		dd := DiskDelta{Disk: d.Name, Size: d.Size}
		if i := slices.IndexFunc(base.Disks, func(b DiskSpec) bool { return b.Name == d.Name }); i >= 0 {
			dd.BaseSize = base.Disks[i].Size
		}
		acc := newBitset(changeGranule, d.Size)
		whole := dd.BaseSize == 0
		for seq := lo + 1; seq < end && !whole; seq++ {
			fine, all, err := c.readSealed(d.Name, seq, d.Size)
			if err != nil {
				return nil, err
			}
			if fine == nil {
				if name, ok := named[seq]; ok {
					return nil, fmt.Errorf("disk %q: the changes up to snapshot %s@%s (checkpoint %d) are missing from the pool: %w",
						d.Name, v.name, name, seq, ErrNoCheckpoint)
				}
				continue // a checkpoint whose snapshot never committed, and that sealed nothing
			}
			whole = whole || all
			acc.or(fine)
		}
		if live && !whole {
			dc, err := c.disk(d)
			if err != nil {
				return nil, err
			}
			v.gate.RLock()
			whole = dc.all.Load()
			acc.or(dc.fine.Load())
			v.gate.RUnlock()
		}
		dd.Whole = whole
		if whole {
			dd.Ranges = []ChangedRange{{0, d.Size}}
		} else {
			dd.Ranges = acc.ranges(d.Size)
			if dd.BaseSize < d.Size {
				dd.Ranges = addRange(dd.Ranges, ChangedRange{dd.BaseSize, d.Size - dd.BaseSize})
			}
		}
		for _, r := range dd.Ranges {
			dd.Changed += r.Length
		}
		out = append(out, dd)
	}
	return out, nil
}

// checkpointHere refuses a snapshot that is no checkpoint of this pool's
// change tracking.
func (v *Volume) checkpointHere(s *snapshotManifest) error {
	switch {
	case s.Checkpoint == 0:
		return fmt.Errorf("snapshot %s@%s was taken before change tracking: %w", v.name, s.Name, ErrNoCheckpoint)
	case s.CheckpointPool != v.pool.id:
		return fmt.Errorf("snapshot %s@%s is a checkpoint of another pool (%s): %w", v.name, s.Name, s.CheckpointPool, ErrNoCheckpoint)
	}
	return nil
}

// ranges returns the set's pieces as merged byte ranges within size.
func (b *bitset) ranges(size int64) []ChangedRange {
	var out []ChangedRange
	b.each(func(i int64) {
		off := i * b.unit
		if off >= size {
			return
		}
		n := min(b.unit, size-off)
		if k := len(out) - 1; k >= 0 && out[k].Offset+out[k].Length == off {
			out[k].Length += n
			return
		}
		out = append(out, ChangedRange{off, n})
	})
	return out
}

// addRange adds r to the sorted, merged ranges rs.
func addRange(rs []ChangedRange, r ChangedRange) []ChangedRange {
	rs = append(rs, r)
	slices.SortFunc(rs, func(a, b ChangedRange) int { return int(min(max(a.Offset-b.Offset, -1), 1)) })
	out := rs[:0]
	for _, x := range rs {
		if k := len(out) - 1; k >= 0 && out[k].Offset+out[k].Length >= x.Offset {
			out[k].Length = max(out[k].Offset+out[k].Length, x.Offset+x.Length) - out[k].Offset
			continue
		}
		out = append(out, x)
	}
	return out
}

// pruneChanges removes sealed epochs no delta can need: those at or before
// the oldest checkpoint a snapshot still names (a delta from checkpoint a
// reads only epochs after a). With no checkpoint left, every sealed epoch
// goes. Best effort: a file left is pruned next time.
func (v *Volume) pruneChanges() {
	oldest := uint64(0)
	v.mu.Lock()
	for _, s := range v.snaps {
		if s.Checkpoint != 0 && (oldest == 0 || s.Checkpoint < oldest) {
			oldest = s.Checkpoint
		}
	}
	v.mu.Unlock()
	c, err := v.changes()
	if err != nil {
		return
	}
	c.mu.Lock()
	next := c.next
	c.mu.Unlock()
	if oldest == 0 {
		oldest = next - 1 // every epoch sealed so far is before any future checkpoint
	}
	es, err := v.pool.fs.ReadDir(v.changesDir())
	if err != nil {
		return
	}
	for _, e := range es {
		if _, seq, ok := sealedName(e.Name()); ok && seq <= oldest {
			_ = v.pool.fs.Remove(path.Join(v.changesDir(), e.Name()))
		}
	}
}

// markChanged records ahead that [off, off+length) of df is about to
// change (gate held shared).
func (v *Volume) markChanged(df *diskFile, off, length int64) error {
	if df.chg == nil {
		return nil
	}
	if err := df.chg.mark(off, length); err != nil {
		return fmt.Errorf("volume %q: %w", v.name, err)
	}
	return nil
}

// closeChanges closes the live maps (the volume is deleted or the pool
// closes).
func (v *Volume) closeChanges() {
	v.chgOnce.Lock()
	defer v.chgOnce.Unlock()
	if v.chg == nil {
		return
	}
	for _, dc := range v.chg.disks {
		dc.mu.Lock()
		dc.idle()
		if dc.f != nil {
			_ = dc.f.Close()
		}
		if dc.err == nil {
			dc.err = ErrClosed // no change is made untracked
		}
		dc.mu.Unlock()
	}
	v.chg = nil
}

// markAllChanged records ahead, for each disk, that it changes whole.
func (v *Volume) markAllChanged(disks []DiskSpec) error {
	c, err := v.changes()
	if err != nil {
		return err
	}
	for _, d := range disks {
		dc, err := c.disk(d)
		if err == nil {
			dc.resize(d.Size)
			err = dc.markAll()
		}
		if err != nil {
			return fmt.Errorf("volume %q: %w", v.name, err)
		}
	}
	return nil
}

// resizeChanges (gate held exclusively) follows a disk that grew.
func (v *Volume) resizeChanges(disk string, size int64) {
	c := v.loadedChanges()
	if c == nil {
		return
	}
	c.mu.Lock()
	dc := c.disks[disk]
	c.mu.Unlock()
	if dc != nil {
		dc.resize(size)
	}
}

// forgetChanges closes the tracking of a removed disk. Its live map stays:
// a disk added under its name marks itself changed whole (AddDisk).
func (v *Volume) forgetChanges(disk string) {
	c := v.loadedChanges()
	if c == nil {
		return
	}
	c.mu.Lock()
	dc := c.disks[disk]
	delete(c.disks, disk)
	c.mu.Unlock()
	if dc != nil {
		dc.mu.Lock()
		dc.idle()
		if dc.f != nil {
			_ = dc.f.Close()
		}
		if dc.err == nil {
			dc.err = ErrDiskRemoved
		}
		dc.mu.Unlock()
	}
}

// checkpoint is a snapshot's change-tracking checkpoint in the making.
type checkpoint struct {
	c     *changeLog
	disks []*diskChanges
	seq   uint64
	eps   []epoch // set by cut
}

// beginCheckpoint opens the tracking of every disk and reserves the
// checkpoint's sequence number (before the capture: it may write).
func (v *Volume) beginCheckpoint(disks []DiskSpec) (*checkpoint, error) {
	c, err := v.changes()
	if err != nil {
		return nil, err
	}
	dcs, err := c.tracked(disks)
	if err != nil {
		return nil, err
	}
	return &checkpoint{c: c, disks: dcs, seq: c.reserve()}, nil
}

// cut (gate held exclusively, at the capture's cut) ends the epoch; a nil
// checkpoint does nothing.
func (ck *checkpoint) cut() {
	if ck == nil {
		return
	}
	ck.eps = ck.c.cut(ck.disks)
	if ck.c.v.direct() {
		// The VM writes the files outside quiver: the new epoch is all
		// changed from its start (direct.go).
		for _, dc := range ck.disks {
			dc.all.Store(true)
		}
	}
}

// seal writes the epoch the cut ended; durable on return.
func (ck *checkpoint) seal() error {
	if ck == nil {
		return nil
	}
	if ck.eps == nil {
		return errors.New("change tracking: the capture returned without a cut")
	}
	return ck.c.seal(ck.seq, ck.eps)
}

// abandon puts the epoch the cut took back into the current one, after a
// capture or a seal that failed: what it held stays reported, from memory
// and from the live map or the sealed file written.
func (ck *checkpoint) abandon() {
	for _, e := range ck.eps {
		e.dc.fine.Load().or(e.fine)
		if e.all {
			e.dc.all.Store(true)
		}
	}
	ck.eps = nil
}
