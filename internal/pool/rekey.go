package pool

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"hash/fnv"
	"io/fs"
	"os"
	"path"
	"slices"
	"time"

	"github.com/quiverstorage/quiver/internal/crypt"
	"github.com/quiverstorage/quiver/internal/durable"
	"github.com/quiverstorage/quiver/internal/storage"
)

// Rekeying an encrypted volume (docs/encryption.md).
//
// A shallow rekey wraps the volume's data key under a new KEK and destroys
// the old KEK: one manifest write, no block changes.
//
// A deep rekey draws a new data key and re-encrypts every block of every
// disk under it while the VM runs. The manifest records the new key
// (Rekey) for the whole of it; each disk keeps a mark: its blocks below the
// mark are under the new key, the others under the old. The rekey moves a
// disk's mark one step at a time (rekeyStep bytes), with the block locks of
// the step held exclusively, and VM I/O in between picks the key of each
// block by the mark. A crash may stop a step midway, leaving blocks of it
// under either key, so each step is journaled first, in the disk's rekey
// journal (rekey/<disk>.journal):
//
//  1. the step's ciphertext as it was (old key) goes to the journal with
//     a header "step at mark M in progress", fdatasync;
//  2. the step's blocks re-encrypted under the new key are written to the
//     image, fdatasync;
//  3. a header "done up to M+step" goes to the journal, fdatasync; only
//     then does the mark move in memory and the step's locks drop.
//
// Opening the disk after a crash reads the journal's newest valid header:
// "done up to M" gives the mark; "in progress at M" with its data intact
// puts the old ciphertext back (so the whole step is under the old key
// again) and gives M; with its data torn, step 1 never finished, the image
// was not touched, and the mark is M. Headers alternate between two slots
// with a sequence number, so a torn header leaves the one before it. The
// journal holds only ciphertext, never plaintext. Blocks of zeros are zeros
// under both keys (the zero rule) and are never written; holes are skipped
// whole.
//
// When every disk's mark is at its end, one manifest write makes the new
// key the volume's, and the old KEK is destroyed: the old data key is then
// gone, except in the clones that hold their own copy of it. A deep rekey
// refuses a volume with snapshots (they would stay under the old key), and
// while one is in progress, interrupted or not, snapshots, clones and disk
// changes are refused; running it again goes on from the marks.

// RekeyState is an encrypted volume's deep rekey in progress, kept in its
// manifest.
type RekeyState struct {
	NewKey    crypt.WrappedKey `json:"newKey"`
	NewKeyUID string           `json:"newKeyUID"`
	StartedAt time.Time        `json:"startedAt"`
}

// RekeyInfo reports a deep rekey in progress.
type RekeyInfo struct {
	StartedAt time.Time
	// Done is how many bytes of the disks are under the new key so far
	// (the sum of the marks), of Total.
	Done, Total int64
	// Running is true while a rekey job works on the volume; false for
	// a rekey interrupted (run it again to finish).
	Running bool
}

// RekeyOptions says how to rekey.
type RekeyOptions struct {
	// Deep re-encrypts every block under a new data key; otherwise only
	// the data key's wrapping changes (a new KEK).
	Deep bool
	// Provider names the key provider of the new KEK of a shallow rekey
	// ("": the one of the current key); moving a VM to another key
	// manager is a shallow rekey.
	Provider string
	// Rate bounds a deep rekey, in bytes re-encrypted per second (0:
	// DefaultRekeyRate).
	Rate int64
}

// DefaultRekeyRate is a deep rekey's pace unless told otherwise.
const DefaultRekeyRate = 64 << 20

// rekeyStep is how much of a disk one step re-encrypts.
const rekeyStep = 256 << 10

// rekeyOps are the control operations allowed while a deep rekey is in
// progress.
var rekeyOps = []string{"delete", "update", "set backup policy", "set DR policy", "rekey", "finish rekey"}

// checkNotRekeying refuses op while a deep rekey is in progress.
func (v *Volume) checkNotRekeying(op string) error {
	v.mu.Lock()
	rk := v.m.Rekey
	v.mu.Unlock()
	if rk == nil || slices.Contains(rekeyOps, op) {
		return nil
	}
	return fmt.Errorf("%s: volume %q is being re-encrypted under a new data key (deep rekey): wait until it is done, or run `quiver volume rekey --deep %s` to finish an interrupted one: %w",
		op, v.name, v.name, ErrBusy)
}

