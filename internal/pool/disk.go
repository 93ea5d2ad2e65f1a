package pool

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"

	"github.com/quiverstorage/quiver/internal/storage"
)

// Extent is a run of a disk that holds data or is a hole (reads as zeros).
type Extent struct {
	Offset int64
	Length int64
	Hole   bool
}

// Disk is how the data path (NBD) reads and writes one disk. Every method of
// a live disk runs under the volume's I/O gate, so a snapshot sees either all
// or none of a request, and a write that returned before the snapshot began
// is in it.
//
// The hot-path methods take no context: a pread or pwrite cannot be cancelled
// once issued, and requests are short.
//
// Durability: WriteAt, Trim and Zero without FUA (fua=false, no ZeroFUA) are
// in the page cache when they return and durable after a later Flush
// returns; with FUA they are durable when they return. Flush makes every
// write that returned before it began durable, through any handle of the
// disk.
//
// A failed sync is final: once an fdatasync of the disk has failed, Flush and
// every request with FUA fail with ErrSyncFailed on every handle of the
// disk, until no handle holds it and it is reopened (docs/durability.md). A
// handle holds its disk, not the disk's name: once the disk is removed every
// method fails with ErrDiskRemoved.
type Disk interface {
	Size() int64
	ReadOnly() bool
	ReadAt(p []byte, off int64) error
	WriteAt(p []byte, off int64, fua bool) error
	Flush() error
	// Trim deallocates a range; it then reads as zeros.
	Trim(off, length int64, fua bool) error
	// Zero writes zeros to a range; with ZeroMayTrim it may deallocate it.
	// With ZeroFast it fails with ErrNotSupported instead of writing zeros
	// slowly.
	Zero(off, length int64, flags ZeroFlags) error
	// Cache asks for a range to be read ahead into the page cache.
	Cache(off, length int64) error
	// Extents reports data and holes in [off, off+length), at most limit
	// of them when limit > 0 (they then cover only part of the range).
	Extents(off, length int64, limit int) ([]Extent, error)
	// Capabilities declares the optional ways the handle runs requests
	// (Capabilities). A wrapper declares its own: never its inner handle's,
	// unless every request through them passes the wrapper's checks.
	Capabilities() Capabilities
	Close() error
}

var (
	_ Disk = (*liveDisk)(nil)
	_ Disk = (*snapshotDisk)(nil)
)

// OpenDisk returns a read-write handle to a disk of the volume for the
// server's own use: it is outside the single-writer rule. Clients' handles
// come from Attachment.OpenDisk.
func (v *Volume) OpenDisk(name string) (Disk, error) {
	return v.openDisk(name, nil)
}

// OpenDisk returns a handle to a disk of the attachment's volume. Its writes
// obey the single-writer rule (attach.go); with a read-only attachment it is
// read-only. Closing the last handle of an implicit attachment ends it.
func (a *Attachment) OpenDisk(name string) (Disk, error) {
	d, err := a.v.openDisk(name, a)
	if err != nil {
		return nil, err
	}
	a.opened()
	return d, nil
}

func (v *Volume) openDisk(name string, a *Attachment) (Disk, error) {
	if err := ValidateName("disk", name); err != nil {
		return nil, err
	}
	if err := v.checkAlive(); err != nil {
		return nil, err
	}
	// An encrypted volume's data key is unwrapped before the gate is
	// taken: a key manager may take its time to answer.
	if _, err := v.dataCipher(); err != nil {
		return nil, err
	}
	v.gate.Lock()
	defer v.gate.Unlock()
	if v.files == nil {
		v.files = map[string]*diskFile{}
		if err := v.refreshFiles(false); err != nil {
			v.closeFiles(ErrClosed)
			v.files = nil
			return nil, err
		}
	}
	df := v.files[name]
	if df == nil {
		return nil, fmt.Errorf("disk %q of volume %q: %w", name, v.name, ErrDiskNotFound)
	}
	if df.failed() != nil && df.refs.Load() == 0 {
		var err error
		if df, err = v.reopenFailed(df); err != nil {
			return nil, err
		}
	}
	df.refs.Add(1)
	return &liveDisk{v: v, df: df, att: a}, nil
}

