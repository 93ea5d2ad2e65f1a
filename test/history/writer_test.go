package historytest

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/quiverstorage/quiver/internal/forward"
	"github.com/quiverstorage/quiver/internal/history"
)

// The writers: workers per disk, each owning its blocks (one 4 KiB block in
// every other 64 KiB granule of the disk, so a few seconds of writes dirty
// every granule a resync tracks), writing self-identifying blocks
// (history.Stamp) one at a time and a FLUSH every eighth request, through
// one handle per disk shared by the disk's workers. Every write and FLUSH
// goes into the history log as it is sent and as it is answered.
//
// A handle is a forward.Disk: the client side of the code a node uses to
// follow a primary. It connects to the first of its addresses and moves to
// the next when its connection breaks, sending the unanswered request
// again. Disk 0's handle starts on the node that holds no copy (which
// forwards to the primary of the moment), disk 1's on the primary itself,
// so that an acknowledgement on that connection is the primary's own (the
// lease check of a partition). Handles are made again, on the same plan,
// at the start of every cycle.

const (
	granule      = 64 << 10 // replica.DefaultGranule
	workersPer   = 2
	flushEvery   = 8
	requestLimit = 60 * time.Second  // one try on one connection; above a primary's hold (2L + 10 s)
	retryLimit   = 100 * time.Second // across connections
)

// handle is one disk's connection, generation gen, with its connection log.
type handle struct {
	gen      uint64
	d        *forward.Disk
	mu       sync.Mutex
	connects []connectEvent
}

type connectEvent struct {
	at   time.Time
	addr string
}

// ackAt is one acknowledgement: on which handle, when it was sent and when
// it came back.
type ackAt struct {
	disk     int
	gen      uint64
	sent, at time.Time
}

type writer struct {
	c       *cluster
	log     *history.Log
	exports []string // per disk
	size    int64
	seed    uint64
	gen     atomic.Uint64

	mu      sync.Mutex
	cond    *sync.Cond
	paused  bool
	stopped bool
	active  int
	handles []*handle
	acks    []ackAt // this cycle's
	errs    []error // this cycle's
	flushes atomic.Int64
	zone    atomic.Int32 // which of its blocks a worker writes
	wg      sync.WaitGroup
}

// The zones of the disks the workers write: the whole disk, or its first
// or second half only (so that a resync can be made to copy one half while
// the writers write the other).
const (
	zoneAll = iota
	zoneLow
	zoneHigh
)

func newWriter(c *cluster, log *history.Log, exports []string, size int64, seed uint64) *writer {
	w := &writer{c: c, log: log, exports: exports, size: size, seed: seed, paused: true,
		handles: make([]*handle, len(exports))}
	w.cond = sync.NewCond(&w.mu)
	for di := range exports {
		for j := range workersPer {
			w.wg.Add(1)
			go w.work(di, j)
		}
	}
	return w
}

// blocks lists the offsets that worker j of a disk owns.
func (w *writer) blocks(j int) []int64 {
	var out []int64
	for g := int64(j); g < w.size/granule; g += workersPer {
		out = append(out, g*granule+(g%16)*history.BlockSize)
	}
	return out
}

// open makes disk di's handle, connecting to addrs in turn.
func (w *writer) open(di int, addrs []string) (*handle, error) {
	h := &handle{gen: w.gen.Add(1)}
	var next atomic.Int64
	resolve := func(context.Context) (string, error) {
		return addrs[int(next.Add(1)-1)%len(addrs)], nil
	}
	d, err := forward.Open(context.Background(), w.exports[di], resolve, forward.Options{Dial: w.c.net.Dial,
		RequestTimeout: requestLimit, RetryFor: retryLimit, DialTimeout: time.Second,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
		OnConnect: func(addr string) {
			h.mu.Lock()
			h.connects = append(h.connects, connectEvent{time.Now(), addr})
			h.mu.Unlock()
		}})
	if err != nil {
		return nil, fmt.Errorf("open disk %d through %v: %w", di, addrs, err)
	}
	h.d = d
	return h, nil
}

// resume opens fresh handles (addrs gives each disk's addresses) and lets
// the workers go; this cycle's acknowledgements and errors start empty.
func (w *writer) resume(addrs func(di int) []string) error {
	hs := make([]*handle, len(w.exports))
	for di := range hs {
		h, err := w.open(di, addrs(di))
		if err != nil {
			for _, o := range hs[:di] {
				_ = o.d.Close()
			}
			return err
		}
		hs[di] = h
	}
	w.mu.Lock()
	w.handles, w.acks, w.errs, w.paused = hs, nil, nil, false
	w.zone.Store(zoneAll)
	w.cond.Broadcast()
	w.mu.Unlock()
	return nil
}

// pause waits until no worker has a request in flight and holds them; then
// it FLUSHes every handle (logged: every acknowledged write becomes durable)
// and closes them.
func (w *writer) pause() {
	w.mu.Lock()
	was := w.paused
	w.paused = true
	for w.active > 0 {
		w.cond.Wait()
	}
	hs := w.handles
	w.mu.Unlock()
	if was {
		return // paused already: its handles are closed
	}
	for di, h := range hs {
		if h == nil {
			continue
		}
		f := w.log.InvokeFlush(uint32(di), h.gen)
		if err := h.d.Flush(); err != nil {
			f.Fail()
			w.fail(fmt.Errorf("disk %d: the FLUSH after the writers paused: %w", di, err))
		} else {
			f.Ack()
		}
		_ = h.d.Close()
	}
}