// Rekey rekeys an encrypted volume (see the top of this file): shallow, it
// returns once the new wrapping is durable; deep, once every block is under
// the new data key and the manifest says so, reporting progress in bytes.
// A deep rekey that fails or is cancelled can be run again and goes on
// where it stopped.
func (v *Volume) Rekey(ctx context.Context, o RekeyOptions, prog Progress) (VolumeInfo, error) {
	if o.Rate < 0 {
		return VolumeInfo{}, invalid("rate", fmt.Sprint(o.Rate), "must not be negative")
	}
	if o.Deep {
		if o.Provider != "" {
			return VolumeInfo{}, invalid("provider", o.Provider, "a deep rekey keeps the key provider; move the volume with a shallow rekey")
		}
		return v.rekeyDeep(ctx, o, orNop(prog))
	}
	return v.rekeyShallow(ctx, o.Provider)
}

func (v *Volume) notEncrypted(op string) error {
	return fmt.Errorf("%s: volume %q is not encrypted: %w", op, v.name, ErrInvalid)
}

// rekeyShallow wraps the data key under a new KEK, then destroys the old
// one.
func (v *Volume) rekeyShallow(ctx context.Context, provider string) (VolumeInfo, error) {
	unlock, err := v.lockOps("rekey")
	if err != nil {
		return VolumeInfo{}, err
	}
	defer unlock()
	m := v.manifest()
	switch {
	case m.Key == nil:
		return VolumeInfo{}, v.notEncrypted("rekey")
	case m.Rekey != nil:
		return VolumeInfo{}, fmt.Errorf("rekey: volume %q is in a deep rekey; finish it first (quiver volume rekey --deep %s), which ends under a new KEK: %w",
			v.name, v.name, ErrBusy)
	}
	from, ok := v.pool.keyring[m.Key.Provider]
	if !ok {
		return VolumeInfo{}, fmt.Errorf("rekey %q: key provider %q of its key is not configured: %w: %w", v.name, m.Key.Provider, ErrKeyUnavailable, crypt.ErrProvider)
	}
	to := from
	if provider != "" {
		if to, ok = v.pool.keyring[provider]; !ok {
			return VolumeInfo{}, fmt.Errorf("rekey %q: key provider %q is not configured on this node: %w", v.name, provider, ErrNoKeyProvider)
		}
	}
	kctx, cancel := context.WithTimeout(ctx, keyTimeout)
	defer cancel()
	kek, err := to.CreateKEK(kctx)
	if err != nil {
		return VolumeInfo{}, fmt.Errorf("rekey %q: new KEK in %q: %w: %w", v.name, to.Name(), ErrKeyUnavailable, err)
	}
	nw, err := crypt.Rewrap(kctx, from, *m.Key, to, kek)
	if err != nil {
		v.pool.dropVolumeKey(&crypt.WrappedKey{Provider: to.Name(), KeyID: kek})
		return VolumeInfo{}, fmt.Errorf("rekey %q: %w: %w", v.name, ErrKeyUnavailable, err)
	}
	old := *m.Key
	m.Key = &nw
	if err := v.commit(m); err != nil {
		v.pool.dropVolumeKey(&nw)
		return VolumeInfo{}, err
	}
	v.pool.destroyOldKEK(v.name, old)
	return v.Info(), nil
}

// destroyOldKEK destroys the KEK a volume's data key was wrapped under
// before a rekey; a failure is logged (the KEK stays in its provider,
// unused by the volume: the admin destroys it there).
func (p *Pool) destroyOldKEK(volume string, w crypt.WrappedKey) {
	pr, ok := p.keyring[w.Provider]
	if !ok {
		p.log.Warn("rekey: the old KEK's provider is not configured; destroy the KEK in it by hand", "volume", volume, "provider", w.Provider, "kek", w.KeyID)
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), keyTimeout)
	defer cancel()
	if err := pr.DestroyKEK(ctx, w.KeyID); err != nil {
		p.log.Warn("rekey: destroying the old KEK failed; destroy it in the key manager by hand", "volume", volume,
			"provider", w.Provider, "kek", w.KeyID, "err", err)
	}
}