// openFile opens the image of disk d for I/O.
func (v *Volume) openFile(d DiskSpec) (*diskFile, error) {
	f, err := v.pool.openImage(v.pool.rel(v.diskPath(d.Name)), v.pool.diskFlag())
	if err != nil {
		return nil, fmt.Errorf("open disk %q of volume %q: %w", d.Name, v.name, err)
	}
	df := &diskFile{v: v, name: d.Name, f: f, size: d.Size, shared: d.Shared}
	df.syncEnd = sync.NewCond(&df.smu)
	if v.encrypted() {
		c := v.loadedCipher()
		if c == nil { // openDisk unwraps the key before any file is opened
			_ = f.Close()
			return nil, fmt.Errorf("open disk %q of volume %q: data key not unwrapped: %w", d.Name, v.name, ErrKeyUnavailable)
		}
		df.enc = &encDisk{c: c}
	}
	if c, err := v.changes(); err != nil {
		_ = f.Close()
		return nil, err
	} else if df.chg, err = c.disk(d); err != nil {
		_ = f.Close()
		return nil, err
	}
	if df.fill, err = v.loadFill(d); err != nil {
		_ = f.Close()
		return nil, err
	}
	if v.pool.chunk > 0 {
		df.ch = newChunks(d.Size, v.pool.chunk)
		df.us = v.pool.us
		if df.us != nil {
			df.cloneRewrite = smallCopyOnWrite(f)
		}
	}
	if df.enc != nil {
		if err := v.loadRekey(df); err != nil {
			_ = f.Close()
			return nil, err
		}
	}
	return df, nil
}

// refreshFiles (gate held exclusively) brings the open files in line with
// the manifest, once the volume has been opened for I/O: it opens the files
// of new disks and ends those of removed ones, whose handles then fail with
// ErrDiskRemoved. With replace (a rollback renamed new images into place)
// the file of every remaining disk is reopened in place: its handles follow
// the disk to its new image, whose sync state starts afresh (the image was
// synced before it was renamed in, and replaces all the old content).
func (v *Volume) refreshFiles(replace bool) error {
	if v.files == nil {
		return nil
	}
	listed := map[string]bool{}
	var first error
	for _, d := range v.manifest().Disks {
		listed[d.Name] = true
		df := v.files[d.Name]
		if df != nil && !replace {
			continue
		}
		nf, err := v.openFile(d)
		switch {
		case err != nil && df != nil:
			v.endFile(df, err)
		case err != nil:
		case df == nil:
			v.files[d.Name] = nf
		default:
			if cerr := df.f.Close(); cerr != nil {
				v.pool.log.Error("close replaced disk image", "volume", v.name, "disk", d.Name, "err", cerr)
			}
			df.f, df.size, df.shared, df.ch, df.us, df.chg = nf.f, nf.size, nf.shared, nf.ch, nf.us, nf.chg
			df.endFill()
			df.fill = nf.fill
			df.nw.readOff.Store(false)
			df.nw.writeOff.Store(false)
			df.smu.Lock()
			df.syncErr = nil
			df.smu.Unlock()
		}
		if first == nil {
			first = err
		}
	}
	for name, df := range v.files {
		if !listed[name] {
			v.endFile(df, fmt.Errorf("disk %q of volume %q: %w", name, v.name, ErrDiskRemoved))
		}
	}
	return first
}

// reopenFailed (gate held exclusively) replaces the file of a disk whose
// sync failed, once no handle holds it, with a new diskFile: a fresh open
// file, checked by an fdatasync of its own, with the image's page cache
// dropped so that reads show what the storage holds (the kernel marks the
// pages it failed to write clean, so they would still read as written).
// Until then every handle of the disk fails its flushes and FUA writes.
func (v *Volume) reopenFailed(old *diskFile) (*diskFile, error) {
	nf, err := v.openFile(DiskSpec{Name: old.name, Size: old.size, Shared: old.shared})
	if err != nil {
		return nil, err
	}
	if err := nf.f.Sync(); err != nil {
		v.pool.syncFailures.Add(1)
		_ = nf.f.Close()
		return nil, fmt.Errorf("disk %q of volume %q: reopened after a failed sync, the check fails too: %w: %w",
			old.name, v.name, ErrSyncFailed, err)
	}
	if err := nf.f.Advise(0, 0, storage.AdviseDontNeed); err != nil {
		v.pool.log.Warn("drop page cache of reopened disk", "volume", v.name, "disk", old.name, "err", err)
	}
	v.endFile(old, ErrClosed)
	v.files[old.name] = nf
	v.pool.log.Warn("disk reopened after a failed sync; writes not flushed before the failure may be lost",
		"volume", v.name, "disk", old.name, "err", old.failed())
	return nf, nil
}

