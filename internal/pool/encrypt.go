package pool

import (
	"bytes"
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/quiverstorage/quiver/internal/crypt"
)

// Encryption at rest (docs/encryption.md). An encrypted volume's manifest
// holds its data key wrapped under a key-encryption key of a key provider
// (volumeManifest.Key); the pool unwraps it when a disk of the volume is
// first opened for I/O and keeps it in memory only, for the life of the
// Volume. Every disk of the volume, its snapshots and its clones share that
// data key; a clone has its own wrapped copy (crypt.CloneKey).
//
// The image files hold ciphertext: XTS-AES-256 per 4 KiB block, the block
// number as the tweak (crypt.Cipher). The zero rule: a 4 KiB block that is
// all zeros in the image reads as zeros (holes, unwritten extents, trimmed
// and zeroed ranges), and a write of a 4 KiB block of plaintext zeros stores
// zeros, not its ciphertext. A real block's ciphertext is all zeros with
// probability 2^-32768. What it costs: a reader of the pool sees which
// blocks hold zeros, as it sees holes anyway.
//
// Writes encrypt a copy of the caller's data (encBufs); a request that does
// not cover whole blocks reads, decrypts, merges and encrypts the blocks at
// its ends (read-modify-write) with their block locks held exclusively,
// while whole-block writes hold theirs shared: two partial writes of one
// block, or a partial write and a whole-block write of it, never lose
// either's bytes. A read that overlaps a write in flight may see a block
// that is neither old nor new (decrypting a torn ciphertext) on
// filesystems that do not serialize buffered reads and writes of a file
// (XFS does): overlapping requests in flight have no defined result.

// hasKeys reports whether the pool has key providers (Options.Keyring).
func (p *Pool) hasKeys() bool { return len(p.keyring) > 0 }

// newKeyProvider returns the provider that makes the data keys of new
// volumes: the one named by Options.NewKeys, or the keyring's only one.
func (p *Pool) newKeyProvider() (crypt.Provider, error) {
	if !p.hasKeys() {
		return nil, fmt.Errorf("encrypted volume: this node has no key provider (start the server with --kmip-server or --key-file): %w", ErrNoKeyProvider)
	}
	if p.newKeys != "" {
		if pr, ok := p.keyring[p.newKeys]; ok {
			return pr, nil
		}
		return nil, fmt.Errorf("encrypted volume: key provider %q for new volumes is not configured: %w", p.newKeys, ErrNoKeyProvider)
	}
	if len(p.keyring) > 1 {
		return nil, fmt.Errorf("encrypted volume: %d key providers and none named for new volumes: %w", len(p.keyring), ErrNoKeyProvider)
	}
	for _, pr := range p.keyring {
		return pr, nil
	}
	panic("unreachable")
}

// keyTimeout bounds one call to a key provider by the pool.
const keyTimeout = 30 * time.Second

// newVolumeKey makes the wrapped data key of a new encrypted volume.
func (p *Pool) newVolumeKey(ctx context.Context) (*crypt.WrappedKey, error) {
	pr, err := p.newKeyProvider()
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, keyTimeout)
	defer cancel()
	dk, w, err := crypt.NewVMKey(ctx, pr)
	if err != nil {
		return nil, fmt.Errorf("encrypted volume: key provider %q: %w", pr.Name(), err)
	}
	dk.Wipe()
	return &w, nil
}

// cloneVolumeKey gives a clone of an encrypted volume its own wrapped copy
// of the source's data key, under a new KEK of the source's provider.
func (p *Pool) cloneVolumeKey(ctx context.Context, src *crypt.WrappedKey) (*crypt.WrappedKey, error) {
	pr, ok := p.keyring[src.Provider]
	if !ok {
		return nil, fmt.Errorf("clone of an encrypted volume: key provider %q is not configured: %w: %w",
			src.Provider, ErrKeyUnavailable, crypt.ErrProvider)
	}
	ctx, cancel := context.WithTimeout(ctx, keyTimeout)
	defer cancel()
	w, err := crypt.CloneKey(ctx, pr, *src)
	if err != nil {
		return nil, fmt.Errorf("clone of an encrypted volume: %w: %w", ErrKeyUnavailable, err)
	}
	return &w, nil
}

