package pool

import (
	"errors"
	"fmt"
	"math"
	"os"
	"path"
	"path/filepath"
	"sync"
	"sync/atomic"

	"github.com/quiverstorage/quiver/internal/storage"
)

// Writing where another file's copy on write left a block to this image
// alone, on XFS.
//
// A clone shares its source's blocks. When one of the two writes a shared
// block, XFS copies it on write: the new data goes to a new block, and at
// writeback the file is remapped onto it and the old block's reference
// count drops, so the other file now owns the old block outright. Those
// changes are in XFS's log in memory until something forces the log. When
// the other file then writes that block, XFS sees it unshared and
// overwrites it in place, and an fdatasync of that write forces nothing
// (an overwrite changes no metadata). After a crash the log is replayed
// without the first file's remap: the first file maps the old block again,
// which now holds the second file's data. One VM's data in another VM's
// disk: the clone leak of docs/durability.md, found by test/powercut and
// test/shutdown on Debian's 6.1 kernel, and shown on the host's 6.18 by
// TestInPlaceOverwriteAfterCopyOnWrite.
//
// So on XFS a chunk that is not owned (chunks.go: shared at the last
// capture, or not known since the pool opened) is never written in place
// while its blocks may be shared, or may have stopped being shared by a
// change that is not durable yet. A write into it first looks whether the
// blocks under it are pinned: written data at the very addresses where the
// disk's pinned snapshot has the same bytes (storage.File.SameBlocks).
// The pin is that snapshot's image, open read-only (diskFile.pin): nothing
// writes, truncates or punches a snapshot's image, and while the pool
// holds it open XFS frees none of its blocks, even if the snapshot is
// deleted meanwhile (its deletion drops the pin first, with the gate
// closed, so no write is between its look and its write then). So a
// pinned block has at least two owners from the look to the write and
// after, and XFS copies the write on write: the new data goes to a new
// block of the image's own, and no block is written in place. This is
// what a plain file on XFS does on every write into a reflinked block (the
// image's fdatasync then forces the remap with its data); it leaves the
// chunk in several extents, so a chunk takes at most cowWrites such
// writes. The next write into it rewrites it whole, so that the chunk ends
// in one extent: by the clone below, on images whose copy-on-write extent
// size is one block (tidy.go, diskFile.cloneRewrite); on images made with
// the old extent size hint, by a plain write too (pinnedOrAlone) when every
// written block of the chunk is pinned (copied on write) or shared with no
// other file (written in place after a log force, as below), else by the
// clone below. Otherwise the first write into the chunk looks at its extents
// (storage.File.Sharing), as XFS has them in memory:
//   - no written data (holes, preallocation): the write allocates new
//     blocks; nothing of another file can be under it;
//   - data, nothing shared: whatever unshared it happened before the look,
//     so a log force that starts after the look (unsharer.forceLog) makes it
//     durable, and the write may then go in place;
//   - something shared: the chunk, its content with the new data merged in,
//     is written to a scratch file and cloned from there into the image
//     (FICLONERANGE): the image is remapped onto new blocks in one logged
//     step, and no shared block is ever written. The scratch file's range
//     is then punched, so the image owns the new blocks alone.
//
// Once owned, a chunk's blocks are the image's own (written by the image
// since the capture), and later writes overwrite them in place. Other
// reflink filesystems copy every shared write (btrfs), or are the server's
// business (NFS): the pool does this on XFS only.

// unsharer holds what the first writes into unowned chunks need: the pool's
// filesystem and a file whose metadata changes force XFS's log.
type unsharer struct {
	fs  storage.FS
	dir string // where scratch files are made (staging/)

	mu sync.Mutex // one log force at a time
	// barrier is pool.lock, open for writing for the life of the pool: a
	// force needs no new file (an inode, a directory entry: space a full
	// pool may not have). Its size alternates between base (its PID line)
	// and base+4096, a hole that takes no space.
	barrier storage.File
	base    int64
	grown   bool
	// started and done number the forces: the last one started, and the
	// last one that succeeded.
	started, done atomic.Uint64

	tidy tidier // chunks to rewrite in the background (tidy.go)
}