// endFile (gate held exclusively) closes a disk's file and fails every
// request of its handles with err from now on.
func (v *Volume) endFile(df *diskFile, err error) {
	df.gone = err
	df.endFill()
	if cerr := df.f.Close(); cerr != nil {
		v.pool.log.Error("close disk image", "volume", v.name, "disk", df.name, "err", cerr)
	}
	df.unpin()
	if v.files[df.name] == df {
		delete(v.files, df.name)
	}
}

// closeFiles (gate held exclusively) closes every open disk file; their
// handles fail with err.
func (v *Volume) closeFiles(err error) {
	for _, df := range v.files {
		v.endFile(df, err)
	}
}

// failed returns the file's failed sync, if any.
func (df *diskFile) failed() error {
	df.smu.Lock()
	defer df.smu.Unlock()
	return df.syncErr
}

// sync makes what was written to df durable (fdatasync). A failed
// fdatasync is final for the file: Linux reports a writeback error once per
// open file and marks the pages it could not write clean, so a retry would
// succeed without the data. sync therefore keeps the first failure, logs it,
// and fails every later sync of the file with it, on every handle, until the
// disk is reopened (reopenFailed).
//
// One fdatasync of a file runs at a time, so that two concurrent flushes
// cannot split one error between them and acknowledge the other. Callers
// that arrive meanwhile share the next one (group commit): any fdatasync
// that starts after a caller arrived covers every write that returned
// before it did.
func (v *Volume) sync(df *diskFile) error {
	df.smu.Lock()
	defer df.smu.Unlock()
	want := df.syncStarted + 1 // the first sync to start from now on
	for {
		if df.syncErr != nil {
			return df.syncErr
		}
		if df.syncDone >= want {
			return nil
		}
		if !df.syncing {
			break
		}
		df.syncEnd.Wait()
	}
	df.syncing = true
	df.syncStarted++
	n := df.syncStarted
	df.smu.Unlock()
	err := df.f.Sync()
	df.smu.Lock()
	df.syncing = false
	df.syncEnd.Broadcast()
	if err != nil {
		v.pool.syncFailures.Add(1)
		df.syncErr = fmt.Errorf("disk %q of volume %q: %w (reconnect every client of the disk to reopen it): %w",
			df.name, v.name, ErrSyncFailed, err)
		v.pool.log.Error("fdatasync failed: every later flush of the disk fails until it is reopened",
			"volume", v.name, "disk", df.name, "err", err)
		return df.syncErr
	}
	df.syncDone = n
	return nil
}

// liveDisk is a handle to a disk of a live volume. It holds the disk itself,
// not its name.
type liveDisk struct {
	v      *Volume
	df     *diskFile
	att    *Attachment // nil: the server's own handle
	closed atomic.Bool
}

// file returns the disk's file; the caller holds the gate shared.
func (d *liveDisk) file() (*diskFile, error) {
	if d.closed.Load() {
		return nil, ErrClosed
	}
	if err := d.df.gone; err != nil {
		return nil, err
	}
	return d.df, nil
}

func checkRange(off, length, size int64) error {
	if off < 0 || length < 0 || off > size || length > size-off {
		return fmt.Errorf("[%d, +%d) on a disk of %d bytes: %w", off, length, size, ErrOutOfRange)
	}
	return nil
}

func (d *liveDisk) Size() int64 {
	d.v.gate.RLock()
	defer d.v.gate.RUnlock()
	if df, err := d.file(); err == nil {
		return df.size
	}
	return 0
}