// dropVolumeKey destroys the KEK of a wrapped key made for a volume or a
// clone that was not made after all, so that none stays unused; a failure
// is logged (the KEK stays, unused). Nothing for a nil key.
func (p *Pool) dropVolumeKey(w *crypt.WrappedKey) {
	if w == nil {
		return
	}
	pr, ok := p.keyring[w.Provider]
	if !ok {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), keyTimeout)
	defer cancel()
	if err := pr.DestroyKEK(ctx, w.KeyID); err != nil {
		p.log.Warn("destroy the KEK of a volume not made", "provider", w.Provider, "kek", w.KeyID, "err", err)
	}
}

// dataCipher returns the volume's cipher, unwrapping its data key on first
// use; nil for a volume that is not encrypted. A key that cannot be
// unwrapped fails with ErrKeyUnavailable and the provider's error (which
// names the cause: crypt.ErrUnreachable, ErrKEKRevoked, ErrKEKNotFound,
// ErrProvider); it is asked again on the next open.
func (v *Volume) dataCipher() (*crypt.Cipher, error) {
	m := v.manifest()
	if m.Key == nil {
		return nil, nil
	}
	v.keyMu.Lock()
	defer v.keyMu.Unlock()
	if v.cipher == nil {
		c, err := v.unwrap(*m.Key, "data key")
		if err != nil {
			return nil, err
		}
		v.cipher = c
	}
	if m.Rekey != nil && v.next == nil {
		c, err := v.unwrap(m.Rekey.NewKey, "new data key (of its deep rekey)")
		if err != nil {
			return nil, err
		}
		v.next = c
	}
	return v.cipher, nil
}

// unwrap unwraps one of the volume's wrapped keys into a cipher.
func (v *Volume) unwrap(w crypt.WrappedKey, what string) (*crypt.Cipher, error) {
	ctx, cancel := context.WithTimeout(context.Background(), keyTimeout)
	defer cancel()
	dk, err := v.pool.keyring.Unwrap(ctx, w)
	if err != nil {
		return nil, fmt.Errorf("volume %q is encrypted and cannot be opened: its %s under KEK %s of key provider %q: %w: %w",
			v.name, what, w.KeyID, w.Provider, ErrKeyUnavailable, err)
	}
	defer dk.Wipe()
	c, err := crypt.NewCipher(dk)
	if err != nil {
		return nil, fmt.Errorf("volume %q: %w: %w", v.name, ErrKeyUnavailable, err)
	}
	return c, nil
}

// loadedNext returns the new data key's cipher of a deep rekey, if in
// memory.
func (v *Volume) loadedNext() *crypt.Cipher {
	v.keyMu.Lock()
	defer v.keyMu.Unlock()
	return v.next
}

// loadedCipher returns the cipher if the data key is in memory.
func (v *Volume) loadedCipher() *crypt.Cipher {
	v.keyMu.Lock()
	defer v.keyMu.Unlock()
	return v.cipher
}

// encrypted reports whether the volume is encrypted.
func (v *Volume) encrypted() bool { return v.manifest().Key != nil }

// checkEncryptedSize refuses a disk size of an encrypted volume that is not
// a whole number of encryption blocks.
func checkEncryptedSize(field string, size int64) error {
	if size%crypt.BlockSize != 0 {
		return invalid(field, formatSize(size), "must be a multiple of 4096 bytes in an encrypted volume")
	}
	return nil
}

