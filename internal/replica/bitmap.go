package replica

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io/fs"
	"math/bits"
	"os"
	"path"
	"strings"
	"sync"

	"github.com/quiverstorage/quiver/internal/durable"
	"github.com/quiverstorage/quiver/internal/storage"
)

// DefaultGranule is the unit of changed-region tracking: a write of one
// byte makes a whole granule dirty, and a resync copies whole granules.
const DefaultGranule = 64 << 10

// Bitmap is the write-ahead dirty bitmap of one disk for one copy that is
// out of sync: bit g set means granule g may differ on that copy. It lives
// in a file of the primary's pool (storage.FS), a 32-byte header (magic,
// disk size, granule) then one bit per granule in little-endian 64-bit
// words.
//
// Durability: Mark returns only once every bit it set is durable (the
// changed words are written in place and the file fdatasync'd), so a caller
// that marks before it applies a write never leaves applied data that a
// crash makes the bitmap forget. An 8-byte aligned word never straddles a
// sector, so a crash during a Mark leaves each word old or new. A bit is set
// in memory only once it is durable, so a Mark that finds its granules set
// may return at once; a failed sync fails every later Mark. Bits are only
// ever set while the copy is out of sync (behind, being resynced, or
// leaving the in-sync set); the file is removed (Remove) once the copy is
// back in the in-sync set. Its methods are safe for concurrent use.
type Bitmap struct {
	fsys    storage.FS
	rel     string
	size    int64
	granule int64

	mu     sync.Mutex
	f      storage.File
	bits   []uint64
	count  int
	failed error // the first failed sync: final for the file
	// refs counts the holders of an open file (Share): one Bitmap per
	// file and process, so that no holder writes words of its own memory
	// over bits another set (Mark writes whole words).
	refs int
}

const (
	bitmapMagic  = "QVDIRTY1"
	bitmapHeader = 32
)

// ErrBitmap: a dirty bitmap file is not for this disk (another size or
// granule) or is damaged.
var ErrBitmap = errors.New("dirty bitmap does not match its disk")

// OpenBitmap opens the bitmap rel of a disk of size bytes, or creates an
// empty one (created reports which): the new file is durable, with its
// directory entry, when OpenBitmap returns.
func OpenBitmap(fsys storage.FS, rel string, size, granule int64) (b *Bitmap, created bool, err error) {
	if granule <= 0 || size < 0 {
		return nil, false, fmt.Errorf("bitmap %s: size %d, granule %d: %w", rel, size, granule, ErrBitmap)
	}
	n := (size + granule - 1) / granule
	b = &Bitmap{fsys: fsys, rel: rel, size: size, granule: granule, bits: make([]uint64, (n+63)/64), refs: 1}
	f, err := fsys.OpenRegular(rel, os.O_RDWR)
	if errors.Is(err, fs.ErrNotExist) {
		if err := mkdirAll(fsys, path.Dir(rel)); err != nil {
			return nil, false, fmt.Errorf("bitmap %s: %w", rel, err)
		}
		if err := durable.WriteFile(fsys, rel, b.encode(), 0o600); err != nil {
			return nil, false, err
		}
		f, err = fsys.OpenRegular(rel, os.O_RDWR)
		created = true
	}
	if err != nil {
		return nil, false, fmt.Errorf("bitmap %s: %w", rel, err)
	}
	buf := make([]byte, bitmapHeader+8*len(b.bits))
	if _, rerr := f.ReadAt(buf, 0); rerr != nil {
		f.Close()
		return nil, false, fmt.Errorf("bitmap %s: %w: %w", rel, ErrBitmap, rerr)
	}
	if string(buf[:8]) != bitmapMagic || int64(binary.LittleEndian.Uint64(buf[8:])) != size ||
		int64(binary.LittleEndian.Uint64(buf[16:])) != granule {
		f.Close()
		return nil, false, fmt.Errorf("bitmap %s (disk %d bytes, granule %d): %w", rel, size, granule, ErrBitmap)
	}
	for i := range b.bits {
		b.bits[i] = binary.LittleEndian.Uint64(buf[bitmapHeader+8*i:])
		b.count += bits.OnesCount64(b.bits[i])
	}
	b.f = f
	return b, created, nil
}

// MemoryBitmap is a Bitmap that is not persisted (tests, and a Set
// without Options.Bitmap).
func MemoryBitmap(size, granule int64) *Bitmap {
	n := (size + granule - 1) / granule
	return &Bitmap{rel: "(memory)", size: size, granule: granule, bits: make([]uint64, (n+63)/64)}
}

func (b *Bitmap) encode() []byte {
	buf := make([]byte, bitmapHeader+8*len(b.bits))
	copy(buf, bitmapMagic)
	binary.LittleEndian.PutUint64(buf[8:], uint64(b.size))
	binary.LittleEndian.PutUint64(buf[16:], uint64(b.granule))
	for i, w := range b.bits {
		binary.LittleEndian.PutUint64(buf[bitmapHeader+8*i:], w)
	}
	return buf
}