func (d *liveDisk) ReadOnly() bool { return d.v.pool.readOnly || d.att != nil && d.att.ReadOnly() }

// lockWrite takes the gate shared for a write and returns the disk's file,
// once the single-writer rule admits the write; on error the gate is not
// held. A write needing the writer role claims it (exclusive gate) first.
func (d *liveDisk) lockWrite(off, length int64) (*diskFile, error) {
	if h := d.v.pool.writeHook; h != nil && d.att != nil {
		h(d.att.id)
	}
	for {
		d.v.gate.RLock()
		df, err := d.admitWrite(off, length)
		if err == nil {
			return df, nil
		}
		d.v.gate.RUnlock()
		if !errors.Is(err, errMustClaim) {
			return nil, err
		}
		if err := d.att.claim(); err != nil {
			return nil, err
		}
	}
}

// admitWrite (gate held shared) returns the disk's file if a write of
// [off, off+length) may go ahead: the handle is open, the range is on the
// disk, and the single-writer rule admits it (errMustClaim: not before the
// attachment claims the writer role).
func (d *liveDisk) admitWrite(off, length int64) (*diskFile, error) {
	df, err := d.file()
	if err == nil {
		err = checkRange(off, length, df.size)
	}
	if err == nil && d.v.pool.readOnly {
		err = d.v.pool.checkWritable("write to disk " + df.name)
	}
	if err == nil {
		err = d.att.mayWrite(df)
	}
	return df, err
}

func (d *liveDisk) ReadAt(p []byte, off int64) error {
	d.v.gate.RLock()
	defer d.v.gate.RUnlock()
	df, err := d.file()
	if err != nil {
		return err
	}
	if df.fill != nil {
		if err := checkRange(off, int64(len(p)), df.size); err != nil {
			return err
		}
		if err := df.fill.ensure(df, off, int64(len(p)), false); err != nil {
			return err
		}
	}
	if df.enc != nil {
		if err := checkRange(off, int64(len(p)), df.size); err != nil {
			return err
		}
		return df.enc.readAt(df, p, off)
	}
	return readAt(df, p, off)
}

func readAt(df *diskFile, p []byte, off int64) error {
	if err := checkRange(off, int64(len(p)), df.size); err != nil {
		return err
	}
	n, err := df.f.ReadAt(p, off)
	if errors.Is(err, io.EOF) {
		// The file is shorter than the disk only after a crash mid-grow
		// that start-up has not repaired yet: the tail reads as zeros.
		clear(p[n:])
		err = nil
	}
	return err
}

func (d *liveDisk) WriteAt(p []byte, off int64, fua bool) error {
	df, err := d.lockWrite(off, int64(len(p)))
	if err != nil {
		return err
	}
	defer d.v.gate.RUnlock()
	if err := df.fill.ensure(df, off, int64(len(p)), true); err != nil {
		return err
	}
	if df.enc != nil {
		// The blocks at the ends change whole in the image.
		a, b := df.enc.blocks(off, int64(len(p)))
		d.v.markDirty(df.name, a, b-a)
		if err := d.v.markChanged(df, a, b-a); err != nil {
			return err
		}
		if err := df.enc.write(df, p, off); err != nil {
			return err
		}
		return d.syncIf(df, fua)
	}
	d.v.markDirty(df.name, off, int64(len(p)))
	if err := d.v.markChanged(df, off, int64(len(p))); err != nil {
		return err
	}
	if err := df.write(p, off); err != nil {
		return err
	}
	return d.syncIf(df, fua)
}

func (d *liveDisk) syncIf(df *diskFile, fua bool) error {
	if !fua {
		return nil
	}
	return d.v.sync(df)
}

// Flush works for every handle, a fenced attachment's too: a stale
// writer's last FLUSH (QEMU sends one when it quits) must not fail, and it
// makes durable only what was applied: its writes from before the fence, and
// those to shared disks, which it may still write.
func (d *liveDisk) Flush() error {
	d.v.gate.RLock()
	defer d.v.gate.RUnlock()
	df, err := d.file()
	if err != nil {
		return err
	}
	return d.v.sync(df)
}