// validateKey checks an encrypted volume's manifest as read from the pool:
// a wrapped key whose fields are all there and of sane sizes, disks of
// whole blocks, and no direct access, which it cannot have had.
// (A binary without encryption refuses the manifest whole: it decodes
// volume.json strictly, and the key field is unknown to it.)
func (m *volumeManifest) validateKey() error {
	if err := validateWrapped("key", m.Key); err != nil {
		return err
	}
	switch {
	case len(m.DirectAccess) > 0:
		return invalid("directAccess", m.DirectAccess[0], "an encrypted volume cannot be accessed directly")
	case len(m.KeyUID) > 64:
		return invalid("keyUID", m.KeyUID, "must be at most 64 bytes")
	}
	if m.BackupKey != nil {
		if err := validateWrapped("backupKey", m.BackupKey); err != nil {
			return err
		}
	}
	if r := m.Rekey; r != nil {
		if err := validateWrapped("rekey.newKey", &r.NewKey); err != nil {
			return err
		}
		if r.NewKeyUID == "" || len(r.NewKeyUID) > 64 {
			return invalid("rekey.newKeyUID", r.NewKeyUID, "must be 1 to 64 bytes")
		}
	}
	for i, d := range m.Disks {
		if err := checkEncryptedSize(fmt.Sprintf("disks[%d].size", i), d.Size); err != nil {
			return err
		}
	}
	return nil
}

// validateWrapped checks the fields of a wrapped key read from a manifest.
func validateWrapped(field string, k *crypt.WrappedKey) error {
	if err := ValidateName(field+".provider", k.Provider); err != nil {
		return err
	}
	switch {
	case k.KeyID == "" || len(k.KeyID) > 256:
		return invalid(field+".keyId", k.KeyID, "must be 1 to 256 bytes")
	case k.Algorithm == "" || len(k.Algorithm) > 64:
		return invalid(field+".algorithm", k.Algorithm, "must be 1 to 64 bytes")
	case len(k.Wrapped) == 0 || len(k.Wrapped) > 4096:
		return invalid(field+".wrapped", "", fmt.Sprintf("%d bytes: must be 1 to 4096", len(k.Wrapped)))
	}
	return nil
}

// encStripes is how many block locks an encrypted disk has; block n takes
// lock n % encStripes.
const encStripes = 256

// encSegment bounds the buffer one step of an encrypted read or write uses.
const encSegment = 1 << 20

// encDisk is the encryption state of one disk of an encrypted volume.
type encDisk struct {
	c     *crypt.Cipher
	locks [encStripes]sync.RWMutex
	// rk is set while a deep rekey re-encrypts the disk (rekey.go): the
	// blocks below its mark are under its cipher, the others under c. It
	// changes only with the volume's gate held exclusively; its mark moves
	// only with the block locks of the blocks it passes held exclusively.
	// While it is set, reads take their block locks shared too, and the
	// Try paths step aside.
	rk atomic.Pointer[encRekey]
}

// encRekey is a disk's deep rekey in progress.
type encRekey struct {
	next *crypt.Cipher
	mark atomic.Int64 // blocks below it are under next
}

// cipherAt returns the cipher of the block at off, given the disk's rekey
// in progress (nil if none).
func (e *encDisk) cipherAt(rk *encRekey, off int64) *crypt.Cipher {
	if rk != nil && off < rk.mark.Load() {
		return rk.next
	}
	return e.c
}

var encBufs = sync.Pool{New: func() any { b := make([]byte, encSegment); return &b }}

const blockMask = crypt.BlockSize - 1

func blockDown(off int64) int64 { return off &^ blockMask }
func blockUp(off int64) int64   { return (off + blockMask) &^ blockMask }

// blocks returns the whole blocks [a, b) that [off, off+length) touches.
func (e *encDisk) blocks(off, length int64) (a, b int64) {
	return blockDown(off), blockUp(off + length)
}

// stripeLocks are the block locks a request holds (lockBlocks,
// lockStripes): the stripes of a run of blocks, as up to two ranges in
// stripe order, each shared, or exclusive for the stripes x (-1: none) or
// every one (all). A value: taking and releasing them allocates nothing.
type stripeLocks struct {
	e     *encDisk
	spans [2][2]int
	n     int
	x     [2]int
	all   bool
}

// stripesOf returns the locks of blocks [first, last): every stripe once.
func (e *encDisk) stripesOf(first, last int64) stripeLocks {
	l := stripeLocks{e: e, x: [2]int{-1, -1}}
	switch lo, n := int(first%encStripes), last-first; {
	case n <= 0:
	case n >= encStripes:
		l.spans[0], l.n = [2]int{0, encStripes}, 1
	case lo+int(n) <= encStripes:
		l.spans[0], l.n = [2]int{lo, lo + int(n)}, 1
	default: // wraps: the low stripes first
		l.spans[0], l.spans[1], l.n = [2]int{0, lo + int(n) - encStripes}, [2]int{lo, encStripes}, 2
	}
	return l
}

