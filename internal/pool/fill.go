package pool

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"slices"
	"sync"
	"time"

	"github.com/quiverstorage/quiver/internal/durable"
	"github.com/quiverstorage/quiver/internal/storage"
)

// Filling: a volume served at once while its content is still being copied
// in from elsewhere (an instant restore from a backup, issue 33). The
// volume is made empty with a fill source named in its manifest; a VM may
// attach it and read and write at once. Every disk is split into fill
// units (fillUnit, 1 MiB):
//
//   - before any I/O touches a unit not filled yet, the unit is read from
//     the source and written into the image (its all-zero 64 KiB pieces
//     left as holes), one fill of a unit at a time;
//   - before a write, trim or zero changes a unit, the unit is durable as
//     filled: the image is fdatasync'd (so the unit's data is on disk) and
//     then its bit is written into the disk's fill map,
//     volumes/<vol>/fill/<disk>.map, and the map fdatasync'd. Persists are
//     group-committed: one takes every unit filled so far;
//   - a background job (Volume.Fill) fills every remaining unit in order
//     and, once all are durable, clears the manifest's fill record and
//     removes the maps.
//
// What a crash leaves. A unit whose bit is in the map holds the source's
// data plus the VM's writes since: it is never read from the source again.
// A unit whose bit is not holds, in its image, holes or the source's own
// data (a fill not yet recorded: the VM could not have written it, since a
// write waits for the bit), so filling it again from the source loses
// nothing. The map's bits are only ever set, and rewriting the bitmap
// writes every bit set before unchanged, so a torn map write keeps every
// durable bit. A map that cannot be read (a bad header) leaves the disk
// refusing I/O: nothing says which units the VM wrote.
//
// While a volume fills, what would hand out or copy its images behind the
// fill's back is refused with ErrBusy: snapshots (and so backups), clones,
// rollback, direct access, disk changes. Reads and writes through quiver,
// attachments, exports through the pool's handles, deletes and label or QoS
// updates work.

// fillUnit is the piece of a disk filled at once, and recorded per bit.
const fillUnit = 1 << 20

const (
	fillMagic  = "QVFILLM1"
	fillHeader = 32 // magic (8), unit (8), disk size (8), reserved (8)
)

// ErrFillSource: a volume being filled could not read its source (not
// connected yet after a restart, or failing).
var ErrFillSource = errors.New("the volume is being restored and its source is unavailable")

// FillState is a volume's fill record: its source, named as the caller
// chose (for a backup, "backup:<target>:<id>").
type FillState struct {
	Source  string    `json:"source"`
	Started time.Time `json:"started"`
}

// ValidateFillSource checks a fill source's name: 1 to 256 printable
// ASCII characters.
func ValidateFillSource(s string) error {
	if s == "" || len(s) > 256 {
		return invalid("fill.source", s, "must be 1 to 256 characters")
	}
	for _, c := range s {
		if c < 0x21 || c > 0x7e {
			return invalid("fill.source", s, "must be printable ASCII without spaces")
		}
	}
	return nil
}

// FillSource reads what a filling volume's disks start from.
type FillSource interface {
	// ReadDisk fills p with the bytes of disk at off.
	ReadDisk(ctx context.Context, disk string, p []byte, off int64) error
}

// FillInfo reports a filling volume's progress.
type FillInfo struct {
	Source      string
	Started     time.Time
	FilledBytes int64 // durable as filled
	TotalBytes  int64
}

// fillOps are the control operations a filling volume allows.
var fillOps = []string{"delete", "update", "set backup policy", "set DR policy", "delete snapshot", "finish restore"}

// checkNotFilling refuses op while the volume fills.
func (v *Volume) checkNotFilling(op string) error {
	v.mu.Lock()
	fill := v.m.Fill
	v.mu.Unlock()
	if fill == nil || slices.Contains(fillOps, op) {
		return nil
	}
	return fmt.Errorf("%s: volume %q is being restored from %s: wait until the restore is done (quiver volume get %s): %w",
		op, v.name, fill.Source, v.name, ErrBusy)
}

// Filling returns the volume's fill record, nil once it is whole.
func (v *Volume) Filling() *FillState {
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.m.Fill == nil {
		return nil
	}
	f := *v.m.Fill
	return &f
}

// diskFill is the fill state of one disk of a filling volume.
type diskFill struct {
	v    *Volume
	name string
	size int64

	filled  *bitset // units whose data is in the image (maybe not on disk yet)
	durable *bitset // units recorded in the map on disk

	mu   sync.Mutex
	busy map[int64]chan struct{} // units being filled; closed when done

	pmu sync.Mutex   // one persist at a time; guards f and err
	f   storage.File // the map, nil until first written
	err error        // a failed map write or sync: final until reopened
}

