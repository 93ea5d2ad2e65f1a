package history

import (
	"fmt"
	"slices"
	"sync"
	"time"
)

// Block is one block of the history: a disk and a BlockSize-aligned
// offset.
type Block struct {
	Disk uint32
	Off  int64
}

func (b Block) String() string {
	return fmt.Sprintf("disk %d block %d (offset %d)", b.Disk, b.Off/BlockSize, b.Off)
}

// Log records the requests of every writer, as each saw them: a write or
// FLUSH when it is sent (Invoke*) and when its answer came (Ack, Fail). The
// order of those calls is the history's order, so a writer must call
// Invoke before sending and Ack or Fail after the answer arrived. Each
// block has one writer (its first), and a handle names the connection a
// request went on: a FLUSH makes durable only the writes acknowledged on
// its own handle. Its methods are safe for concurrent use.
type Log struct {
	mu     sync.Mutex
	events uint64
	blocks map[Block]*register
}

// NewLog returns an empty history.
func NewLog() *Log { return &Log{blocks: map[Block]*register{}} }

// register is what the history says of one block.
type register struct {
	owner    uint32
	live     []*write // the writes no acknowledged write is known to follow
	acked    *write   // the last one acknowledged (nil: none yet)
	durable  *write   // the last one made durable by a FLUSH (nil: none yet)
	attempts int
}

type write struct {
	block      Block
	v          Value
	handle     uint64
	invoked    uint64 // event number
	done       uint64 // event number of the answer, 0 while in flight
	acked      bool
	invokedAt  time.Time
	doneAt     time.Time
	durableAt  time.Time
	lastFlush  bool // covered by an acknowledged FLUSH
	failReason string
}

// Write is a write in flight: Ack or Fail it once its answer came.
type Write struct {
	l *Log
	w *write
}

// InvokeWrite records that v is being written to block b on handle. It
// fails when another writer owns the block or v is not newer than the
// block's last write (each writer's sequence numbers must grow).
func (l *Log) InvokeWrite(b Block, v Value, handle uint64) (Write, error) {
	if v == (Value{}) || b.Off%BlockSize != 0 {
		return Write{}, fmt.Errorf("history: write %v to %v: want a sequence number from 1 and an aligned offset", v, b)
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	r := l.blocks[b]
	if r == nil {
		r = &register{owner: v.Writer}
		l.blocks[b] = r
	}
	if r.owner != v.Writer {
		return Write{}, fmt.Errorf("history: %v belongs to writer %d, not %d", b, r.owner, v.Writer)
	}
	if n := len(r.live); n > 0 && r.live[n-1].v.Seq >= v.Seq || r.acked != nil && r.acked.v.Seq >= v.Seq {
		return Write{}, fmt.Errorf("history: %v: %v is not newer than the block's last write", b, v)
	}
	l.events++
	w := &write{block: b, v: v, handle: handle, invoked: l.events, invokedAt: time.Now()}
	r.live = append(r.live, w)
	r.attempts++
	return Write{l: l, w: w}, nil
}

// Ack records the write's acknowledgement: every write of its block
// answered before this one was sent is superseded from now on.
func (x Write) Ack() {
	l := x.l
	l.mu.Lock()
	defer l.mu.Unlock()
	l.events++
	w := x.w
	w.done, w.acked, w.doneAt = l.events, true, time.Now()
	r := l.blocks[w.block]
	if r.acked == nil || r.acked.done < w.done {
		r.acked = w
	}
	r.live = slices.DeleteFunc(r.live, func(o *write) bool { return o.done != 0 && o.done < w.invoked })
}

// Fail records that the write was answered with an error (or given up):
// it may have taken effect, but no later than now.
func (x Write) Fail(err error) {
	l := x.l
	l.mu.Lock()
	defer l.mu.Unlock()
	l.events++
	x.w.done, x.w.doneAt, x.w.failReason = l.events, time.Now(), fmt.Sprint(err)
}

// Flush is a FLUSH in flight: Ack or Fail it once its answer came.
type Flush struct {
	l *Log
	// covers holds, per block of the disk, the last write acknowledged on
	// the handle when the FLUSH was sent: what its acknowledgement makes
	// durable.
	covers []*write
}

// InvokeFlush records that a FLUSH of disk is being sent on handle.
func (l *Log) InvokeFlush(disk uint32, handle uint64) Flush {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.events++
	f := Flush{l: l}
	for b, r := range l.blocks {
		if b.Disk != disk {
			continue
		}
		var last *write
		for _, w := range append([]*write{r.acked}, r.live...) {
			if w != nil && w.acked && w.handle == handle && (last == nil || w.done > last.done) {
				last = w
			}
		}
		if last != nil {
			f.covers = append(f.covers, last)
		}
	}
	return f
}

// Ack records the FLUSH's acknowledgement: the writes it covers are
// durable.
func (f Flush) Ack() {
	l := f.l
	l.mu.Lock()
	defer l.mu.Unlock()
	l.events++
	now := time.Now()
	for _, w := range f.covers {
		r := l.blocks[w.block]
		if r.durable == nil || r.durable.v.Seq < w.v.Seq {
			w.durableAt = now
			r.durable = w
		}
	}
}

// Fail records that the FLUSH failed: it makes nothing durable.
func (f Flush) Fail() {
	f.l.mu.Lock()
	f.l.events++
	f.l.mu.Unlock()
}