// rekeyDeep runs or resumes a deep rekey to its end.
func (v *Volume) rekeyDeep(ctx context.Context, o RekeyOptions, prog Progress) (VolumeInfo, error) {
	if !v.rekeyRun.TryLock() {
		return VolumeInfo{}, fmt.Errorf("rekey: a deep rekey of volume %q is running already: %w", v.name, ErrBusy)
	}
	defer v.rekeyRun.Unlock()
	m, err := v.beginRekey(ctx)
	if err != nil {
		return VolumeInfo{}, err
	}
	// The disks' handles install the rekey (openFile) on files opened
	// from now on; installRekey does it for those open already.
	var handles []*liveDisk
	defer func() {
		for _, h := range handles {
			_ = h.Close()
		}
	}()
	var total int64
	for _, d := range m.Disks {
		h, err := v.openDisk(d.Name, nil)
		if err != nil {
			return VolumeInfo{}, fmt.Errorf("rekey %q: %w", v.name, err)
		}
		handles = append(handles, h.(*liveDisk))
		total += d.Size
	}
	if err := v.installRekey(); err != nil {
		return VolumeInfo{}, err
	}
	prog.AddTotal(total)
	rate := o.Rate
	if rate == 0 {
		rate = DefaultRekeyRate
	}
	r := &rekeyRun{v: v, rate: rate, start: time.Now(), prog: prog,
		old: make([]byte, rekeyStep), buf: make([]byte, rekeyStep), id: rekeyID(m.Rekey)}
	for _, h := range handles {
		if err := r.disk(ctx, h); err != nil {
			return VolumeInfo{}, fmt.Errorf("rekey %q: disk %q: %w", v.name, h.df.name, err)
		}
	}
	if err := v.finishRekey(); err != nil {
		return VolumeInfo{}, err
	}
	return v.Info(), nil
}

// beginRekey records a new data key in the manifest (or finds the one of
// an interrupted rekey) and loads it.
func (v *Volume) beginRekey(ctx context.Context) (volumeManifest, error) {
	unlock, err := v.lockOps("rekey")
	if err != nil {
		return volumeManifest{}, err
	}
	defer unlock()
	m := v.manifest()
	if m.Key == nil {
		return m, v.notEncrypted("rekey")
	}
	if n := len(v.Snapshots()); n > 0 && m.Rekey == nil {
		return m, fmt.Errorf("deep rekey of %q: it has %d snapshots, which would stay readable under the old data key; delete them first (a backup does not keep them readable either): %w",
			v.name, n, ErrHasSnapshots)
	}
	if _, err := v.dataCipher(); err != nil {
		return m, err
	}
	if m.Rekey != nil {
		return m, nil
	}
	pr, ok := v.pool.keyring[m.Key.Provider]
	if !ok {
		return m, fmt.Errorf("deep rekey of %q: key provider %q is not configured: %w: %w", v.name, m.Key.Provider, ErrKeyUnavailable, crypt.ErrProvider)
	}
	kctx, cancel := context.WithTimeout(ctx, keyTimeout)
	defer cancel()
	dk, w, err := crypt.NewVMKey(kctx, pr)
	if err != nil {
		return m, fmt.Errorf("deep rekey of %q: key provider %q: %w: %w", v.name, pr.Name(), ErrKeyUnavailable, err)
	}
	defer dk.Wipe()
	next, err := crypt.NewCipher(dk)
	if err != nil {
		v.pool.dropVolumeKey(&w)
		return m, err
	}
	m.Rekey = &RekeyState{NewKey: w, NewKeyUID: newUID(), StartedAt: time.Now().UTC()}
	v.removeRekeyJournals() // a crash's leftovers of a rekey finished (void anyway: rekeyID)
	if err := v.commit(m); err != nil {
		v.pool.dropVolumeKey(&w)
		return m, err
	}
	v.keyMu.Lock()
	v.next = next
	v.keyMu.Unlock()
	return m, nil
}

// installRekey gives the disks open for I/O without a rekey state theirs
// (recovered from their journals), with the gate held exclusively, so that
// no I/O is in flight when their reads start to take block locks.
func (v *Volume) installRekey() error {
	v.gate.Lock()
	defer v.gate.Unlock()
	for _, df := range v.files {
		if df.enc != nil && df.enc.rk.Load() == nil && df.gone == nil {
			if err := v.loadRekey(df); err != nil {
				return err
			}
		}
	}
	return nil
}