func (l *stripeLocks) exclusive(s int) bool { return l.all || s == l.x[0] || s == l.x[1] }

func (l stripeLocks) lock() stripeLocks {
	for _, sp := range l.spans[:l.n] {
		for s := sp[0]; s < sp[1]; s++ {
			if l.exclusive(s) {
				l.e.locks[s].Lock()
			} else {
				l.e.locks[s].RLock()
			}
		}
	}
	return l
}

func (l stripeLocks) unlock() {
	for _, sp := range l.spans[:l.n] {
		for s := sp[0]; s < sp[1]; s++ {
			if l.exclusive(s) {
				l.e.locks[s].Unlock()
			} else {
				l.e.locks[s].RUnlock()
			}
		}
	}
}

// lockBlocks takes the block locks of [off, off+length): exclusively those
// of the blocks the range covers only in part, shared the others, in stripe
// order. Release them with unlock.
func (e *encDisk) lockBlocks(off, length int64) stripeLocks {
	end := off + length
	a, b := blockDown(off), blockUp(end)
	l := e.stripesOf(a/crypt.BlockSize, b/crypt.BlockSize)
	if length > 0 && off != a {
		l.x[0] = int((a / crypt.BlockSize) % encStripes)
	}
	if length > 0 && end != b {
		l.x[1] = int(((b - crypt.BlockSize) / crypt.BlockSize) % encStripes)
	}
	return l.lock()
}

// lockShared takes the locks of the blocks [off, off+length) touches
// shared, in stripe order.
func (e *encDisk) lockShared(off, length int64) stripeLocks {
	return e.stripesOf(blockDown(off)/crypt.BlockSize, blockUp(off+length)/crypt.BlockSize).lock()
}

// lockStripes takes the locks of blocks [first, last) (each stripe once),
// shared or exclusively, in stripe order.
func (e *encDisk) lockStripes(first, last int64, exclusive bool) stripeLocks {
	l := e.stripesOf(first, last)
	l.all = exclusive
	return l.lock()
}

// decrypt decrypts the whole blocks buf read at off (block-aligned), leaving
// the all-zero ones as zeros (the zero rule).
func (e *encDisk) decrypt(buf []byte, off int64) {
	rk := e.rk.Load()
	for i := 0; i < len(buf); i += crypt.BlockSize {
		blk := buf[i : i+crypt.BlockSize]
		if isZero(blk) {
			continue
		}
		_ = e.cipherAt(rk, off+int64(i)).DecryptAt(blk, off+int64(i)) // aligned by construction
	}
}

// encrypt encrypts the whole blocks of buf at off (block-aligned), leaving
// plaintext zeros as zeros (the zero rule).
func (e *encDisk) encrypt(buf []byte, off int64) {
	rk := e.rk.Load()
	for i := 0; i < len(buf); i += crypt.BlockSize {
		blk := buf[i : i+crypt.BlockSize]
		if isZero(blk) {
			continue
		}
		_ = e.cipherAt(rk, off+int64(i)).EncryptAt(blk, off+int64(i)) // aligned by construction
	}
}

func isZero(b []byte) bool { return bytes.Equal(b, zeroBlock[:len(b)]) }

// readAt reads plaintext into p from off (in range) of an encrypted disk.
func (e *encDisk) readAt(df *diskFile, p []byte, off int64) error {
	end := off + int64(len(p))
	if e.rk.Load() != nil && len(p) > 0 {
		// A rekey step rewrites blocks and moves the mark under their
		// locks held exclusively: the read must see either side whole.
		defer e.lockShared(off, int64(len(p))).unlock()
	}
	if off == blockDown(off) && end == blockDown(end) {
		if err := readAt(df, p, off); err != nil {
			return err
		}
		e.decrypt(p, off)
		return nil
	}
	bp := encBufs.Get().(*[]byte)
	defer encBufs.Put(bp)
	for a := blockDown(off); a < end; {
		b := min(a+encSegment, blockUp(end))
		buf := (*bp)[:b-a]
		if err := readAt(df, buf, a); err != nil {
			return err
		}
		e.decrypt(buf, a)
		lo, hi := max(off, a), min(end, b)
		copy(p[lo-off:hi-off], buf[lo-a:hi-a])
		a = b
	}
	return nil
}