// mkdirAll makes rel and its parents in fsys, each durable in its parent.
func mkdirAll(fsys storage.FS, rel string) error {
	if rel == "." || rel == "" || rel == "/" {
		return nil
	}
	if fi, err := fsys.Lstat(rel); err == nil {
		if !fi.IsDir() {
			return fmt.Errorf("%s: not a directory", rel)
		}
		return nil
	}
	parent := path.Dir(rel)
	if err := mkdirAll(fsys, parent); err != nil {
		return err
	}
	if err := fsys.Mkdir(rel, 0o700); err != nil && !errors.Is(err, fs.ErrExist) {
		return err
	}
	return fsys.SyncDir(parent)
}

// Mark sets the granules of [off, off+length) and returns once they are
// durable. Granules already set cost nothing.
//
// A bit is set in memory only once it is on disk: when the write of the
// changed words fails, nothing is set and a later Mark writes them again.
// A failed sync is final for the file (docs/durability.md): the kernel may
// have dropped the words it could not write and the next sync would
// succeed, so every later Mark fails with that error, and the bits of the
// failed Mark stay set in memory (the caller may have applied the change,
// and Ranges must cover it).
func (b *Bitmap) Mark(off, length int64) error {
	if length <= 0 {
		return nil
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.failed != nil {
		return b.failed
	}
	if b.f == nil && b.fsys != nil {
		return fmt.Errorf("bitmap %s: closed", b.rel)
	}
	end := min(off+length, b.size)
	if off < 0 || off >= end {
		return nil
	}
	// The words as they will be, apart from b.bits until they are durable.
	lo, hi := int(off/b.granule/64), int((end-1)/b.granule/64)
	words := append([]uint64(nil), b.bits[lo:hi+1]...)
	for g := off / b.granule; g*b.granule < end; g++ {
		words[int(g/64)-lo] |= 1 << (g % 64)
	}
	first, last, added := -1, -1, 0
	for i, w := range words {
		if n := bits.OnesCount64(w &^ b.bits[lo+i]); n > 0 {
			added += n
			if first < 0 {
				first = i
			}
			last = i
		}
	}
	if added == 0 {
		return nil
	}
	words, first = words[first:last+1], lo+first
	if b.fsys != nil {
		buf := make([]byte, 8*len(words))
		for i, w := range words {
			binary.LittleEndian.PutUint64(buf[8*i:], w)
		}
		if _, err := b.f.WriteAt(buf, bitmapHeader+8*int64(first)); err != nil {
			return fmt.Errorf("bitmap %s: %w", b.rel, err)
		}
		if err := b.f.Sync(); err != nil {
			b.failed = fmt.Errorf("bitmap %s: a sync failed, the file can promise nothing more: %w", b.rel, err)
			b.f.Close()
			b.f = nil
			copy(b.bits[first:], words)
			b.count += added
			return b.failed
		}
	}
	copy(b.bits[first:], words)
	b.count += added
	return nil
}

// MarkAll sets every granule: for a copy whose changes are not known (a new
// copy, or an out-of-sync copy whose bitmap was lost).
func (b *Bitmap) MarkAll() error { return b.Mark(0, b.size) }

// Granules returns the number of dirty granules and the granule size.
func (b *Bitmap) Granules() (n int, granule int64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.count, b.granule
}

// Ranges returns the dirty granules as byte ranges (the last one cut at the
// disk's end), in order.
func (b *Bitmap) Ranges() [][2]int64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	var out [][2]int64
	for i, w := range b.bits {
		for ; w != 0; w &= w - 1 {
			g := int64(i)*64 + int64(bits.TrailingZeros64(w))
			off := g * b.granule
			out = append(out, [2]int64{off, min(b.granule, b.size-off)})
		}
	}
	return out
}

// Share returns b for one more holder (each closes it once), if its file
// is still open and it is for a disk of size bytes; otherwise nil.
func (b *Bitmap) Share(size int64) *Bitmap {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.f == nil || b.size != size {
		return nil
	}
	b.refs++
	return b
}

// Close closes the file once its last holder closed it; the bitmap stays on
// disk.
func (b *Bitmap) Close() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.f == nil {
		return nil
	}
	if b.refs--; b.refs > 0 {
		return nil
	}
	err := b.f.Close()
	b.f = nil
	return err
}

// Remove closes and deletes the bitmap, for every holder (their later
// Marks fail): the copy holds everything again. The removal is durable when
// Remove returns nil.
func (b *Bitmap) Remove() error {
	b.mu.Lock()
	if b.f != nil {
		_ = b.f.Close()
		b.f = nil
	}
	b.mu.Unlock()
	if b.fsys == nil {
		return nil
	}
	if err := b.fsys.Remove(b.rel); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	return b.fsys.SyncDir(path.Dir(b.rel))
}

// BitmapPath is where the pool keeps the dirty bitmap of disk of the local
// volume with uid for copy node: cluster/dirty/<uid>/<disk>.<node>.
func BitmapPath(uid, disk, node string) string {
	return path.Join(BitmapDir(uid), disk+"."+strings.ReplaceAll(node, "/", "_"))
}

// BitmapDir holds every dirty bitmap of the local volume with uid.
func BitmapDir(uid string) string { return path.Join("cluster", "dirty", uid) }