// loadRekey recovers disk df's rekey journal and installs its rekey state;
// nothing when the volume is in no deep rekey. No I/O of df is in flight.
func (v *Volume) loadRekey(df *diskFile) error {
	if v.manifest().Rekey == nil {
		return nil
	}
	next := v.loadedNext()
	if next == nil {
		return fmt.Errorf("disk %q of volume %q: the new data key of its deep rekey is not unwrapped: %w", df.name, v.name, ErrKeyUnavailable)
	}
	mark, err := v.recoverRekey(df, rekeyID(v.manifest().Rekey))
	if err != nil {
		return fmt.Errorf("disk %q of volume %q: rekey journal: %w", df.name, v.name, err)
	}
	rk := &encRekey{next: next}
	rk.mark.Store(mark)
	df.enc.rk.Store(rk)
	return nil
}

// finishRekey makes the new data key the volume's once every disk is
// under it, and destroys the old KEK.
func (v *Volume) finishRekey() error {
	unlock, err := v.lockOps("finish rekey")
	if err != nil {
		return err
	}
	defer unlock()
	m := v.manifest()
	if m.Rekey == nil {
		return nil
	}
	if m.BackupKey != nil {
		// The backups to come carry the new data key, under the same
		// backup KEK: those made before keep the old one.
		bk, err := v.rewrapUnder(m.Rekey.NewKey, *m.BackupKey)
		if err != nil {
			return fmt.Errorf("finish rekey of %q: the backup key: %w", v.name, err)
		}
		m.BackupKey = &bk
	}
	v.gate.Lock()
	for _, d := range m.Disks {
		df := v.files[d.Name]
		if df == nil || df.enc == nil || df.enc.rk.Load() == nil || df.enc.rk.Load().mark.Load() < df.size {
			v.gate.Unlock()
			return fmt.Errorf("finish rekey of %q: disk %q is not all under the new key: %w", v.name, d.Name, ErrBusy)
		}
	}
	old := *m.Key
	nk := m.Rekey.NewKey
	m.Key, m.KeyUID, m.Rekey = &nk, m.Rekey.NewKeyUID, nil
	if err := v.commit(m); err != nil {
		v.gate.Unlock()
		return err
	}
	v.keyMu.Lock()
	next := v.next
	v.cipher, v.next = next, nil
	v.keyMu.Unlock()
	for _, df := range v.files {
		if df.enc != nil {
			df.enc.c = next
			df.enc.rk.Store(nil)
		}
	}
	v.gate.Unlock()
	v.removeRekeyJournals()
	v.pool.destroyOldKEK(v.name, old)
	return nil
}

// rekeyInfo reports a deep rekey's progress, from the disks' journals (what
// is durable); nil when none is in progress.
func (v *Volume) rekeyInfo(m volumeManifest) *RekeyInfo {
	if m.Rekey == nil {
		return nil
	}
	ri := &RekeyInfo{StartedAt: m.Rekey.StartedAt}
	if v.rekeyRun.TryLock() {
		v.rekeyRun.Unlock()
	} else {
		ri.Running = true
	}
	for _, d := range m.Disks {
		ri.Total += d.Size
		if h, ok := v.readJournal(d.Name, rekeyID(m.Rekey)); ok {
			ri.Done += min(h.mark, d.Size)
		}
	}
	return ri
}

// rekeyRun is one deep rekey job's state.
type rekeyRun struct {
	v        *Volume
	rate     int64
	start    time.Time
	done     int64 // bytes passed, for the pace
	prog     Progress
	old, buf []byte
	id       uint64 // rekeyID
}

// disk re-encrypts one disk from its mark to its end.
func (r *rekeyRun) disk(ctx context.Context, h *liveDisk) error {
	v := r.v
	jn, err := v.openJournal(h.df.name, r.id)
	if err != nil {
		return err
	}
	defer jn.close()
	for {
		if err := ctx.Err(); err != nil {
			return err
		}
		v.gate.RLock()
		df, err := h.file()
		if err != nil {
			v.gate.RUnlock()
			return err
		}
		rk := df.enc.rk.Load()
		if rk == nil {
			v.gate.RUnlock()
			return fmt.Errorf("no rekey state: %w", ErrBusy)
		}
		if rk.mark.Load() >= df.size {
			v.gate.RUnlock()
			return nil
		}
		n, err := r.step(df, rk, jn)
		v.gate.RUnlock()
		if err != nil {
			return err
		}
		r.prog.Add(n)
		r.done += n
		if wait := time.Duration(float64(r.done)/float64(r.rate)*float64(time.Second)) - time.Since(r.start); wait > 0 {
			t := time.NewTimer(wait)
			select {
			case <-ctx.Done():
				t.Stop()
				return ctx.Err()
			case <-t.C:
			}
		}
	}
}

