package nbdcrash

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
)

// The durability model of one disk for TestKillDuringWrites.
//
// The disk is cut into blocks; every write covers whole blocks and the test
// never has two writes to one block in flight at once, so the writes to a
// block are ordered by issue. NBD promises (doc/proto.md, "Ordering of
// messages and writes"): a write the server acknowledged before a FLUSH was
// sent is on stable storage once the FLUSH is acknowledged; a write with
// NBD_CMD_FLAG_FUA is once it is acknowledged. Call such a write durable.
// After a crash each block must therefore hold its latest durable write, or
// a write issued after that one (those may or may not have landed); a block
// without a durable write this cycle holds what it held before the cycle, or
// any write of this cycle.

const (
	blockSize = 4096
	// writeBlocks is the most blocks one write covers.
	writeBlocks = 4
)

// write is one NBD_CMD_WRITE of the workload, covering the blocks [first,
// first+n).
type write struct {
	id       int64
	first, n int
	fill     byte // non-zero: every byte is fill (qemu-io's write -P); zero: stamped
	fua      bool
	acked    bool
	durable  string // what made it durable ("FUA", "flush #N"); empty while nothing did
}

// diskModel is what the test knows about one disk.
type diskModel struct {
	name   string
	run    uint64 // in every stamp: blocks of another run never match
	blocks int
	nextID int64 // write and flush ids, unique over the whole run

	base      []byte             // the disk when the cycle began, as read back
	hist      [][]*write         // per block, this cycle's writes in issue order
	unflushed []*write           // acknowledged, not durable yet
	flushes   map[int64][]*write // per flush in flight, the writes it covers
	stats     modelStats
}

type modelStats struct {
	writes, acked, fua, flushed, flushes int // issued, acknowledged, durable by FUA, by FLUSH; flushes acknowledged
	durableBlocks                        int // blocks checked that had to hold a durable write
}

func newDiskModel(name string, run uint64, blocks int) *diskModel {
	m := &diskModel{name: name, run: run, blocks: blocks, base: make([]byte, blocks*blockSize)}
	m.reset()
	return m
}

func (m *diskModel) reset() {
	m.hist = make([][]*write, m.blocks)
	m.unflushed = nil
	m.flushes = map[int64][]*write{}
}

func (m *diskModel) newID() int64 {
	m.nextID++
	return m.nextID
}

// newWrite picks a write of 1 to writeBlocks blocks, none of them busy (a
// write in flight), with FUA one time in eight. With fill it writes one
// repeated byte that no earlier content of those blocks had, so that a lost
// write can never look like a present one. It returns nil when it found no
// such write.
func (m *diskModel) newWrite(rng *rand.Rand, busy []bool, fill bool) *write {
	for range 8 {
		n := 1
		if rng.IntN(4) == 0 {
			n = 1 + rng.IntN(writeBlocks)
		}
		first := rng.IntN(m.blocks - n + 1)
		free := true
		for b := first; b < first+n; b++ {
			free = free && !busy[b]
		}
		if !free {
			continue
		}
		w := &write{first: first, n: n, fua: rng.IntN(8) == 0}
		if fill {
			f, ok := m.freshFill(rng, first, n)
			if !ok {
				continue
			}
			w.fill = f
		}
		w.id = m.newID()
		return w
	}
	return nil
}

// freshFill returns a byte that none of the blocks has held this cycle.
func (m *diskModel) freshFill(rng *rand.Rand, first, n int) (byte, bool) {
	var used [256]bool
	used[0] = true // zeros are what a never-written block holds
	for b := first; b < first+n; b++ {
		if old := m.baseBlock(b); bytes.Count(old, old[:1]) == len(old) {
			used[old[0]] = true
		}
		for _, w := range m.hist[b] {
			used[w.fill] = true
		}
	}
	var free []byte
	for v := range 256 {
		if !used[v] {
			free = append(free, byte(v))
		}
	}
	if len(free) == 0 {
		return 0, false
	}
	return free[rng.IntN(len(free))], true
}

func (m *diskModel) baseBlock(b int) []byte { return m.base[b*blockSize : (b+1)*blockSize] }

// payload is the data of a write.
func (m *diskModel) payload(w *write) []byte {
	p := make([]byte, 0, w.n*blockSize)
	for b := w.first; b < w.first+w.n; b++ {
		p = append(p, m.content(w, b)...)
	}
	return p
}