// newUnsharer returns the unsharer of a pool on XFS, with barrier its open
// pool.lock.
func newUnsharer(fsys storage.FS, barrier storage.File) (*unsharer, error) {
	fi, err := barrier.Stat()
	if err != nil {
		return nil, err
	}
	// Open for writing? (Not where the server may not write it, though it
	// may write the pool's directory.)
	if err := barrier.Truncate(fi.Size()); err != nil {
		return nil, fmt.Errorf("pool.lock must be writable on XFS, whose log it is used to force: %w", err)
	}
	return &unsharer{fs: fsys, dir: "staging", barrier: barrier, base: fi.Size()}, nil
}

// forceLog returns once every metadata change the filesystem made before
// it was called is durable, whichever file it concerns. Callers that
// arrive while a force runs share the next one. On XFS a size change of the
// barrier and its fdatasync: a transaction, then a log force up to it,
// which writes every earlier transaction too. A truncate to the size the
// file has may log nothing fdatasync must force (an empty file's changes
// only its timestamps): each force sets the other size, which XFS always
// logs.
func (u *unsharer) forceLog() error {
	arrived := u.started.Load()
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.done.Load() > arrived {
		return nil // a force that started after we arrived has ended
	}
	n := u.started.Add(1)
	size := u.base
	if !u.grown {
		size += 4096
	}
	if err := u.barrier.Truncate(size); err != nil {
		return err
	}
	u.grown = !u.grown
	// A failed sync leaves done as it was, and the next force syncs again.
	// Its log force is done anew each time (a failed log write shuts XFS
	// down, and every later force fails too); what fdatasync reports once
	// and then forgets is a failed writeback of the file's own data, the
	// PID line, which nothing here needs.
	if err := u.barrier.Sync(); err != nil {
		return err
	}
	u.done.Store(n)
	return nil
}

// close stops the tidier and gives pool.lock back its size.
func (u *unsharer) close() {
	u.tidy.close()
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.grown && u.barrier.Truncate(u.base) == nil {
		u.grown = false
	}
}

// scratch makes a new file in dir and returns it with its removal (close
// and unlink). It keeps its name while in use: a file unlinked while open
// would have to be freed by XFS's log recovery after a crash, a path with
// known bugs on older kernels; a named one is removed by the pool when it
// opens (it empties staging/), an ordinary unlink.
func (u *unsharer) scratch() (storage.File, func(), error) {
	rel := path.Join(u.dir, "unshare-"+newUID())
	f, err := u.fs.OpenFile(rel, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return nil, nil, err
	}
	return f, func() {
		_ = f.Close()
		_ = u.fs.Remove(rel)
	}, nil
}

// unshareBlock is the alignment of a clone of part of a chunk: FICLONERANGE
// takes whole filesystem blocks (4 KiB on the pools this runs on).
const unshareBlock = 4096

// cowWrites is how many writes into an unowned chunk go to pinned blocks
// by XFS's copy on write (see above) before the next rewrites the chunk
// whole. Each splits an extent record in up to three, so a chunk holds at
// most 2*cowWrites+1 records until it is rewritten (chunks.go: records are
// what a snapshot's FICLONE walks).
const cowWrites = 8