// step moves the disk's mark over one step (or one hole), with the gate
// held shared, and returns how far.
func (r *rekeyRun) step(df *diskFile, rk *encRekey, jn *rekeyJournal) (int64, error) {
	v, e := r.v, df.enc
	mark := rk.mark.Load()
	if n, done, err := r.skipHole(df, rk, jn, mark); done || err != nil {
		return n, err
	}
	end := min(mark+rekeyStep, df.size)
	defer e.lockStripes(mark/crypt.BlockSize, end/crypt.BlockSize, true).unlock()
	old := r.old[:end-mark]
	if err := readAt(df, old, mark); err != nil {
		return 0, err
	}
	if isZero(old) {
		if err := jn.done(end); err != nil {
			return 0, err
		}
		rk.mark.Store(end)
		return end - mark, nil
	}
	buf := r.buf[:len(old)]
	copy(buf, old)
	for i := 0; i < len(buf); i += crypt.BlockSize {
		blk := buf[i : i+crypt.BlockSize]
		if isZero(blk) {
			continue
		}
		_ = e.c.DecryptAt(blk, mark+int64(i))
		if isZero(blk) { // a plaintext block of zeros is stored as zeros
			continue
		}
		_ = rk.next.EncryptAt(blk, mark+int64(i))
	}
	if err := jn.begin(mark, old); err != nil {
		return 0, err
	}
	v.markDirty(df.name, mark, end-mark)
	if err := v.markChanged(df, mark, end-mark); err != nil {
		return 0, err
	}
	if err := writeRuns(df, buf, old, mark); err != nil {
		return 0, err
	}
	if err := v.sync(df); err != nil {
		return 0, err
	}
	if err := jn.done(end); err != nil {
		return 0, err
	}
	rk.mark.Store(end)
	return end - mark, nil
}

// skipHole moves the mark over the hole at it, if there is one, with every
// block lock held exclusively (the hole may be large).
func (r *rekeyRun) skipHole(df *diskFile, rk *encRekey, jn *rekeyJournal, mark int64) (int64, bool, error) {
	data, err := df.f.SeekData(mark)
	switch {
	case errors.Is(err, storage.ErrNoData):
		data = df.size
	case errors.Is(err, ErrNotSupported):
		return 0, false, nil
	case err != nil:
		return 0, false, err
	}
	if blockDown(data) <= mark {
		return 0, false, nil
	}
	defer df.enc.lockStripes(0, encStripes, true).unlock()
	if data, err = df.f.SeekData(mark); errors.Is(err, storage.ErrNoData) {
		data = df.size
	} else if err != nil {
		return 0, false, err
	}
	to := min(blockDown(data), df.size)
	if to <= mark {
		return 0, false, nil
	}
	if err := jn.done(to); err != nil {
		return 0, false, err
	}
	rk.mark.Store(to)
	return to - mark, true, nil
}

// writeRuns writes the blocks of buf at off that are not zeros in ref
// (blocks of zeros are the same under either key and stay as they are:
// holes stay holes), each run of them in one write.
func writeRuns(df *diskFile, buf, ref []byte, off int64) error {
	for i := 0; i < len(buf); {
		if isZero(ref[i : i+crypt.BlockSize]) {
			i += crypt.BlockSize
			continue
		}
		j := i + crypt.BlockSize
		for j < len(buf) && !isZero(ref[j:j+crypt.BlockSize]) {
			j += crypt.BlockSize
		}
		if err := df.write(buf[i:j], off+int64(i)); err != nil {
			return err
		}
		i = j
	}
	return nil
}

// The rekey journal of a disk: two header slots, then the data of the step
// in progress.
const (
	journalMagic = "QVRKJNL1"
	journalSlot  = 512
	journalData  = 4096
	journalHead  = 56
	stateDone    = 1
	stateBegun   = 2
)