var stampMagic = [8]byte{'q', 'v', 'n', 'b', 'd', 'c', 'r', '1'}

// content is what w puts in block b: its fill byte, or a stamp naming the
// run, the write and the block, followed by noise derived from them.
func (m *diskModel) content(w *write, b int) []byte {
	if w.fill != 0 {
		return bytes.Repeat([]byte{w.fill}, blockSize)
	}
	p := make([]byte, blockSize)
	copy(p, stampMagic[:])
	binary.LittleEndian.PutUint64(p[8:], m.run)
	binary.LittleEndian.PutUint64(p[16:], uint64(w.id))
	binary.LittleEndian.PutUint64(p[24:], uint64(b))
	x := m.run ^ uint64(w.id)*0x9e3779b97f4a7c15 ^ uint64(b)<<40 | 1
	for i := 32; i < blockSize; i += 8 {
		x ^= x << 13 // xorshift64
		x ^= x >> 7
		x ^= x << 17
		binary.LittleEndian.PutUint64(p[i:], x)
	}
	return p
}

// describe names the content of a block, for failure messages.
func (m *diskModel) describe(p []byte) string {
	switch {
	case bytes.Count(p, p[:1]) == len(p) && p[0] == 0:
		return "zeros"
	case bytes.Count(p, p[:1]) == len(p):
		return fmt.Sprintf("fill %#02x", p[0])
	case bytes.Equal(p[:8], stampMagic[:]):
		run := binary.LittleEndian.Uint64(p[8:])
		id := binary.LittleEndian.Uint64(p[16:])
		b := binary.LittleEndian.Uint64(p[24:])
		if run != m.run {
			return fmt.Sprintf("the stamp of write #%d for block %d of another run", id, b)
		}
		return fmt.Sprintf("the stamp of write #%d for block %d", id, b)
	default:
		return fmt.Sprintf("unknown data starting %x", p[:16])
	}
}

func (m *diskModel) issued(w *write) {
	for b := w.first; b < w.first+w.n; b++ {
		m.hist[b] = append(m.hist[b], w)
	}
	m.stats.writes++
}

func (m *diskModel) ackWrite(w *write) {
	w.acked = true
	m.stats.acked++
	if w.fua {
		w.durable = "FUA"
		m.stats.fua++
		return
	}
	m.unflushed = append(m.unflushed, w)
}

// issueFlush records a FLUSH about to be sent: it covers every write
// acknowledged so far.
func (m *diskModel) issueFlush(id int64) {
	m.flushes[id] = append([]*write(nil), m.unflushed...)
}

func (m *diskModel) ackFlush(id int64) {
	for _, w := range m.flushes[id] {
		if w.durable == "" {
			w.durable = fmt.Sprintf("flush #%d", id)
			m.stats.flushed++
		}
	}
	delete(m.flushes, id)
	m.stats.flushes++
	kept := m.unflushed[:0]
	for _, w := range m.unflushed {
		if w.durable == "" {
			kept = append(kept, w)
		}
	}
	m.unflushed = kept
}

func (m *diskModel) failFlush(id int64) { delete(m.flushes, id) }

// check compares the disk as read back after the crash with the model, and
// makes it the base of the next cycle.
func (m *diskModel) check(img []byte) error {
	if len(img) != len(m.base) {
		return fmt.Errorf("disk %s: read %d bytes, want %d", m.name, len(img), len(m.base))
	}
	var problems []string
	for b := range m.blocks {
		got := img[b*blockSize : (b+1)*blockSize]
		hist := m.hist[b]
		last := -1
		for i, w := range hist {
			if w.durable != "" {
				last = i
			}
		}
		ok := false
		if last < 0 {
			ok = bytes.Equal(got, m.baseBlock(b))
		} else {
			m.stats.durableBlocks++
		}
		for _, w := range hist[max(last, 0):] {
			ok = ok || bytes.Equal(got, m.content(w, b))
		}
		if ok {
			continue
		}
		msg := fmt.Sprintf("block %d (offset %d) holds %s", b, b*blockSize, m.describe(got))
		if last >= 0 {
			d := hist[last]
			msg += fmt.Sprintf(", but write #%d (%s, acknowledged, durable by %s) put %s there and %d writes issued after it may replace it",
				d.id, m.shape(d), d.durable, m.describe(m.content(d, b)), len(hist)-last-1)
		} else {
			msg += fmt.Sprintf(", but it held %s before this cycle and none of its %d writes put that there",
				m.describe(m.baseBlock(b)), len(hist))
		}
		problems = append(problems, msg)
	}
	copy(m.base, img)
	m.reset()
	if len(problems) == 0 {
		return nil
	}
	if len(problems) > 10 {
		problems = append(problems[:10], fmt.Sprintf("... and %d more blocks", len(problems)-10))
	}
	return fmt.Errorf("disk %s lost acknowledged durable data:\n  %s", m.name, strings.Join(problems, "\n  "))
}

