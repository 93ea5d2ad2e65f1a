package pool

import (
	"errors"
	"io"
	"sync"
	"sync/atomic"
)

// Chunk ownership: keeping disk images cheap to snapshot.
//
// FICLONE (a snapshot or clone with reflink) walks every extent record of a
// file, and random writes multiply records: a write into a range shared with
// a snapshot is copied on write into an extent of its own, splitting the
// shared one; a write into a preallocated range splits it into written and
// unwritten parts. After 100k random 4 KiB writes a 1 GiB image holds ~100k
// records and a snapshot of it takes about a second.
//
// So a disk is written in chunks of ChunkSize bytes (1 MiB) that the image
// owns outright: the first write into a chunk that is not
// solid (a hole, preallocated, shared with a snapshot, or fragmented:
// fscap.Solid) rewrites the whole chunk, its current content with the new
// data merged in, in one pwrite. The filesystem then maps the chunk as one
// new extent, and later writes into it overwrite in place. The image never
// holds more than a few records per chunk, whatever the write pattern, and a
// snapshot's FICLONE stays fast. This is the copy-up of Ceph RBD's
// snapshots at 1 MiB instead of 4 MiB: the first write to a chunk after a
// snapshot costs a 1 MiB read and write. On XFS the first cowWrites writes
// into blocks the chunk still shares with the disk's pinned snapshot are
// left to the filesystem's copy on write instead (unshare.go), a few more
// records for a chunk written a few times, and the copy-up comes with the
// write after them, if any.
//
// Correctness rests on one invariant: while a chunk is not known to be
// owned, every write, trim and zero into it holds the chunk's stripe lock,
// so a rewrite never puts back stale data over a concurrent change. A chunk
// becomes owned under its lock; it stops being owned only when a capture
// has shared every chunk, with the gate held exclusively, so no write that
// saw it owned is still in flight. Reads need no lock: a rewrite writes the
// same bytes the chunk already holds, apart from the new data.
//
// Ownership steers the layout, and on XFS where the first write into a
// chunk may go (unshare.go: never in place onto a block another file's copy
// on write may have just left to the image); content never depends on it.
// Pools on filesystems without reflink do not use chunks (a copy costs the
// same whatever the layout).

// ChunkSize is the unit of chunk ownership on pools with reflink.
const ChunkSize = ExtentSizeHint

const chunkStripes = 64

type chunks struct {
	shift uint // log2 of the chunk size
	owned []atomic.Uint64
	// cow counts, per chunk, the writes left to the filesystem's copy on
	// write since the last capture (unshare.go: pinned blocks), under the
	// chunk's lock; zeroed with the gate held exclusively.
	cow []uint8
	// frag counts, per chunk, the writes left to copy on write since the
	// chunk was last rewritten whole, across captures (which zero cow
	// only), under the chunk's lock; in memory only (tidy.go: fragAfter).
	frag  []uint8
	locks [chunkStripes]sync.Mutex
}

func newChunks(size, chunk int64) *chunks {
	c := &chunks{}
	for int64(1)<<c.shift < chunk {
		c.shift++
	}
	c.resize(size)
	return c
}

// resize makes room for a disk of size bytes (gate held exclusively).
func (c *chunks) resize(size int64) {
	n := int((size>>c.shift + 1 + 63) / 64)
	if n <= len(c.owned) {
		return
	}
	owned := make([]atomic.Uint64, n)
	for i := range c.owned {
		owned[i].Store(c.owned[i].Load())
	}
	c.owned = owned
	c.cow = append(c.cow, make([]uint8, 64*n-len(c.cow))...)
	c.frag = append(c.frag, make([]uint8, 64*n-len(c.frag))...)
}

// disown forgets every chunk (gate held exclusively): a capture now shares
// them all.
func (c *chunks) disown() {
	for i := range c.owned {
		c.owned[i].Store(0)
	}
	clear(c.cow)
}

func (c *chunks) isOwned(i int64) bool { return c.owned[i/64].Load()&(1<<(i%64)) != 0 }

func (c *chunks) setOwned(i int64) {
	w := &c.owned[i/64]
	for {
		old := w.Load()
		if old&(1<<(i%64)) != 0 || w.CompareAndSwap(old, old|1<<(i%64)) {
			return
		}
	}
}

func (c *chunks) lock(i int64) *sync.Mutex {
	m := &c.locks[i%chunkStripes]
	m.Lock()
	return m
}