// firstWrite decides how a write into unowned chunk i, [start, stop),
// goes (see above), with the chunk's lock held. done reports that it wrote
// the piece itself; otherwise the caller writes as it would without the
// check (the chunk is not shared, and any unsharing is durable).
func (df *diskFile) firstWrite(i int64, piece []byte, lo, start, stop int64) (done bool, err error) {
	if df.pin != nil && df.ch.cow[i] < cowWrites {
		// A chunk wholly pinned when pinned holds, block by block, either
		// a block the pin still has (copied on write) or one the image's
		// own copy on write made since, shared with no file ever (written
		// in place, safely): no look at its blocks is needed.
		pinned := df.pinnedChunk(i)
		if !pinned {
			a := max(start, lo&^(unshareBlock-1))
			b := min(stop, (lo+int64(len(piece))+unshareBlock-1)&^(unshareBlock-1))
			var err error
			pinned, err = df.f.SameBlocks(df.pin, a, b-a)
			if err != nil && !errors.Is(err, ErrNotSupported) {
				return false, err
			}
		}
		if pinned {
			_, err := df.f.WriteAt(piece, lo)
			if err == nil {
				df.cowWritten(i)
			}
			return true, err
		}
	}
	if df.pin != nil && df.ch.cow[i] > 0 && df.cloneRewrite {
		// A chunk the copy on write above took writes into, on an image
		// whose copy-on-write fork holds nothing around them: a clone
		// lands it in one extent, with no block written in place.
		return true, df.cloneWrite(i, piece, lo, start, stop)
	}
	if df.pin != nil && df.ch.cow[i] > 0 {
		// A chunk the copy on write above took writes into: rewrite it
		// whole through XFS's copy on write too, which consumes what
		// XFS reserved for it in the image's copy-on-write fork (around
		// each write, its copy-on-write extent size: 128 KiB by default,
		// the whole chunk on images made with the extent size hint), so
		// the chunk ends in one extent or few; a clone from a scratch
		// file would leave those reservations, and every later write
		// into them would go through them, each a new extent record. A chunk wholly pinned when pinned needs no
		// look (as above): its blocks the rewrite overwrites in place
		// are the image's own copies, shared with no file ever.
		if !df.pinnedChunk(i) {
			force, ok, err := df.pinnedOrAlone(start, stop)
			if err != nil || !ok {
				return err != nil, err
			}
			if force {
				if err := df.us.forceLog(); err != nil {
					return true, err
				}
			}
		}
		return true, df.rewrite(i, piece, lo, start, stop)
	}
	data, shared, err := df.f.Sharing(start, stop-start)
	if err != nil && !errors.Is(err, ErrNotSupported) {
		return false, err
	}
	switch {
	case err != nil || shared:
		return true, df.cloneWrite(i, piece, lo, start, stop)
	case data:
		return false, df.us.forceLog()
	}
	return false, nil
}

// cowWritten counts a write into unowned chunk i left to copy on write
// (its lock held), and queues the chunk for the tidier (tidy.go) at its
// tidyAfter-th such write since the capture, or at its first once it has
// taken more than fragAfter since it was last rewritten whole.
func (df *diskFile) cowWritten(i int64) {
	c := df.ch
	c.cow[i]++
	if c.frag[i] < math.MaxUint8 {
		c.frag[i]++
	}
	if c.cow[i] == tidyAfter || c.cow[i] == 1 && c.frag[i] > fragAfter {
		df.us.tidy.add(df, i)
	}
}

// pinnedCopyOnWrite reports whether a write of length bytes at off can go
// to XFS's copy on write with no look at its blocks: it falls in one chunk
// (i) that was wholly pinned when pinned, on a disk with a pin (gate
// held). The chunk's lock, ownership and count are the caller's to check.
func (df *diskFile) pinnedCopyOnWrite(off, length int64) (i int64, ok bool) {
	c := df.ch
	if c == nil || df.us == nil || df.pin == nil || length == 0 {
		return 0, false
	}
	i = off >> c.shift
	return i, (off+length-1)>>c.shift == i && df.pinnedChunk(i)
}

