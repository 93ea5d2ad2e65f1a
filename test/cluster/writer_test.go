package clustertest

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/quiverstorage/quiver/internal/forward"
)

// The writer of the failover tests: several workers per disk write 4 KiB
// records, each naming its sequence number, disk and slot with a CRC32C,
// through a client that reconnects to another node when its connection
// breaks (internal/forward, the same code a node uses to follow a primary).
// Every worker owns its slots and has one write in flight, so the writes to
// one slot are ordered. The history log holds, per slot, every sequence
// number attempted and the last one acknowledged, and the last one covered
// by an acknowledged FLUSH.

const (
	recordSize  = 4096
	recordMagic = 0x51464f5245433031 // "QFOREC01"
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// record fills b with the record of seq at (disk, slot).
func record(b []byte, seq uint64, disk, slot int) {
	binary.BigEndian.PutUint64(b[0:], recordMagic)
	binary.BigEndian.PutUint64(b[8:], seq)
	binary.BigEndian.PutUint32(b[16:], uint32(disk))
	binary.BigEndian.PutUint32(b[20:], uint32(slot))
	x := seq*0x9e3779b97f4a7c15 + 1
	for i := 32; i < len(b); i += 8 {
		x ^= x << 13
		x ^= x >> 7
		x ^= x << 17
		binary.BigEndian.PutUint64(b[i:], x)
	}
	binary.BigEndian.PutUint32(b[24:], 0)
	binary.BigEndian.PutUint32(b[24:], crc32.Checksum(b, castagnoli))
}

// parseRecord returns the sequence number of an intact record for (disk,
// slot), 0 for a block of zeros, or an error.
func parseRecord(b []byte, disk, slot int) (uint64, error) {
	if allBytes(b, 0) {
		return 0, nil
	}
	if binary.BigEndian.Uint64(b[0:]) != recordMagic {
		return 0, errors.New("not a record")
	}
	want := binary.BigEndian.Uint32(b[24:])
	c := make([]byte, len(b))
	copy(c, b)
	binary.BigEndian.PutUint32(c[24:], 0)
	if crc32.Checksum(c, castagnoli) != want {
		return 0, errors.New("torn record (bad CRC32C)")
	}
	if d, s := int(binary.BigEndian.Uint32(b[16:])), int(binary.BigEndian.Uint32(b[20:])); d != disk || s != slot {
		return 0, fmt.Errorf("record of disk %d slot %d", d, s)
	}
	return binary.BigEndian.Uint64(b[8:]), nil
}

// slotHistory is what the clients did to one slot.
type slotHistory struct {
	attempted map[uint64]bool
	acked     uint64 // last acknowledged sequence number (writes are ordered)
	flushed   uint64 // last one covered by an acknowledged FLUSH
}

// diskClient is one disk's connection with its connection log.
type diskClient struct {
	d        *forward.Disk
	mu       sync.Mutex
	connects []connectEvent
}

type connectEvent struct {
	at   time.Time
	addr string
}

// ackAt is one acknowledgement on disk's connection: when the request was
// sent and when its answer came.
type ackAt struct {
	sent, at time.Time
	disk     int
}

type writer struct {
	disks   []*diskClient
	slots   int // per worker
	workers int // per disk
	seq     atomic.Uint64

	mu      sync.Mutex
	history map[[2]int]*slotHistory // (disk, slot)
	acks    []ackAt                 // every acknowledged write and flush, in order of arrival
	flushes atomic.Int64
	errs    []error

	stop chan struct{}
	wg   sync.WaitGroup
}

// startWriter opens each export (one connection per disk, to the address
// first returns, then to the next of addrs each time a connection breaks)
// and starts workers per disk.
func startWriter(ctx context.Context, c *cluster, exports []string, addrs []string, workers, slots int) (*writer, error) {
	w := &writer{slots: slots, workers: workers, history: map[[2]int]*slotHistory{}, stop: make(chan struct{})}
	for _, ex := range exports {
		dc := &diskClient{}
		var next atomic.Int64
		resolve := func(context.Context) (string, error) {
			i := next.Add(1) - 1
			return addrs[int(i)%len(addrs)], nil
		}
		d, err := forward.Open(ctx, ex, resolve, forward.Options{Dial: c.net.Dial, RequestTimeout: 10 * time.Second,
			RetryFor: 120 * time.Second, DialTimeout: time.Second,
			OnConnect: func(addr string) {
				dc.mu.Lock()
				dc.connects = append(dc.connects, connectEvent{time.Now(), addr})
				dc.mu.Unlock()
			}})
		if err != nil {
			w.close()
			return nil, fmt.Errorf("open %s: %w", redact(ex), err)
		}
		dc.d = d
		w.disks = append(w.disks, dc)
	}
	for di := range w.disks {
		for j := range workers {
			w.wg.Add(1)
			go w.work(di, j)
		}
	}
	return w, nil
}

func redact(export string) string {
	if i := len(export) - 64; i > 0 {
		return export[:i] + "<token>"
	}
	return export
}

func (w *writer) work(di, j int) {
	defer w.wg.Done()
	d := w.disks[di].d
	rng := rand.New(rand.NewPCG(uint64(di), uint64(j)))
	buf := make([]byte, recordSize)
	var mine []int
	for n := 0; ; n++ {
		select {
		case <-w.stop:
			return
		default:
		}
		if n%8 == 7 {
			sent := time.Now()
			if err := d.Flush(); err != nil {
				w.fail(fmt.Errorf("disk %d worker %d: flush: %w", di, j, err))
				return
			}
			now := time.Now()
			w.mu.Lock()
			for _, s := range mine {
				h := w.history[[2]int{di, s}]
				h.flushed = h.acked
			}
			w.acks = append(w.acks, ackAt{sent, now, di})
			w.mu.Unlock()
			w.flushes.Add(1)
			mine = mine[:0]
			continue
		}
		slot := j*w.slots + rng.IntN(w.slots)
		seq := w.seq.Add(1)
		record(buf, seq, di, slot)
		w.mu.Lock()
		h := w.history[[2]int{di, slot}]
		if h == nil {
			h = &slotHistory{attempted: map[uint64]bool{}}
			w.history[[2]int{di, slot}] = h
		}
		h.attempted[seq] = true
		w.mu.Unlock()
		sent := time.Now()
		if err := d.WriteAt(buf, int64(slot)*recordSize, false); err != nil {
			w.fail(fmt.Errorf("disk %d worker %d: write seq %d: %w", di, j, seq, err))
			return
		}
		now := time.Now()
		w.mu.Lock()
		h.acked = seq
		w.acks = append(w.acks, ackAt{sent, now, di})
		w.mu.Unlock()
		mine = append(mine, slot)
	}
}

func (w *writer) fail(err error) {
	w.mu.Lock()
	w.errs = append(w.errs, err)
	w.mu.Unlock()
}

// err is the first error a worker met (an error that reached the client).
func (w *writer) err() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	return errors.Join(w.errs...)
}