// span is the range [start, end) of chunk i on a disk of size bytes.
func (c *chunks) span(i, size int64) (int64, int64) {
	start := i << c.shift
	return start, min(start+1<<c.shift, size)
}

var chunkBufs = sync.Pool{New: func() any { return new([]byte) }}

// write writes p at off (in range) so that every chunk it touches ends up
// owned.
func (df *diskFile) write(p []byte, off int64) error {
	c := df.ch
	if c == nil || len(p) == 0 {
		_, err := df.f.WriteAt(p, off)
		return err
	}
	end := off + int64(len(p))
	for i := off >> c.shift; i<<c.shift < end; i++ {
		start, stop := c.span(i, df.size)
		lo, hi := max(off, start), min(end, stop)
		piece := p[lo-off : hi-off]
		if c.isOwned(i) {
			if _, err := df.f.WriteAt(piece, lo); err != nil {
				return err
			}
			continue
		}
		if err := df.writeChunk(i, piece, lo, start, stop); err != nil {
			return err
		}
	}
	return nil
}

// writeChunk writes piece at lo into chunk i, [start, stop), which was not
// owned when looked at, and makes the chunk owned.
func (df *diskFile) writeChunk(i int64, piece []byte, lo, start, stop int64) error {
	c := df.ch
	defer c.lock(i).Unlock()
	if c.isOwned(i) { // by a write that held the lock before us
		_, err := df.f.WriteAt(piece, lo)
		return err
	}
	if df.us != nil { // XFS (unshare.go)
		if done, err := df.firstWrite(i, piece, lo, start, stop); done || err != nil {
			return err
		}
	}
	whole := lo == start && lo+int64(len(piece)) == stop
	if !whole {
		solid, err := df.f.Solid(start, stop-start)
		if err != nil && !errors.Is(err, ErrNotSupported) {
			return err
		}
		if !solid {
			return df.rewrite(i, piece, lo, start, stop)
		}
	}
	if _, err := df.f.WriteAt(piece, lo); err != nil {
		return err
	}
	c.setOwned(i)
	return nil
}

// rewrite writes chunk i whole: its content with piece merged in at lo.
func (df *diskFile) rewrite(i int64, piece []byte, lo, start, stop int64) error {
	bp := chunkBufs.Get().(*[]byte)
	defer chunkBufs.Put(bp)
	buf, err := df.merged(bp, piece, lo, start, stop)
	if err != nil {
		return err
	}
	if _, err := df.f.WriteAt(buf, start); err != nil {
		if !errors.Is(err, ErrNoSpace) {
			return err
		}
		// A nearly full pool may lack the chunk's worth of space the
		// rewrite needs but have the piece's: write just that, in place
		// (a short rewrite wrote back only bytes the chunk held or the
		// piece's own), and leave the chunk unowned.
		if _, err := df.f.WriteAt(piece, lo); err != nil {
			return err
		}
		return nil
	}
	df.ch.setOwned(i)
	df.ch.frag[i] = 0
	return nil
}

// merged reads [a, b) of the image into the chunk buffer bp (from
// chunkBufs) and merges piece in at lo.
func (df *diskFile) merged(bp *[]byte, piece []byte, lo, a, b int64) ([]byte, error) {
	if cap(*bp) < int(b-a) {
		*bp = make([]byte, max(b-a, 1<<df.ch.shift))
	}
	buf := (*bp)[:b-a]
	n, err := df.f.ReadAt(buf, a)
	if errors.Is(err, io.EOF) {
		clear(buf[n:]) // a file short of its disk size after a crash mid-grow
		err = nil
	}
	if err != nil {
		return nil, err
	}
	copy(buf[lo-a:], piece)
	return buf, nil
}

// lockRange takes the stripe locks of every chunk of [off, off+length) that
// is not owned, in stripe order, for a trim or zero: they change content
// without writing through write. It returns the unlock.
func (df *diskFile) lockRange(off, length int64) func() {
	c := df.ch
	if c == nil || length == 0 {
		return func() {}
	}
	var need [chunkStripes]bool
	for i := off >> c.shift; i<<c.shift < off+length; i++ {
		if !c.isOwned(i) {
			need[i%chunkStripes] = true
		}
	}
	var held []*sync.Mutex
	for s := range need {
		if need[s] {
			c.locks[s].Lock()
			held = append(held, &c.locks[s])
		}
	}
	return func() {
		for _, m := range held {
			m.Unlock()
		}
	}
}
