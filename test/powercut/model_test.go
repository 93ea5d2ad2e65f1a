package powercut

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"slices"
)

// The model of what quiver acknowledged, kept across every cut of a lane.
//
// Data. Every write covers one block (blockSize) and writes a stamp: the
// run, a write id unique in the run, and the block number, repeated over
// the block, so a block read back names the write it came from (id 0 is a
// block of zeros). One NBD client sends one request at a time, so the
// writes to a block are ordered. NBD promises (doc/proto.md, "Ordering of
// messages and writes"): a write acknowledged before a FLUSH was sent is on
// stable storage once the FLUSH is acknowledged; a write with
// NBD_CMD_FLAG_FUA is once it is acknowledged. Per block the model keeps
// the latest such durable write and the writes after it (acknowledged or
// in flight at the cut), which may or may not have landed: after a cut the
// block must hold one of them.
//
// Metadata. A completed operation (volume create and delete, snapshot
// create and delete, clone, disk add, attach, rekey) must be there, whole, after
// every later cut; the one in flight at the cut may be there or not, but if
// it is there it is whole: every disk of a new volume or snapshot present,
// of the right size, with the right content. A snapshot or a clone holds
// exactly what the disks held when it was taken (every write acknowledged
// before it, none after: the client waits for each reply). A rekey,
// shallow or deep, finished or cut midway, changes no block's content: a
// volume in a deep rekey at a cut has blocks under the old data key and
// blocks under the new one, and each must read back as the model says.

const (
	blockSize  = 4096
	diskBlocks = 64 // the disks of plain volumes: 256 KiB
	diskSize   = diskBlocks * blockSize
	// encDiskBlocks: the disks of encrypted volumes, 1 MiB: four steps
	// of a deep rekey (internal/pool, rekey.go: rekeyStep, 256 KiB), so
	// that a cut can land in a step and between steps of a disk.
	encDiskBlocks = 256
)

// blockModel is what one block of a live disk may hold.
type blockModel struct {
	durable uint64   // the latest durable write (0: zeros, or what was read back)
	later   []uint64 // writes after it, oldest first, not durable yet
}

func (b *blockModel) allowed(v uint64) bool {
	return v == b.durable || slices.Contains(b.later, v)
}

// current is what the block holds for a reader now (every write issued has
// been acknowledged, or the power is off).
func (b *blockModel) current() uint64 {
	if len(b.later) > 0 {
		return b.later[len(b.later)-1]
	}
	return b.durable
}

type diskModel struct {
	blocks []blockModel
}

// newDisk models a disk of n blocks holding values (n is then their
// number), or zeros when values is nil.
func newDisk(n int, values []uint64) *diskModel {
	if values != nil {
		n = len(values)
	}
	d := &diskModel{blocks: make([]blockModel, n)}
	for i, v := range values {
		d.blocks[i].durable = v
	}
	return d
}

func (d *diskModel) current() []uint64 {
	out := make([]uint64, len(d.blocks))
	for i := range d.blocks {
		out[i] = d.blocks[i].current()
	}
	return out
}

// flushed records an acknowledged FLUSH of the disk: every write before it
// is durable.
func (d *diskModel) flushed() {
	for i := range d.blocks {
		b := &d.blocks[i]
		b.durable, b.later = b.current(), nil
	}
}

// volModel is a volume: its live disks, its snapshots (exact contents per
// disk), and what the test holds to reach it.
type volModel struct {
	disks map[string]*diskModel
	snaps map[string]map[string][]uint64 // snapshot -> disk -> block values
	token string                         // an rw attachment's token, "" when none is known
	atts  map[string]string              // attachment id -> node, every one completed

	// Encryption (rekey_test.go): encrypted volumes and their clones
	// hold ciphertext; a deep rekey changes no content, but while one
	// may be in progress (rekey: started, or found after a boot, and not
	// seen finished) quiver refuses snapshots, clones and disk changes
	// of the volume. rekeyJob is the job of the one started since the
	// last boot ("" after a boot: a cut ends every job).
	encrypted bool
	rekey     bool
	rekeyJob  string
}