func (v *Volume) fillDir() string { return path.Join("volumes", v.name, "fill") }

func (fl *diskFill) rel() string { return path.Join(fl.v.fillDir(), fl.name+".map") }

// loadFill returns disk d's fill state when the volume fills, from its map.
// A missing map means nothing is durable as filled yet.
func (v *Volume) loadFill(d DiskSpec) (*diskFill, error) {
	if v.Filling() == nil {
		return nil, nil
	}
	fl := &diskFill{v: v, name: d.Name, size: d.Size, filled: newBitset(fillUnit, d.Size),
		durable: newBitset(fillUnit, d.Size), busy: map[int64]chan struct{}{}}
	f, err := v.pool.fs.OpenRegular(fl.rel(), os.O_RDWR)
	if errors.Is(err, storage.ErrReadOnly) || v.pool.readOnly {
		f, err = v.pool.fs.OpenRegular(fl.rel(), os.O_RDONLY)
	}
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return fl, nil
	case err != nil:
		return nil, hostile(err)
	}
	p, err := io.ReadAll(io.NewSectionReader(f, 0, fillHeader+int64(len(fl.durable.bytes()))+1))
	if err == nil {
		err = fl.parse(p)
	}
	if err != nil {
		_ = f.Close()
		return nil, fmt.Errorf("fill map of disk %q of volume %q: %w: which blocks the VM wrote is unknown; restore the backup again into a new volume: %w",
			d.Name, v.name, err, ErrBroken)
	}
	fl.f = f
	fl.filled.or(fl.durable)
	v.fillDurable.Add(int64(fl.durable.count()) * fillUnit)
	return fl, nil
}

func (fl *diskFill) header() []byte {
	h := make([]byte, fillHeader)
	copy(h, fillMagic)
	binary.LittleEndian.PutUint64(h[8:], fillUnit)
	binary.LittleEndian.PutUint64(h[16:], uint64(fl.size))
	return h
}

func (fl *diskFill) parse(p []byte) error {
	want := fillHeader + len(fl.durable.bytes())
	switch {
	case len(p) != want:
		return fmt.Errorf("%d bytes, want %d", len(p), want)
	case string(p[:8]) != fillMagic:
		return errors.New("bad magic")
	case binary.LittleEndian.Uint64(p[8:]) != fillUnit || binary.LittleEndian.Uint64(p[16:]) != uint64(fl.size):
		return errors.New("unit or disk size differ from the volume's")
	}
	fl.durable.load(p[fillHeader:])
	return nil
}

// ensure makes every unit of [off, off+length) filled, and durable too when
// the caller is about to change them. Gate held shared.
func (fl *diskFill) ensure(df *diskFile, off, length int64, durable bool) error {
	if fl == nil || length <= 0 {
		return nil
	}
	first, last := off/fillUnit, (off+length-1)/fillUnit
	for u := first; u <= last; u++ {
		if err := fl.fillUnit(df, u); err != nil {
			return err
		}
	}
	if !durable {
		return nil
	}
	for u := first; u <= last; u++ {
		if !fl.durable.has(u) {
			return fl.persist(df)
		}
	}
	return nil
}

// ready reports whether every unit of [off, off+length) is filled (and
// durable, if asked): a request that tries not to wait goes ahead only
// then.
func (fl *diskFill) ready(off, length int64, durable bool) bool {
	if fl == nil || length <= 0 {
		return true
	}
	b := fl.filled
	if durable {
		b = fl.durable
	}
	for u := off / fillUnit; u <= (off+length-1)/fillUnit; u++ {
		if !b.has(u) {
			return false
		}
	}
	return true
}

// fillUnit fills unit u unless it is filled; a fill of it already under
// way is waited for.
func (fl *diskFill) fillUnit(df *diskFile, u int64) error {
	for {
		if fl.filled.has(u) {
			return nil
		}
		fl.mu.Lock()
		if fl.filled.has(u) {
			fl.mu.Unlock()
			return nil
		}
		if wait := fl.busy[u]; wait != nil {
			fl.mu.Unlock()
			<-wait
			continue
		}
		done := make(chan struct{})
		fl.busy[u] = done
		fl.mu.Unlock()

		err := fl.load(df, u)
		if err == nil {
			fl.filled.add(u*fillUnit, 1)
		}
		fl.mu.Lock()
		delete(fl.busy, u)
		close(done)
		fl.mu.Unlock()
		return err
	}
}

var fillBuffers = sync.Pool{New: func() any { b := make([]byte, fillUnit); return &b }}