// journalHeader is one slot of a rekey journal.
type journalHeader struct {
	id      uint64 // the rekey's (rekeyID): a journal left by another is void
	seq     uint64
	state   uint32
	mark    int64  // done: blocks below are under the new key; begun: the step's start
	length  int64  // begun: the step's length, its old ciphertext in the data area
	dataCRC uint32 // begun: CRC-32C of that data
}

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

func (h journalHeader) encode() []byte {
	b := make([]byte, journalHead)
	copy(b, journalMagic)
	binary.LittleEndian.PutUint64(b[8:], h.seq)
	binary.LittleEndian.PutUint32(b[16:], h.state)
	binary.LittleEndian.PutUint64(b[20:], uint64(h.mark))
	binary.LittleEndian.PutUint64(b[28:], uint64(h.length))
	binary.LittleEndian.PutUint32(b[36:], h.dataCRC)
	binary.LittleEndian.PutUint64(b[40:], h.id)
	binary.LittleEndian.PutUint32(b[52:], crc32.Checksum(b[:52], castagnoli))
	return b
}

func decodeJournalHeader(b []byte, id uint64) (journalHeader, bool) {
	if len(b) < journalHead || string(b[:8]) != journalMagic ||
		binary.LittleEndian.Uint32(b[52:]) != crc32.Checksum(b[:52], castagnoli) {
		return journalHeader{}, false
	}
	h := journalHeader{seq: binary.LittleEndian.Uint64(b[8:]), state: binary.LittleEndian.Uint32(b[16:]),
		mark: int64(binary.LittleEndian.Uint64(b[20:])), length: int64(binary.LittleEndian.Uint64(b[28:])),
		dataCRC: binary.LittleEndian.Uint32(b[36:]), id: binary.LittleEndian.Uint64(b[40:])}
	switch {
	case h.id != id, h.state != stateDone && h.state != stateBegun, h.mark < 0, h.mark%crypt.BlockSize != 0,
		h.length < 0, h.length > rekeyStep, h.length%crypt.BlockSize != 0:
		return journalHeader{}, false
	}
	return h, true
}

// newest returns the newest valid header of the two slots of p.
func newestHeader(p []byte, id uint64) (journalHeader, bool) {
	var best journalHeader
	found := false
	for s := 0; s < 2 && (s+1)*journalSlot <= len(p); s++ {
		if h, ok := decodeJournalHeader(p[s*journalSlot:(s+1)*journalSlot], id); ok && (!found || h.seq > best.seq) {
			best, found = h, true
		}
	}
	return best, found
}

type rekeyJournal struct {
	f   storage.File
	id  uint64
	seq uint64
}

// rekeyID identifies a deep rekey in its journals.
func rekeyID(r *RekeyState) uint64 {
	h := fnv.New64a()
	_, _ = h.Write([]byte(r.NewKeyUID))
	return h.Sum64()
}

func (v *Volume) rekeyDir() string { return path.Join("volumes", v.name, "rekey") }

func (v *Volume) journalRel(disk string) string { return path.Join(v.rekeyDir(), disk+".journal") }

// openJournal opens (or makes, durably) a disk's rekey journal for the
// rekey job.
func (v *Volume) openJournal(disk string, id uint64) (*rekeyJournal, error) {
	fsys := v.pool.fs
	rel := v.journalRel(disk)
	f, err := fsys.OpenRegular(rel, os.O_RDWR)
	if errors.Is(err, fs.ErrNotExist) {
		if err := fsys.Mkdir(v.rekeyDir(), 0o700); err != nil && !errors.Is(err, fs.ErrExist) {
			return nil, err
		}
		if err := fsys.SyncDir(path.Dir(v.rekeyDir())); err != nil {
			return nil, err
		}
		// Made whole and durable before use: its size never changes
		// after, so its fdatasyncs carry no metadata but the blocks.
		if err := durable.WriteFile(fsys, rel, make([]byte, journalData+rekeyStep), 0o600); err != nil {
			return nil, err
		}
		f, err = fsys.OpenRegular(rel, os.O_RDWR)
	}
	if err != nil {
		return nil, hostile(err)
	}
	j := &rekeyJournal{f: f, id: id}
	p := make([]byte, 2*journalSlot)
	if _, err := f.ReadAt(p, 0); err != nil {
		_ = f.Close()
		return nil, err
	}
	for s := 0; s < 2; s++ { // the highest sequence number, of any rekey
		if b := p[s*journalSlot:]; string(b[:8]) == journalMagic {
			j.seq = max(j.seq, binary.LittleEndian.Uint64(b[8:]))
		}
	}
	return j, nil
}