// firstAckAfter is the time of the first acknowledgement after t.
func (w *writer) firstAckAfter(t time.Time) (time.Time, bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, a := range w.acks {
		if a.at.After(t) {
			return a.at, true
		}
	}
	return time.Time{}, false
}

// waitFlushes waits until n more FLUSHes were acknowledged, or timeout.
func (w *writer) waitFlushes(n int64, timeout time.Duration) error {
	want := w.flushes.Load() + n
	deadline := time.Now().Add(timeout)
	for w.flushes.Load() < want {
		if err := w.err(); err != nil {
			return err
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%d flushes in %s, want %d", n-(want-w.flushes.Load()), timeout, n)
		}
		time.Sleep(20 * time.Millisecond)
	}
	return nil
}

// halt stops the workers, waits for them and closes the connections.
func (w *writer) halt() {
	close(w.stop)
	w.wg.Wait()
	w.close()
}

func (w *writer) close() {
	for _, dc := range w.disks {
		_ = dc.d.Close()
	}
}

// check compares the blocks of each disk (read gives disk di's bytes at an
// offset) with the history: every slot holds an intact record that was
// written to it, no older than the last write acknowledged there (and so no
// older than the last flushed one). It returns the number of slots checked
// and those whose acknowledged write was flushed.
func (w *writer) check(read func(di int, off, length int64) []byte) (checked, flushed int, err error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	var errs []error
	for di := range w.disks {
		blocks := read(di, 0, int64(w.workers*w.slots)*recordSize)
		for slot := range w.workers * w.slots {
			h := w.history[[2]int{di, slot}]
			b := blocks[slot*recordSize : (slot+1)*recordSize]
			seq, perr := parseRecord(b, di, slot)
			switch {
			case perr != nil:
				errs = append(errs, fmt.Errorf("disk %d slot %d: %w", di, slot, perr))
			case h == nil:
				if seq != 0 {
					errs = append(errs, fmt.Errorf("disk %d slot %d: seq %d, never written", di, slot, seq))
				}
			case seq == 0 && h.acked == 0:
			case !h.attempted[seq]:
				errs = append(errs, fmt.Errorf("disk %d slot %d: seq %d was never written there", di, slot, seq))
			case seq < h.acked:
				errs = append(errs, fmt.Errorf("disk %d slot %d: holds seq %d, but seq %d was acknowledged (flushed: %d): an acknowledged write is lost",
					di, slot, seq, h.acked, h.flushed))
			}
			if h != nil {
				checked++
				if h.flushed != 0 {
					flushed++
				}
			}
			if len(errs) > 20 {
				return checked, flushed, errors.Join(errs...)
			}
		}
	}
	return checked, flushed, errors.Join(errs...)
}

// lastAckBefore is, per disk, the last acknowledgement on the connection
// that was open at t (before the disk's first new connection after t).
// Sending a request then retrying it elsewhere does not count: only the
// requests answered on that connection.
func (w *writer) lastAckBefore(t time.Time) []ackAt {
	w.mu.Lock()
	defer w.mu.Unlock()
	out := make([]ackAt, len(w.disks))
	for di, dc := range w.disks {
		dc.mu.Lock()
		var sw time.Time
		for _, ev := range dc.connects {
			if ev.at.After(t) {
				sw = ev.at
				break
			}
		}
		dc.mu.Unlock()
		for _, a := range w.acks {
			if a.disk == di && (sw.IsZero() || a.at.Before(sw)) && a.at.After(out[di].at) {
				out[di] = a
			}
		}
	}
	return out
}

// connects lists disk di's connections: when and where.
func (w *writer) connects(di int) string {
	dc := w.disks[di]
	dc.mu.Lock()
	defer dc.mu.Unlock()
	var parts []string
	for _, ev := range dc.connects {
		parts = append(parts, ev.at.UTC().Format("15:04:05.000")+" "+ev.addr)
	}
	return strings.Join(parts, ", ")
}