// fillTimeout bounds the read of one unit from the source.
const fillTimeout = 2 * time.Minute

// load reads unit u from the source and writes its data into the image,
// leaving all-zero 64 KiB pieces as they are (holes: nothing but the fill
// writes a unit not filled yet).
func (fl *diskFill) load(df *diskFile, u int64) error {
	src := fl.v.fillSource()
	if src == nil {
		return fmt.Errorf("disk %q of volume %q: %w: the restore is not running (it resumes when the server starts)",
			fl.name, fl.v.name, ErrFillSource)
	}
	bp := fillBuffers.Get().(*[]byte)
	defer fillBuffers.Put(bp)
	off := u * fillUnit
	p := (*bp)[:min(fillUnit, fl.size-off)]
	ctx, cancel := context.WithTimeout(context.Background(), fillTimeout)
	err := src.ReadDisk(ctx, fl.name, p, off)
	cancel()
	if err != nil {
		return fmt.Errorf("disk %q of volume %q at %d: %w: %w", fl.name, fl.v.name, off, ErrFillSource, err)
	}
	// Write runs of pieces holding data.
	const piece = changeGranule
	for lo := 0; lo < len(p); {
		if IsZero(p[lo:min(lo+piece, len(p))]) {
			lo += piece
			continue
		}
		hi := lo + piece
		for hi < len(p) && !IsZero(p[hi:min(hi+piece, len(p))]) {
			hi += piece
		}
		hi = min(hi, len(p))
		if err := df.write(p[lo:hi], off+int64(lo)); err != nil {
			return fmt.Errorf("restore disk %q of volume %q at %d: %w", fl.name, fl.v.name, off+int64(lo), err)
		}
		lo = hi
	}
	return nil
}

// IsZero reports whether every byte of p is zero (a hole's worth of data).
func IsZero(p []byte) bool {
	for len(p) >= 8 {
		if binary.LittleEndian.Uint64(p) != 0 {
			return false
		}
		p = p[8:]
	}
	for _, b := range p {
		if b != 0 {
			return false
		}
	}
	return true
}

// persist makes every unit filled so far durable as filled: the image is
// synced, then the map written and synced. Concurrent callers queue; each
// finds what the one before it made durable.
func (fl *diskFill) persist(df *diskFile) error {
	fl.pmu.Lock()
	defer fl.pmu.Unlock()
	if fl.err != nil {
		return fl.err
	}
	// Taken before the sync: every unit in it was written before.
	bits := fl.filled.bytes()
	if slices.Equal(bits, fl.durable.bytes()) {
		return nil
	}
	if err := fl.v.pool.checkWritable("restore of disk " + fl.name); err != nil {
		return err
	}
	if err := fl.v.sync(df); err != nil {
		return err
	}
	if err := fl.write(bits); err != nil {
		fl.err = fmt.Errorf("fill map of disk %q of volume %q: %w", fl.name, fl.v.name, err)
		return fl.err
	}
	before := fl.durable.count()
	fl.durable.load(bits)
	fl.v.fillDurable.Add(int64(fl.durable.count()-before) * fillUnit)
	return nil
}

// write writes the map with bits, and syncs it: made whole and atomically
// the first time, then rewritten in place (only ever adding bits).
func (fl *diskFill) write(bits []byte) error {
	p := append(fl.header(), bits...)
	fsys := fl.v.pool.fs
	if fl.f == nil {
		if err := fsys.Mkdir(fl.v.fillDir(), 0o700); err != nil && !errors.Is(err, fs.ErrExist) {
			return err
		}
		if err := fsys.SyncDir(path.Dir(fl.v.fillDir())); err != nil {
			return err
		}
		if err := durable.WriteFile(fsys, fl.rel(), p, 0o600); err != nil {
			return err
		}
		f, err := fsys.OpenRegular(fl.rel(), os.O_RDWR)
		if err != nil {
			return err
		}
		fl.f = f
		return nil
	}
	if _, err := fl.f.WriteAt(p, 0); err != nil {
		return err
	}
	return fl.f.Sync()
}

// endFill drops a disk file's fill state (the file ends, or the volume is
// whole).
func (df *diskFile) endFill() {
	if fl := df.fill; fl != nil {
		fl.v.fillDurable.Add(-int64(fl.durable.count()) * fillUnit)
		fl.close()
		df.fill = nil
	}
}

func (fl *diskFill) close() {
	fl.pmu.Lock()
	defer fl.pmu.Unlock()
	if fl.f != nil {
		_ = fl.f.Close()
		fl.f = nil
	}
}

type fillSourceBox struct{ src FillSource }