func (d *liveDisk) Trim(off, length int64, fua bool) error {
	df, err := d.lockWrite(off, length)
	if err != nil {
		return err
	}
	defer d.v.gate.RUnlock()
	if err := df.fill.ensure(df, off, length, true); err != nil {
		return err
	}
	if err := d.zero(df, off, length, true, false); err != nil {
		return err
	}
	return d.syncIf(df, fua)
}

func (d *liveDisk) Zero(off, length int64, flags ZeroFlags) error {
	df, err := d.lockWrite(off, length)
	if err != nil {
		return err
	}
	defer d.v.gate.RUnlock()
	if err := df.fill.ensure(df, off, length, true); err != nil {
		return err
	}
	if err := d.zero(df, off, length, flags&ZeroMayTrim != 0, flags&ZeroFast != 0); err != nil {
		return err
	}
	return d.syncIf(df, flags&ZeroFUA != 0)
}

// zero marks [off, off+length) dirty and changed (the whole blocks it
// touches, on an encrypted disk) and makes it read as zeros.
func (d *liveDisk) zero(df *diskFile, off, length int64, mayTrim, fast bool) error {
	a, b := off, off+length
	if df.enc != nil {
		a, b = df.enc.blocks(off, length)
	}
	d.v.markDirty(df.name, a, b-a)
	if err := d.v.markChanged(df, a, b-a); err != nil {
		return err
	}
	if df.enc != nil {
		return df.enc.zero(df, off, length, mayTrim, fast)
	}
	return df.zero(off, length, mayTrim, fast)
}

func (d *liveDisk) Cache(off, length int64) error {
	d.v.gate.RLock()
	defer d.v.gate.RUnlock()
	df, err := d.file()
	if err != nil {
		return err
	}
	return cache(df, off, length)
}

func cache(df *diskFile, off, length int64) error {
	if err := checkRange(off, length, df.size); err != nil {
		return err
	}
	return df.f.Advise(off, length, storage.AdviseWillNeed)
}

func (d *liveDisk) Extents(off, length int64, limit int) ([]Extent, error) {
	d.v.gate.RLock()
	defer d.v.gate.RUnlock()
	df, err := d.file()
	if err != nil {
		return nil, err
	}
	if err := checkRange(off, length, df.size); err != nil {
		return nil, err
	}
	if !df.fill.ready(off, length, false) {
		// Not filled yet: data, as far as anyone can tell without
		// fetching it from the fill's source.
		return []Extent{{Offset: off, Length: length}}, nil
	}
	return extents(df.f, off, length, limit)
}

func (d *liveDisk) Close() error {
	if d.closed.Swap(true) {
		return nil
	}
	d.df.refs.Add(-1)
	if d.att != nil {
		d.att.released()
	}
	return nil
}

// Attachment returns the handle's attachment (nil for the server's own).
func (d *liveDisk) Attachment() *Attachment { return d.att }

// zeroRange zeroes a range with fallocate: punching a hole when mayTrim,
// else zeroing in place. Where the filesystem cannot, it writes zeros, or
// with fast returns ErrNotSupported.
func zeroRange(df *diskFile, off, length int64, mayTrim, fast bool) error {
	if length == 0 {
		return nil
	}
	var err error
	if mayTrim {
		err = df.f.Punch(off, length)
	} else {
		err = df.f.ZeroRange(off, length)
	}
	if errors.Is(err, ErrNotSupported) {
		if fast {
			return fmt.Errorf("zero %d bytes: %w", length, ErrNotSupported)
		}
		return writeZeros(df, off, length)
	}
	return err
}

var zeroBlock = make([]byte, 1<<20)

func writeZeros(df *diskFile, off, length int64) error {
	for length > 0 {
		n := min(length, int64(len(zeroBlock)))
		if _, err := df.f.WriteAt(zeroBlock[:n], off); err != nil {
			return err
		}
		off += n
		length -= n
	}
	return nil
}