// pinnedOrAlone reports whether every written block of [a, b) is pinned
// or shared with no other file (ok), and whether some are the latter
// (force): a write into the range then goes in place only onto blocks of
// the image's own, once a log force that starts after this look has made
// durable whatever unshared them, and is copied on write everywhere else.
func (df *diskFile) pinnedOrAlone(a, b int64) (force, ok bool, err error) {
	pinned, err := df.f.SameBlocks(df.pin, a, b-a)
	if err != nil || pinned {
		return false, pinned, err
	}
	data, shared, err := df.f.Sharing(a, b-a)
	switch {
	case err != nil:
		return false, false, err
	case !shared:
		return data, true, nil
	case b-a <= unshareBlock:
		return false, false, nil // shared with a file other than the pin
	}
	mid := a + max(unshareBlock, (b-a)/2&^(unshareBlock-1))
	f1, ok1, err := df.pinnedOrAlone(a, mid)
	if err != nil || !ok1 {
		return false, false, err
	}
	f2, ok2, err := df.pinnedOrAlone(mid, b)
	return f1 || f2, ok2, err
}

// cloneWrite writes piece at lo into chunk i, [start, stop), without
// writing any block of the image in place: the chunk's content with piece
// merged in is cloned into the image from a scratch file, and the chunk is
// then owned. On a nearly full pool that lacks a chunk's worth of space, it
// does the same with just the blocks under the piece, and the chunk stays
// unowned.
func (df *diskFile) cloneWrite(i int64, piece []byte, lo, start, stop int64) error {
	err := df.cloneSpan(piece, lo, start, stop, true)
	if err == nil {
		df.ch.setOwned(i)
		df.ch.frag[i] = 0
		return nil
	}
	if !errors.Is(err, ErrNoSpace) {
		return err
	}
	a := max(start, lo&^(unshareBlock-1))
	b := min(stop, (lo+int64(len(piece))+unshareBlock-1)&^(unshareBlock-1))
	return df.cloneSpan(piece, lo, a, b, false)
}

// cloneSpan replaces [a, b) of the image with its content and piece merged
// in at lo, by FICLONERANGE from a scratch file of size b (so that a span
// ending at the image's unaligned end ends at the scratch's end too). With
// hint, the scratch file is allocated in whole chunks, as the images are;
// without, it takes only the span's blocks: XFS reserves a write's whole
// hint-aligned extent, so the fallback for a nearly full pool must not set
// it.
func (df *diskFile) cloneSpan(piece []byte, lo, a, b int64, hint bool) error {
	buf := piece
	if lo != a || int64(len(piece)) != b-a {
		bp := chunkBufs.Get().(*[]byte)
		defer chunkBufs.Put(bp)
		var err error
		if buf, err = df.merged(bp, piece, lo, a, b); err != nil {
			return err
		}
	}
	sc, remove, err := df.us.scratch()
	if err != nil {
		return err
	}
	defer remove()
	// Allocated as the images are, so the chunk lands in one extent (the
	// image's layout, chunks.go) even where free space is fragmented.
	if hint {
		if err := sc.SetExtentSizeHint(ExtentSizeHint); err != nil && !errors.Is(err, ErrNotSupported) {
			return err
		}
	}
	if err := sc.Truncate(b); err != nil {
		return err
	}
	if _, err := sc.WriteAt(buf, a); err != nil {
		return err
	}
	if err := df.f.CloneRange(sc, a, b-a); err != nil {
		return err
	}
	// Now, not when XFS gets round to freeing the closed file: until then
	// the image's new blocks are shared, and the next writes into the
	// chunk would be copied on write, scattering it. The scratch file is
	// never read, so its punch need not be durable before they overwrite
	// the blocks in place.
	return sc.Punch(a, b-a)
}

// zero makes [off, off+length) read as zeros (zeroRange), holding the locks
// of the unowned chunks it changes. On XFS the parts that do not cover
// whole 4 KiB blocks are written as zeros through write instead: the
// filesystem zeroes a partial block by writing it, in place where it sees
// the block unshared, which is the write the first-write check above keeps
// off blocks another file may have just left to this image.
func (df *diskFile) zero(off, length int64, mayTrim, fast bool) error {
	end := off + length
	lo, hi := off, end
	if df.us != nil {
		lo = min((off+unshareBlock-1)&^(unshareBlock-1), end)
		hi = max(end&^(unshareBlock-1), lo)
	}
	if lo < hi {
		unlock := df.lockRange(lo, hi-lo)
		err := zeroRange(df, lo, hi-lo, mayTrim, fast)
		unlock()
		if err != nil {
			return err
		}
	}
	for _, e := range [][2]int64{{off, lo}, {hi, end}} {
		if e[0] < e[1] {
			if err := df.write(zeroBlock[:e[1]-e[0]], e[0]); err != nil {
				return err
			}
		}
	}
	return nil
}