func (v *Volume) fillSource() FillSource {
	if b := v.fillSrc.Load(); b != nil {
		return b.src
	}
	return nil
}

// ConnectFill connects a filling volume's source for the I/O that reaches
// units not filled yet, before any copy runs (Fill connects it too): a
// caller that hands the volume out at once connects it first.
func (v *Volume) ConnectFill(src FillSource) {
	if v.Filling() != nil {
		v.fillSrc.Store(&fillSourceBox{src})
	}
}

// Fill connects a filling volume to its source and copies every unit not
// filled yet, reporting bytes to prog; once every unit of every disk is
// durable it clears the fill record, and the volume is an ordinary one.
// The source stays connected when Fill fails (the VM's reads and writes
// of units not filled still fetch from it); a later Fill may take over.
// Fill of a volume that is not filling returns nil.
func (v *Volume) Fill(ctx context.Context, src FillSource, prog Progress) error {
	if prog == nil {
		prog = noProgress{}
	}
	if v.Filling() == nil {
		return nil
	}
	v.fillSrc.Store(&fillSourceBox{src})
	m := v.manifest()
	handles := make([]*liveDisk, 0, len(m.Disks))
	defer func() {
		for _, h := range handles {
			_ = h.Close()
		}
	}()
	for _, d := range m.Disks {
		h, err := v.openDisk(d.Name, nil)
		if err != nil {
			return err
		}
		handles = append(handles, h.(*liveDisk))
		prog.AddTotal(d.Size)
	}
	for _, h := range handles {
		if err := h.fill(ctx, prog); err != nil {
			return err
		}
	}
	return v.finishFill()
}

// fillBatch is how many units the background fill copies between persists.
const fillBatch = 64

// fill copies every unit of the handle's disk not filled yet.
func (d *liveDisk) fill(ctx context.Context, prog Progress) error {
	var size int64
	for u := int64(0); ; u++ {
		if err := ctx.Err(); err != nil {
			return err
		}
		d.v.gate.RLock()
		df, err := d.file()
		if err != nil {
			d.v.gate.RUnlock()
			return err
		}
		size = df.size
		fl := df.fill
		if fl == nil || u*fillUnit >= size {
			d.v.gate.RUnlock()
			return nil
		}
		err = fl.fillUnit(df, u)
		if err == nil && ((u+1)%fillBatch == 0 || (u+1)*fillUnit >= size) {
			err = fl.persist(df)
		}
		d.v.gate.RUnlock()
		if err != nil {
			return err
		}
		prog.Add(min(fillUnit, size-u*fillUnit))
	}
}

// finishFill clears the fill record once every unit of every disk is
// durable as filled, then removes the maps.
func (v *Volume) finishFill() error {
	unlock, err := v.lockOps("finish restore")
	if err != nil {
		return err
	}
	defer unlock()
	v.gate.Lock()
	defer v.gate.Unlock()
	m := v.manifest()
	if m.Fill == nil {
		return nil
	}
	for _, d := range m.Disks {
		df := v.files[d.Name]
		if df == nil || df.fill == nil {
			return fmt.Errorf("finish restore of volume %q: disk %q not open", v.name, d.Name)
		}
		for u := int64(0); u*fillUnit < d.Size; u++ {
			if !df.fill.durable.has(u) {
				return fmt.Errorf("finish restore of volume %q: disk %q not whole at %d", v.name, d.Name, u*fillUnit)
			}
		}
	}
	m.Fill = nil
	if err := v.commit(m); err != nil {
		return err
	}
	for _, df := range v.files {
		df.endFill()
	}
	v.fillSrc.Store(nil)
	v.fillDurable.Store(0)
	v.removeFillMaps()
	return nil
}

// removeFillMaps removes the fill maps of a volume that is whole (left by
// a crash after its fill record was cleared, or just now).
func (v *Volume) removeFillMaps() {
	fsys := v.pool.fs
	es, err := fsys.ReadDir(v.fillDir())
	if err != nil {
		return
	}
	for _, e := range es {
		_ = fsys.Remove(path.Join(v.fillDir(), e.Name()))
	}
	_ = fsys.Remove(v.fillDir())
}

// fillInfo reports the fill's progress.
func (v *Volume) fillInfo(m volumeManifest) *FillInfo {
	if m.Fill == nil {
		return nil
	}
	fi := &FillInfo{Source: m.Fill.Source, Started: m.Fill.Started, FilledBytes: v.fillDurable.Load()}
	for _, d := range m.Disks {
		fi.TotalBytes += d.Size
	}
	fi.FilledBytes = min(fi.FilledBytes, fi.TotalBytes)
	return fi
}