// stop ends the workers (paused first).
func (w *writer) stop() {
	w.pause()
	w.mu.Lock()
	w.stopped = true
	w.cond.Broadcast()
	w.mu.Unlock()
	w.wg.Wait()
}

// enter waits until the workers may run and returns disk di's handle, or
// nil once stopped; leave ends the request.
func (w *writer) enter(di int) *handle {
	w.mu.Lock()
	defer w.mu.Unlock()
	for w.paused && !w.stopped {
		w.cond.Wait()
	}
	if w.stopped {
		return nil
	}
	w.active++
	return w.handles[di]
}

func (w *writer) leave(a *ackAt) {
	w.mu.Lock()
	if a != nil {
		w.acks = append(w.acks, *a)
	}
	w.active--
	w.cond.Broadcast()
	w.mu.Unlock()
}

func (w *writer) work(di, j int) {
	defer w.wg.Done()
	id := uint32(di*workersPer + j + 1)
	rng := rand.New(rand.NewPCG(w.seed, uint64(id)))
	all := w.blocks(j)
	half := slices.IndexFunc(all, func(off int64) bool { return off >= w.size/2 })
	zones := [][]int64{zoneAll: all, zoneLow: all[:half], zoneHigh: all[half:]}
	buf := make([]byte, history.BlockSize)
	var seq uint64
	for n := 0; ; n++ {
		h := w.enter(di)
		if h == nil {
			return
		}
		sent := time.Now()
		if n%flushEvery == flushEvery-1 {
			f := w.log.InvokeFlush(uint32(di), h.gen)
			if err := h.d.Flush(); err != nil {
				f.Fail()
				w.fail(fmt.Errorf("disk %d writer %d: FLUSH sent at %s: %w", di, id, sent.UTC().Format("15:04:05.000"), err))
				w.leave(nil)
				continue
			}
			f.Ack()
			w.flushes.Add(1)
			w.leave(&ackAt{di, h.gen, sent, time.Now()})
			continue
		}
		mine := zones[w.zone.Load()]
		off := mine[rng.IntN(len(mine))]
		seq++
		v := history.Value{Writer: id, Seq: seq}
		history.Stamp(buf, uint32(di), off, v)
		op, err := w.log.InvokeWrite(history.Block{Disk: uint32(di), Off: off}, v, h.gen)
		if err != nil {
			panic(err) // the workers' own bug
		}
		sent = time.Now()
		if err := h.d.WriteAt(buf, off, false); err != nil {
			op.Fail(err)
			w.fail(fmt.Errorf("disk %d writer %d: write %v at %d sent at %s: %w", di, id, v, off, sent.UTC().Format("15:04:05.000"), err))
			w.leave(nil)
			continue
		}
		op.Ack()
		w.leave(&ackAt{di, h.gen, sent, time.Now()})
	}
}

func (w *writer) fail(err error) {
	w.mu.Lock()
	w.errs = append(w.errs, err)
	w.mu.Unlock()
}

// err joins this cycle's client errors.
func (w *writer) err() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	return errors.Join(w.errs...)
}

// waitFlushes waits until n more FLUSHes were acknowledged, or limit.
func (w *writer) waitFlushes(n int64, limit time.Duration) error {
	want := w.flushes.Load() + n
	deadline := time.Now().Add(limit)
	for w.flushes.Load() < want {
		if time.Now().After(deadline) {
			return fmt.Errorf("%d FLUSHes acknowledged in %v, want %d", n-(want-w.flushes.Load()), limit, n)
		}
		time.Sleep(20 * time.Millisecond)
	}
	return nil
}

// lastAcksOn returns, for disk di, the acknowledgements that came on the
// connection its handle had open at t (to addr), and whether it had one.
func (w *writer) lastAcksOn(di int, t time.Time) (acks []ackAt, addr string, ok bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	h := w.handles[di]
	h.mu.Lock()
	var from, until time.Time
	for _, ev := range h.connects {
		if !ev.at.After(t) {
			from, addr = ev.at, ev.addr
		} else if until.IsZero() {
			until = ev.at
		}
	}
	h.mu.Unlock()
	if addr == "" {
		return nil, "", false
	}
	for _, a := range w.acks {
		if a.disk == di && a.gen == h.gen && a.at.After(from) && (until.IsZero() || a.at.Before(until)) {
			acks = append(acks, a)
		}
	}
	return acks, addr, true
}

// connects describes disk di's connections this cycle.
func (w *writer) connects(di int) string {
	w.mu.Lock()
	h := w.handles[di]
	w.mu.Unlock()
	h.mu.Lock()
	defer h.mu.Unlock()
	var parts []string
	for _, ev := range h.connects {
		parts = append(parts, ev.at.UTC().Format("15:04:05.000")+" "+ev.addr)
	}
	return strings.Join(parts, ", ")
}