// write writes plaintext p at off (in range) of an encrypted disk: its
// blocks encrypted into a buffer of encBufs, those it covers in part
// merged with what they hold, under the block locks.
func (e *encDisk) write(df *diskFile, p []byte, off int64) error {
	end := off + int64(len(p))
	defer e.lockBlocks(off, int64(len(p))).unlock()
	return e.merge(df, off, end, func(buf []byte, lo, a int64) {
		copy(buf[lo-a:], p[lo-off:])
	})
}

// merge rewrites the blocks of [off, end) segment by segment: each segment
// [a, b) is read and decrypted where a block is covered only in part, put
// (which writes the plaintext of [max(off, a), min(end, b)) into buf, at
// offset lo-a), encrypted and written. The caller holds the block locks.
func (e *encDisk) merge(df *diskFile, off, end int64, put func(buf []byte, lo, a int64)) error {
	bp := encBufs.Get().(*[]byte)
	defer encBufs.Put(bp)
	for a := blockDown(off); a < end; {
		b := min(a+encSegment, blockUp(end))
		buf := (*bp)[:b-a]
		lo, hi := max(off, a), min(end, b)
		if lo != a {
			if err := e.readBlock(df, buf[:crypt.BlockSize], a); err != nil {
				return err
			}
		}
		if last := b - crypt.BlockSize; hi != b && (last != a || lo == a) {
			if err := e.readBlock(df, buf[last-a:], last); err != nil {
				return err
			}
		}
		put(buf[:hi-a], lo, a)
		e.encrypt(buf, a)
		if err := df.write(buf, a); err != nil {
			return err
		}
		a = b
	}
	return nil
}

func (e *encDisk) readBlock(df *diskFile, blk []byte, off int64) error {
	if err := readAt(df, blk, off); err != nil {
		return err
	}
	e.decrypt(blk, off)
	return nil
}

// zero makes [off, off+length) read as zeros: the whole blocks by the
// filesystem (a hole or zeroed extents, zeros under the zero rule), the
// blocks at the ends covered only in part by a read-modify-write.
func (e *encDisk) zero(df *diskFile, off, length int64, mayTrim, fast bool) error {
	end := off + length
	defer e.lockBlocks(off, length).unlock()
	a, b := blockUp(off), blockDown(end)
	if a < b {
		if err := df.zero(a, b-a, mayTrim, fast); err != nil {
			return err
		}
	}
	clearPart := func(buf []byte, lo, a int64) { clear(buf[lo-a:]) }
	if off < min(a, end) {
		if err := e.merge(df, off, min(a, end), clearPart); err != nil {
			return err
		}
	}
	if max(b, off) < end && b >= a {
		if err := e.merge(df, max(b, off), end, clearPart); err != nil {
			return err
		}
	}
	return nil
}

// tryable reports whether a Try request (nowait.go) may run on the disk: on
// a disk in the clear, always (e is nil); on an encrypted one, a request of
// whole blocks: a read decrypts in place once read, a write (TryWriteAt, at
// most one buffer's worth) encrypts into a buffer of its own (tryWrite).
// The others step aside (ErrWouldBlock) to the ordinary path, which
// read-modify-writes.
func (e *encDisk) tryable(p []byte, off int64, write bool) bool {
	if e == nil {
		return true
	}
	return e.rk.Load() == nil && off&blockMask == 0 && len(p)&blockMask == 0 && (!write || len(p) <= encSegment)
}

// tryWrite is TryWriteAt of whole blocks on an encrypted disk: their
// locks taken shared without waiting, p encrypted into a buffer of
// encBufs and tried with RWF_NOWAIT; ErrWouldBlock if a lock or the write
// would wait.
func (e *encDisk) tryWrite(df *diskFile, p []byte, off int64) error {
	if !e.tryRLockBlocks(off, len(p)) {
		return ErrWouldBlock
	}
	defer e.runlockBlocks(off, len(p))
	bp := encBufs.Get().(*[]byte)
	defer encBufs.Put(bp)
	buf := (*bp)[:len(p)]
	copy(buf, p)
	e.encrypt(buf, off)
	n, err := df.f.TryWriteAt(buf, off)
	return df.nowaitResult(n, len(p), err, &df.nw.writeOff)
}