func (j *rekeyJournal) close() { _ = j.f.Close() }

func (j *rekeyJournal) put(h journalHeader) error {
	j.seq++
	h.seq, h.id = j.seq, j.id
	if _, err := j.f.WriteAt(h.encode(), int64(j.seq%2)*journalSlot); err != nil {
		return err
	}
	return j.f.Sync()
}

// begin records the step at mark in progress, with its old ciphertext.
func (j *rekeyJournal) begin(mark int64, old []byte) error {
	if _, err := j.f.WriteAt(old, journalData); err != nil {
		return err
	}
	return j.put(journalHeader{state: stateBegun, mark: mark, length: int64(len(old)), dataCRC: crc32.Checksum(old, castagnoli)})
}

// done records every block below mark under the new key.
func (j *rekeyJournal) done(mark int64) error {
	return j.put(journalHeader{state: stateDone, mark: mark})
}

// readJournal returns the newest valid header of a disk's journal.
func (v *Volume) readJournal(disk string, id uint64) (journalHeader, bool) {
	f, err := v.pool.fs.OpenRegular(v.journalRel(disk), os.O_RDONLY)
	if err != nil {
		return journalHeader{}, false
	}
	defer f.Close()
	p := make([]byte, 2*journalSlot)
	if _, err := f.ReadAt(p, 0); err != nil {
		return journalHeader{}, false
	}
	return newestHeader(p, id)
}

// recoverRekey returns disk df's mark from its journal, first putting back
// the old ciphertext of a step a crash interrupted (see the top of the
// file). No I/O of df is in flight.
func (v *Volume) recoverRekey(df *diskFile, id uint64) (int64, error) {
	flag := os.O_RDWR
	if v.pool.readOnly {
		flag = os.O_RDONLY
	}
	f, err := v.pool.fs.OpenRegular(v.journalRel(df.name), flag)
	if errors.Is(err, fs.ErrNotExist) {
		return 0, nil
	}
	if err != nil {
		return 0, hostile(err)
	}
	defer f.Close()
	p := make([]byte, journalData+rekeyStep)
	if _, err := f.ReadAt(p, 0); err != nil {
		return 0, fmt.Errorf("%w: %w", err, ErrBroken)
	}
	h, ok := newestHeader(p, id)
	if !ok {
		return 0, nil // made, never written
	}
	if h.mark+h.length > df.size {
		return 0, fmt.Errorf("mark %d beyond the disk's %d bytes: %w", h.mark+h.length, df.size, ErrBroken)
	}
	if h.state == stateDone {
		return h.mark, nil
	}
	old := p[journalData : journalData+h.length]
	if crc32.Checksum(old, castagnoli) != h.dataCRC {
		return h.mark, nil // the step never reached the image
	}
	if v.pool.readOnly {
		return 0, fmt.Errorf("a step of a deep rekey was interrupted at %d; open the pool writable to put it back: %w", h.mark, ErrReadOnly)
	}
	if err := writeRuns(df, old, old, h.mark); err != nil {
		return 0, err
	}
	if err := v.sync(df); err != nil {
		return 0, err
	}
	j := &rekeyJournal{f: f, id: id, seq: h.seq}
	if err := j.done(h.mark); err != nil {
		return 0, err
	}
	v.pool.log.Warn("deep rekey: a step interrupted by a crash was put back under the old key", "volume", v.name, "disk", df.name, "offset", h.mark)
	return h.mark, nil
}

// removeRekeyJournals removes the journals of a volume in no deep rekey
// (just finished, or left by a crash after it finished).
func (v *Volume) removeRekeyJournals() {
	fsys := v.pool.fs
	es, err := fsys.ReadDir(v.rekeyDir())
	if err != nil {
		return
	}
	for _, e := range es {
		_ = fsys.Remove(path.Join(v.rekeyDir(), e.Name()))
	}
	_ = fsys.Remove(v.rekeyDir())
}
