// Package consistency checks that a snapshot of several disks is a
// consistent cut of a write workload: writers stamp a global sequence number
// into a unique block per write, and the checker proves that the set of
// writes a snapshot holds is closed under happens-before (no write is in it
// while a write that was acknowledged before it began is missing).
//
// It is test support shared by the pool tests and the NBD tests; it imports
// nothing from quiver.
//
// Imports from quiver: nothing.
package consistency

import (
	"encoding/binary"
	"fmt"
	"sync"
	"sync/atomic"
)

// BlockSize is the size of one stamped block.
const BlockSize = 512

var magic = [8]byte{'q', 'v', 'r', 's', 'e', 'q', '0', '1'}

// Log records when each write was issued and acknowledged on one logical
// clock. It is safe for concurrent use.
type Log struct {
	clock  atomic.Int64
	seq    atomic.Int64
	mu     sync.Mutex
	issued map[int64]int64
	acked  map[int64]int64
}

// NewLog returns an empty log.
func NewLog() *Log { return &Log{issued: map[int64]int64{}, acked: map[int64]int64{}} }

// Next assigns the next sequence number (from 1) and records its issue.
func (l *Log) Next() int64 {
	s := l.seq.Add(1)
	t := l.clock.Add(1)
	l.mu.Lock()
	l.issued[s] = t
	l.mu.Unlock()
	return s
}

// Ack records that the write of seq returned successfully.
func (l *Log) Ack(seq int64) {
	t := l.clock.Add(1)
	l.mu.Lock()
	l.acked[seq] = t
	l.mu.Unlock()
}

// Acked returns how many writes were acknowledged.
func (l *Log) Acked() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.acked)
}

// Place maps a sequence number to a disk and a byte offset: writes go round
// robin over the disks, each into its own block.
func Place(seq int64, disks int) (disk int, off int64) {
	return int(seq % int64(disks)), (seq / int64(disks)) * BlockSize
}

// Stamp fills a block with seq.
func Stamp(block []byte, seq int64) {
	clear(block)
	copy(block, magic[:])
	binary.LittleEndian.PutUint64(block[8:], uint64(seq))
	binary.LittleEndian.PutUint64(block[BlockSize-8:], ^uint64(seq))
}

// Scan reads the sequence numbers stamped in one disk image (its bytes) and
// checks each sits where Place puts it.
func Scan(image []byte, disk, disks int, into map[int64]bool) error {
	for off := 0; off+BlockSize <= len(image); off += BlockSize {
		b := image[off : off+BlockSize]
		if [8]byte(b[:8]) != magic {
			if !allZero(b) {
				return fmt.Errorf("disk %d offset %d: torn or foreign block", disk, off)
			}
			continue
		}
		seq := int64(binary.LittleEndian.Uint64(b[8:]))
		if ^uint64(seq) != binary.LittleEndian.Uint64(b[BlockSize-8:]) {
			return fmt.Errorf("disk %d offset %d: torn block for seq %d", disk, off, seq)
		}
		if d, o := Place(seq, disks); d != disk || o != int64(off) {
			return fmt.Errorf("seq %d found on disk %d offset %d, belongs on disk %d offset %d", seq, disk, off, d, o)
		}
		into[seq] = true
	}
	return nil
}

func allZero(b []byte) bool {
	for _, c := range b {
		if c != 0 {
			return false
		}
	}
	return true
}

// Check proves that present, the writes found in a snapshot, is a consistent
// cut: every present write was issued, and no write acknowledged before a
// present write was issued is missing. It returns the number of writes in the
// cut.
func (l *Log) Check(present map[int64]bool) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	var latest, latestSeq int64
	for s := range present {
		t, ok := l.issued[s]
		if !ok {
			return 0, fmt.Errorf("seq %d is in the snapshot but was never issued", s)
		}
		if t > latest {
			latest, latestSeq = t, s
		}
	}
	for s, ack := range l.acked {
		if ack < latest && !present[s] {
			return 0, fmt.Errorf("not a cut: seq %d was acknowledged before seq %d was issued, "+
				"and %d is in the snapshot while %d is missing", s, latestSeq, latestSeq, s)
		}
	}
	return len(present), nil
}