// stripes returns the block locks [first, last) of the whole blocks
// [off, off+n), at most encStripes of them (each stripe once).
func stripes(off int64, n int) (first, last int64) {
	first, last = off/crypt.BlockSize, (off+int64(n))/crypt.BlockSize
	return first, min(last, first+encStripes)
}

// tryRLockBlocks takes the locks of the whole blocks [off, off+n) shared
// without waiting; false, holding none, if one is taken exclusively.
func (e *encDisk) tryRLockBlocks(off int64, n int) bool {
	first, last := stripes(off, n)
	for blk := first; blk < last; blk++ {
		if !e.locks[blk%encStripes].TryRLock() {
			for b := first; b < blk; b++ {
				e.locks[b%encStripes].RUnlock()
			}
			return false
		}
	}
	return true
}

func (e *encDisk) runlockBlocks(off int64, n int) {
	first, last := stripes(off, n)
	for blk := first; blk < last; blk++ {
		e.locks[blk%encStripes].RUnlock()
	}
}

// encBatchMax bounds a write of a batch (TryBatch) on an encrypted disk:
// larger ones go the ordinary way.
const encBatchMax = 64 << 10

// batchable reports whether the write io of a batch may be tried on the
// disk: always in the clear (e is nil); on an encrypted disk, whole blocks,
// at most encBatchMax bytes.
func (e *encDisk) batchable(io *IO) bool {
	n := len(io.P)
	return e == nil || e.rk.Load() == nil && io.Off&blockMask == 0 && n&blockMask == 0 && n > 0 && n <= encBatchMax
}

// encBatch is what TryBatch swaps into the writes of a batch on an
// encrypted disk: orig holds the caller's buffer of each write swapped (by
// index in the batch; nil: not swapped), bufs the encrypted copies, in
// order. Pooled, so that a batch allocates nothing in steady state.
type encBatch struct {
	orig [][]byte
	bufs []*[]byte
}

var (
	encBatches   = sync.Pool{New: func() any { return new(encBatch) }}
	encBatchBufs = sync.Pool{New: func() any { b := make([]byte, encBatchMax); return &b }}
)

// prepareBatch encrypts each admitted write of ios into a buffer of its
// own, its blocks locked shared (or it fails with ErrWouldBlock), and
// points the write at it; finishBatch puts the caller's buffers back.
func (e *encDisk) prepareBatch(ios []IO) *encBatch {
	eb := encBatches.Get().(*encBatch)
	for i := range ios {
		io := &ios[i]
		if !io.Write || io.Err != nil {
			eb.orig = append(eb.orig, nil)
			continue
		}
		if !e.tryRLockBlocks(io.Off, len(io.P)) {
			io.Err = ErrWouldBlock
			eb.orig = append(eb.orig, nil)
			continue
		}
		bp := encBatchBufs.Get().(*[]byte)
		buf := (*bp)[:len(io.P)]
		copy(buf, io.P)
		e.encrypt(buf, io.Off)
		eb.orig = append(eb.orig, io.P)
		eb.bufs = append(eb.bufs, bp)
		io.P = buf
	}
	return eb
}

// finishBatch undoes prepareBatch once the batch ran: the caller's buffers
// back in ios, the locks released, the copies back in their pool.
func (e *encDisk) finishBatch(ios []IO, eb *encBatch) {
	j := 0
	for i := range ios {
		if o := eb.orig[i]; o != nil {
			ios[i].P = o
			e.runlockBlocks(ios[i].Off, len(o))
			encBatchBufs.Put(eb.bufs[j])
			j++
		}
	}
	clear(eb.orig) // keep no caller's buffer alive in the pool
	clear(eb.bufs)
	eb.orig, eb.bufs = eb.orig[:0], eb.bufs[:0]
	encBatches.Put(eb)
}
