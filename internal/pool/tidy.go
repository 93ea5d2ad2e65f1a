package pool

import (
	"sync"
	"time"
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
// The tidier's rewrite is the write path's (firstWrite), with no new data:
// under the chunk's lock and the volume's gate (shared), so it excludes the
// writes into the chunk and the captures, and it changes no byte a reader
// sees. A chunk owned meanwhile, or shared anew by a capture (its count is
// zeroed then), or a disk that has lost its pin, is left alone.

const (
	// tidyAfter is how many copy-on-write writes queue a chunk.
	tidyAfter = 2
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
	if c.isOwned(i) || c.cow[i] < tidyAfter {
		return nil
	}
	start, stop := c.span(i, df.size)
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