// pinSnapshot (ops lock held), once snapshot name of disks is committed,
// pins its images for the open disks (diskFile.pin) in place of the ones
// they pinned before. A disk whose image does not open keeps its old pin:
// any snapshot's image will do, the newest shares the most.
func (v *Volume) pinSnapshot(name string, disks []DiskSpec) {
	if v.pool.us == nil {
		return
	}
	opened := map[string]storage.File{}
	for _, d := range disks {
		f, err := v.pool.openImage(v.pool.rel(filepath.Join(v.snapshotDir(name), d.Name+".img")), os.O_RDONLY)
		if err != nil {
			v.pool.log.Warn("pin a snapshot's image for first writes", "volume", v.name, "disk", d.Name, "err", err)
			continue
		}
		opened[d.Name] = f
	}
	// Which chunks are wholly shared with the pin, from one walk of both
	// extent maps (before the gate: the image only gains blocks of its
	// own meanwhile, which a write may take in place).
	whole := map[string][]uint64{}
	v.gate.RLock()
	for d, f := range opened {
		if df := v.files[d]; df != nil && df.ch != nil && df.gone == nil {
			whole[d] = pinnedChunks(df, f)
		}
	}
	v.gate.RUnlock()
	var unused []storage.File
	v.gate.Lock()
	for d, f := range opened {
		if df := v.files[d]; df != nil && df.us != nil && df.gone == nil {
			unused = append(unused, df.pin)
			df.pin, df.pinned, df.pinAll = f, name, whole[d]
		} else {
			unused = append(unused, f)
		}
	}
	v.gate.Unlock()
	for _, f := range unused {
		if f != nil {
			_ = f.Close()
		}
	}
}

// unpinSnapshot (ops lock held) drops the pins of snapshot name, with the
// gate closed: no write is then between looking at a pinned block and
// writing it.
func (v *Volume) unpinSnapshot(name string) {
	v.gate.Lock()
	defer v.gate.Unlock()
	for _, df := range v.files {
		if df.pinned == name {
			df.unpin()
		}
	}
}

// unpin (gate held exclusively) closes df's pin.
func (df *diskFile) unpin() {
	if df.pin != nil {
		_ = df.pin.Close()
	}
	df.pin, df.pinned, df.pinAll = nil, "", nil
}

// pinnedChunks returns the chunks of df every byte of which is written
// data the image shares with pin (nil when the extent maps cannot say).
func pinnedChunks(df *diskFile, pin storage.File) []uint64 {
	shared, err := df.f.SharedBlocks(pin, df.size)
	if err != nil {
		return nil
	}
	c := df.ch
	n := (df.size + 1<<c.shift - 1) >> c.shift
	out := make([]uint64, (n+63)/64)
	// Ranges are sorted and merged: a chunk is pinned when one covers it
	// (up to the disk's end).
	for _, r := range shared {
		for i := (r[0] + 1<<c.shift - 1) >> c.shift; i < n; i++ {
			lo, hi := i<<c.shift, min((i+1)<<c.shift, df.size)
			if lo < r[0] || hi > r[0]+r[1] {
				break
			}
			out[i/64] |= 1 << (i % 64)
		}
	}
	return out
}

// pinnedChunk reports whether chunk i was wholly shared with the pin when
// it was pinned (gate held).
func (df *diskFile) pinnedChunk(i int64) bool {
	return i/64 < int64(len(df.pinAll)) && df.pinAll[i/64]&(1<<(i%64)) != 0
}
