package pool

import (
	"sync"
	"time"

	"github.com/quiverstorage/quiver/internal/storage"
)

// Tidying chunks in the background, on XFS.
//
// The first writes into a chunk shared with the pinned snapshot go to the
// filesystem's copy on write (unshare.go), each splitting the chunk's
// extent record; the chunk is then rewritten whole, so that it ends in one
// extent again (chunks.go: records are what a snapshot's FICLONE walks).
// That rewrite copies a whole chunk to keep a few blocks. Done by the write
// that needed it, it made the writes right after a snapshot pay for it:
// 4 KiB random writes ran at a third of a plain reflinked file's rate
// (docs/benchmarks.md, "Writes right after a snapshot"). So a chunk that
// took tidyAfter copy-on-write writes is queued, and the pool's tidier
// rewrites it tidyDelay later, off the write path, one chunk at a time.
// Writes meanwhile still go to copy on write, up to cowWrites; the write
// after that rewrites the chunk itself, as before, so a tidier far behind a
// VM that writes everywhere still leaves at most 2*cowWrites+1 records in a
// chunk.
//
// A capture zeroes the count, so a chunk that takes one such write between
// every two snapshots (DR or backups every few minutes, and a VM that
// writes here and there) would never be queued, and would gain records at
// every snapshot, without bound: a 4 GiB image held 81,000 after 30 rounds
// of a snapshot and 2,048 random writes, and each snapshot took 2 s. So
// the chunk also counts, in memory, such writes since it was last
// rewritten whole, whatever the captures between (chunks.frag); past
// fragAfter, its first copy-on-write write after a capture queues it too.
//
// A rewrite lands in one extent only if the image's copy-on-write fork
// holds nothing else in the chunk: XFS reserves there, around each write
// into a shared block, its copy-on-write extent size (128 KiB by default),
// and a later rewrite of the chunk takes those reserved blocks where they
// are, and new ones for the rest (a chunk written once in each of nine
// captures came out of its rewrite in 17 records). So the pool sets the
// images' copy-on-write extent size to one block (cowExtentSize), and
// rewrites their chunks by a clone from a scratch file (unshare.go,
// cloneSpan), which lands a chunk in one extent and writes no block in
// place. An image made with the old extent size hint keeps a chunk-sized
// reservation (the larger of the two), and is rewritten through the copy
// on write, which consumes it (diskFile.cloneRewrite off).
//
// The tidier's rewrite is the write path's (firstWrite), with no new data:
// under the chunk's lock and the volume's gate (shared), so it excludes the
// writes into the chunk and the captures, and it changes no byte a reader
// sees. A chunk owned meanwhile, or shared anew by a capture (its count is
// zeroed then), or a disk that has lost its pin, is left alone.

const (
	// tidyAfter is how many copy-on-write writes since a capture queue a
	// chunk.
	tidyAfter = 2
	// fragAfter is how many since the chunk was last rewritten whole
	// (across captures) make its next one queue it.
	fragAfter = 8
	// cowExtentSize is the images' copy-on-write extent size (see above).
	cowExtentSize = 4096
	// tidyDelay lets a burst of writes into a chunk end before its
	// rewrite, and keeps the rewrite out of the burst's way.
	tidyDelay = 500 * time.Millisecond
	// tidyGap spaces the rewrites (a chunk each: at most 256 MiB/s of
	// 1 MiB chunks), so that the tidier never takes the disk from the VMs.
	tidyGap = 4 * time.Millisecond
	// tidyQueueMax bounds the queue; chunks beyond it are rewritten by
	// their writes (cowWrites).
	tidyQueueMax = 1 << 14
)

// tidier is the pool's queue of chunks to rewrite, and its one goroutine,
// which runs while the queue has work.
type tidier struct {
	mu      sync.Mutex
	queue   []tidyItem
	running bool
	closed  bool
	off     bool          // tests: the write path rewrites every chunk itself
	stop    chan struct{} // closed by close: the goroutine ends
	done    chan struct{} // closed when the running goroutine ends
}

type tidyItem struct {
	df *diskFile
	i  int64
	at time.Time
}

// add queues chunk i of df (its lock held).
func (t *tidier) add(df *diskFile, i int64) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed || t.off || len(t.queue) >= tidyQueueMax {
		return
	}
	t.queue = append(t.queue, tidyItem{df: df, i: i, at: time.Now()})
	if !t.running {
		t.running = true
		if t.stop == nil {
			t.stop = make(chan struct{})
		}
		t.done = make(chan struct{})
		go t.run(t.stop, t.done)
	}
}

func (t *tidier) run(stop, done chan struct{}) {
	defer close(done)
	timer := time.NewTimer(0)
	defer timer.Stop()
	for {
		t.mu.Lock()
		if len(t.queue) == 0 {
			t.queue = nil
			t.running = false
			t.mu.Unlock()
			return
		}
		it := t.queue[0]
		t.queue = t.queue[1:]
		t.mu.Unlock()
		timer.Reset(max(time.Until(it.at.Add(tidyDelay)), tidyGap))
		select {
		case <-stop:
			return
		case <-timer.C:
		}
		if err := it.df.v.tidy(it.df, it.i); err != nil {
			it.df.v.pool.log.Warn("tidy a chunk after copy-on-write writes", "volume", it.df.v.name, "disk", it.df.name, "err", err)
		}
	}
}

// close drops the queue and waits for the goroutine to end.
func (t *tidier) close() {
	t.mu.Lock()
	t.closed = true
	t.queue = nil
	running, done := t.running, t.done
	if t.stop != nil {
		close(t.stop)
	}
	t.mu.Unlock()
	if running {
		<-done
	}
}

// tidy rewrites chunk i of df whole, if it still holds copy-on-write
// writes and is not owned (see above). An error leaves the chunk as it
// was: its next write rewrites it, or fails the same way.
func (v *Volume) tidy(df *diskFile, i int64) error {
	v.gate.RLock()
	defer v.gate.RUnlock()
	if df.gone != nil || df.pin == nil || df.fill != nil {
		return nil
	}
	c := df.ch
	defer c.lock(i).Unlock()
	if c.isOwned(i) || c.cow[i] == 0 || c.cow[i] < tidyAfter && c.frag[i] <= fragAfter {
		return nil
	}
	start, stop := c.span(i, df.size)
	if df.cloneRewrite {
		if err := df.cloneSpan(nil, start, start, stop, true); err != nil {
			return err
		}
		c.setOwned(i)
		c.frag[i] = 0
		return nil
	}
	if !df.pinnedChunk(i) {
		force, ok, err := df.pinnedOrAlone(start, stop)
		if err != nil || !ok {
			return err
		}
		if force {
			if err := df.us.forceLog(); err != nil {
				return err
			}
		}
	}
	return df.rewrite(i, nil, start, start, stop)
}

// smallCopyOnWrite sets the image's copy-on-write extent size to one block
// (cowExtentSize; XFS takes it on a file with blocks, and keeps it) and
// reports whether XFS now uses it: not on an image made with the extent
// size hint, the larger of the two.
func smallCopyOnWrite(f storage.File) bool {
	if err := f.SetCowExtentSize(cowExtentSize); err != nil {
		return false
	}
	n, err := f.CowExtentSize()
	return err == nil && n == cowExtentSize
}