func newVol(disks map[string]*diskModel) *volModel {
	return &volModel{disks: disks, snaps: map[string]map[string][]uint64{}, atts: map[string]string{}}
}

// diskBlocks is the number of blocks of each disk of the volume.
func (v *volModel) diskBlocks() int {
	if v.encrypted {
		return encDiskBlocks
	}
	return diskBlocks
}

func (v *volModel) diskNames() []string {
	return slices.Sorted(func(yield func(string) bool) {
		for n := range v.disks {
			if !yield(n) {
				return
			}
		}
	})
}

// pendingOp is the operation in flight when the power was cut: it may have
// happened or not. Exactly one of the fields names what it would create or
// remove.
type pendingOp struct {
	what string // for messages: "create volume v3", ...

	newVolume string    // create, clone: the volume that may exist
	newVol    *volModel // ... and what it holds if it does
	delVolume string    // delete: the volume that may be gone

	vol      string // the volume of the operations below
	newDisk  string // disk add: the disk that may exist (zeros)
	newSnap  string // snapshot create: the snapshot that may exist
	snapVals map[string][]uint64
	delSnap  string // snapshot delete: the snapshot that may be gone
	attach   string // attach: the node whose attachment may exist
	detach   string // detach: the attachment id that may be gone
}

// model is one lane's knowledge of its pool.
type model struct {
	run     uint64
	nextID  uint64 // write ids
	nextObj int    // numbers in object names, never reused
	vols    map[string]*volModel
	pending *pendingOp

	// For a failure's message: where each write was sent, and the lane's
	// last events (writes, flushes, operations, cuts).
	sentTo  map[uint64]string
	history []string
}

func newModel(run uint64) *model {
	return &model{run: run, vols: map[string]*volModel{}, sentTo: map[uint64]string{}}
}

// historyLen is how many of the lane's last events a failure shows.
const historyLen = 200

// note records an event for a failure's message.
func (m *model) note(format string, args ...any) {
	if len(m.history) == historyLen {
		m.history = append(m.history[:0], m.history[1:]...)
	}
	m.history = append(m.history, fmt.Sprintf(format, args...))
}

// where says where write id was sent.
func (m *model) where(id uint64) string {
	if id == 0 {
		return "zeros"
	}
	if s, ok := m.sentTo[id]; ok {
		return "sent to " + s
	}
	return "not a write of this lane"
}

func (m *model) volNames() []string {
	return slices.Sorted(func(yield func(string) bool) {
		for n := range m.vols {
			if !yield(n) {
				return
			}
		}
	})
}

func (m *model) name(prefix string) string {
	m.nextObj++
	return fmt.Sprintf("%s%d", prefix, m.nextObj)
}

// stamp is the content of write id to block: a 24-byte header (magic, run,
// id, block) repeated over the block.
func stamp(run, id uint64, block int) []byte {
	b := make([]byte, blockSize)
	var hdr [24]byte
	copy(hdr[:4], "QPC1")
	binary.LittleEndian.PutUint64(hdr[4:], run)
	binary.LittleEndian.PutUint64(hdr[12:], id)
	binary.LittleEndian.PutUint32(hdr[20:], uint32(block))
	for off := 0; off < blockSize; off += copy(b[off:], hdr[:]) {
	}
	return b
}

var zeroBlock = make([]byte, blockSize)

// decode names the write a block read back holds: 0 for zeros, else its
// id; an error for anything else (a torn block, another block's data).
func decode(run uint64, block int, b []byte) (uint64, error) {
	if bytes.Equal(b, zeroBlock) {
		return 0, nil
	}
	if len(b) >= 24 && string(b[:4]) == "QPC1" {
		id := binary.LittleEndian.Uint64(b[12:])
		if bytes.Equal(b, stamp(run, id, block)) {
			return id, nil
		}
		return 0, fmt.Errorf("garbage: header says run %#x write %d block %d, but the block is not that write whole",
			binary.LittleEndian.Uint64(b[4:]), id, binary.LittleEndian.Uint32(b[20:]))
	}
	return 0, fmt.Errorf("garbage: % x...", b[:16])
}