func (m *diskModel) shape(w *write) string {
	return fmt.Sprintf("%d blocks from offset %d", w.n, w.first*blockSize)
}

// TestModelCheck makes sure the model fails a disk that lost a durable write
// and passes one that lost only what NBD allows to be lost.
func TestModelCheck(t *testing.T) {
	cases := []struct {
		name string
		// run issues and settles writes 0..2 to block 0 (2 is FUA) and
		// returns which write's content the disk holds (-1: the base).
		run    func(m *diskModel, ws []*write) int
		wantOK bool
	}{
		{"flushed write present", func(m *diskModel, ws []*write) int {
			m.ackWrite(ws[0])
			m.issueFlush(100)
			m.ackFlush(100)
			return 0
		}, true},
		{"flushed write lost", func(m *diskModel, ws []*write) int {
			m.ackWrite(ws[0])
			m.issueFlush(100)
			m.ackFlush(100)
			return -1
		}, false},
		{"unflushed write lost", func(m *diskModel, ws []*write) int {
			m.ackWrite(ws[0])
			return -1
		}, true},
		{"flush still in flight", func(m *diskModel, ws []*write) int {
			m.ackWrite(ws[0])
			m.issueFlush(100)
			return -1
		}, true},
		{"write acknowledged after the flush was sent", func(m *diskModel, ws []*write) int {
			m.issueFlush(100)
			m.ackWrite(ws[0])
			m.ackFlush(100)
			return -1
		}, true},
		{"failed flush", func(m *diskModel, ws []*write) int {
			m.ackWrite(ws[0])
			m.issueFlush(100)
			m.failFlush(100)
			return -1
		}, true},
		{"later write landed over a flushed one", func(m *diskModel, ws []*write) int {
			m.ackWrite(ws[0])
			m.issueFlush(100)
			m.ackFlush(100)
			return 1 // issued, never acknowledged
		}, true},
		{"older write instead of a flushed one", func(m *diskModel, ws []*write) int {
			m.ackWrite(ws[0])
			m.ackWrite(ws[1])
			m.issueFlush(100)
			m.ackFlush(100)
			return 0
		}, false},
		{"FUA write present", func(m *diskModel, ws []*write) int {
			m.ackWrite(ws[2])
			return 2
		}, true},
		{"FUA write lost", func(m *diskModel, ws []*write) int {
			m.ackWrite(ws[0])
			m.ackWrite(ws[1])
			m.ackWrite(ws[2])
			return 1
		}, false},
		{"FUA write in flight lost", func(m *diskModel, ws []*write) int {
			return -1
		}, true},
	}
	for _, tc := range cases {
		for _, fill := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/fill=%v", tc.name, fill), func(t *testing.T) {
				m := newDiskModel("test", 7, 4)
				rng := rand.New(rand.NewPCG(1, 2))
				var ws []*write
				for i := range 3 {
					w := &write{id: m.newID(), first: 0, n: 1, fua: i == 2}
					if fill {
						w.fill, _ = m.freshFill(rng, 0, 1)
					}
					m.issued(w)
					ws = append(ws, w)
				}
				holds := tc.run(m, ws)
				img := make([]byte, len(m.base))
				if holds >= 0 {
					copy(img, m.content(ws[holds], 0))
				}
				err := m.check(img)
				if (err == nil) != tc.wantOK {
					t.Fatalf("check: %v, want ok=%v", err, tc.wantOK)
				}
			})
		}
	}
}