// extents reports [off, off+length) as data runs and holes
// (storage.DataRuns), stopping after limit extents when limit > 0: the cost
// is two lseek calls per data run, so a caller that needs one must not pay
// for the whole disk. A file shorter than the disk (after a crash mid-grow)
// has a hole for a tail.
func extents(f storage.File, off, length int64, limit int) ([]Extent, error) {
	end := off + length
	var out []Extent
	full := func() bool { return limit > 0 && len(out) >= limit }
	err := storage.DataRuns(f, off, end, func(start, stop int64) error {
		if start > off {
			out = append(out, Extent{Offset: off, Length: start - off, Hole: true})
			off = start
		}
		if full() {
			return errEnough
		}
		out = append(out, Extent{Offset: start, Length: stop - start})
		off = stop
		if full() {
			return errEnough
		}
		return nil
	})
	if err != nil && !errors.Is(err, errEnough) {
		return nil, err
	}
	if off < end && !full() {
		out = append(out, Extent{Offset: off, Length: end - off, Hole: true})
	}
	return out, nil
}

// errEnough stops a walk that has found what it needs.
var errEnough = errors.New("enough extents")

// ReadExtents reads the data extents among ext (which cover [off,
// off+len(p))) into p; holes are skipped.
func ReadExtents(d Disk, p []byte, off int64, ext []Extent) error {
	for _, e := range ext {
		if e.Hole {
			continue
		}
		if err := d.ReadAt(p[e.Offset-off:e.Offset-off+e.Length], e.Offset); err != nil {
			return err
		}
	}
	return nil
}

// snapshotDisk is a read-only handle to a disk of a snapshot. Snapshot
// images never change, so it needs no gate.
type snapshotDisk struct {
	df             diskFile
	v              *Volume // for ChangeReporter (changereport.go)
	snapshot, disk string
}

// OpenSnapshotDisk opens a disk of a snapshot read-only.
func (v *Volume) OpenSnapshotDisk(snapshot, disk string) (Disk, error) {
	s, err := v.Snapshot(snapshot)
	if err != nil {
		return nil, err
	}
	if err := ValidateName("disk", disk); err != nil {
		return nil, err
	}
	c, err := v.dataCipher()
	if err != nil {
		return nil, err
	}
	for _, d := range s.Disks {
		if d.Name == disk {
			f, err := v.pool.openImage(v.pool.rel(filepath.Join(v.snapshotDir(snapshot), disk+".img")), os.O_RDONLY)
			if err != nil {
				return nil, err
			}
			sd := &snapshotDisk{df: diskFile{f: f, size: d.Size}, v: v, snapshot: snapshot, disk: disk}
			if c != nil {
				sd.df.enc = &encDisk{c: c}
			}
			return sd, nil
		}
	}
	return nil, fmt.Errorf("disk %q of snapshot %s@%s: %w", disk, v.name, snapshot, ErrDiskNotFound)
}

func (d *snapshotDisk) Size() int64    { return d.df.size }
func (d *snapshotDisk) ReadOnly() bool { return true }
func (d *snapshotDisk) ReadAt(p []byte, off int64) error {
	if d.df.enc == nil {
		return readAt(&d.df, p, off)
	}
	if err := checkRange(off, int64(len(p)), d.df.size); err != nil {
		return err
	}
	return d.df.enc.readAt(&d.df, p, off)
}
func (d *snapshotDisk) WriteAt([]byte, int64, bool) error  { return ErrReadOnly }
func (d *snapshotDisk) Flush() error                       { return nil }
func (d *snapshotDisk) Trim(int64, int64, bool) error      { return ErrReadOnly }
func (d *snapshotDisk) Zero(int64, int64, ZeroFlags) error { return ErrReadOnly }
func (d *snapshotDisk) Cache(off, length int64) error      { return cache(&d.df, off, length) }
func (d *snapshotDisk) Close() error                       { return d.df.f.Close() }

// Capabilities: a snapshot's handle reports the changes since another
// snapshot, and offers nothing to run requests.
func (d *snapshotDisk) Capabilities() Capabilities { return Capabilities{Changes: d} }
func (d *snapshotDisk) Extents(off, length int64, limit int) ([]Extent, error) {
	if err := checkRange(off, length, d.df.size); err != nil {
		return nil, err
	}
	return extents(d.df.f, off, length, limit)
}

// SyncFailures returns how many fdatasync calls on disk images have failed
// since the pool was opened.
func (p *Pool) SyncFailures() int64 { return p.syncFailures.Load() }
