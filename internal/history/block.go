package history

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
)

// BlockSize is the size of a stamped block.
const BlockSize = 4096

const blockMagic = 0x5148495354424c4b // "QHISTBLK"

// Errors of Parse: the block is no write of a writer (ErrGarbage), a write
// cut in the middle (ErrTorn), or a write made for another disk or offset
// (ErrMisplaced).
var (
	ErrGarbage   = errors.New("not a stamped block")
	ErrTorn      = errors.New("torn block (bad CRC32C)")
	ErrMisplaced = errors.New("block written for another place")
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// Value names one write: its writer and the writer's sequence number
// (from 1). The zero Value is the initial content, all zeros.
type Value struct {
	Writer uint32
	Seq    uint64
}

func (v Value) String() string {
	if v == (Value{}) {
		return "zeros"
	}
	return fmt.Sprintf("writer %d seq %d", v.Writer, v.Seq)
}

// Stamp fills b (BlockSize bytes) with the write v of block off of disk:
// a header naming them, a payload derived from them, and a CRC32C of it all.
func Stamp(b []byte, disk uint32, off int64, v Value) {
	if len(b) != BlockSize {
		panic(fmt.Sprintf("history.Stamp: %d bytes, want %d", len(b), BlockSize))
	}
	binary.BigEndian.PutUint64(b[0:], blockMagic)
	binary.BigEndian.PutUint32(b[8:], disk)
	binary.BigEndian.PutUint32(b[12:], v.Writer)
	binary.BigEndian.PutUint64(b[16:], uint64(off))
	binary.BigEndian.PutUint64(b[24:], v.Seq)
	binary.BigEndian.PutUint32(b[32:], 0)
	binary.BigEndian.PutUint32(b[36:], 0)
	x := v.Seq*0x9e3779b97f4a7c15 ^ uint64(v.Writer)<<40 ^ uint64(off) | 1
	for i := 40; i < len(b); i += 8 {
		x ^= x << 13
		x ^= x >> 7
		x ^= x << 17
		binary.BigEndian.PutUint64(b[i:], x)
	}
	binary.BigEndian.PutUint32(b[32:], crc32.Checksum(b, castagnoli))
}

// Parse returns the write that b (BlockSize bytes, read at off of disk)
// holds: the zero Value for zeros, or an error wrapping ErrGarbage, ErrTorn
// or ErrMisplaced.
func Parse(b []byte, disk uint32, off int64) (Value, error) {
	if len(b) != BlockSize {
		return Value{}, fmt.Errorf("%d bytes, want %d: %w", len(b), BlockSize, ErrGarbage)
	}
	if isZero(b) {
		return Value{}, nil
	}
	if binary.BigEndian.Uint64(b[0:]) != blockMagic {
		return Value{}, fmt.Errorf("first bytes %x: %w", b[:16], ErrGarbage)
	}
	want := binary.BigEndian.Uint32(b[32:])
	c := make([]byte, len(b))
	copy(c, b)
	binary.BigEndian.PutUint32(c[32:], 0)
	if got := crc32.Checksum(c, castagnoli); got != want {
		return Value{}, fmt.Errorf("header says writer %d seq %d: %w", binary.BigEndian.Uint32(b[12:]),
			binary.BigEndian.Uint64(b[24:]), ErrTorn)
	}
	v := Value{Writer: binary.BigEndian.Uint32(b[12:]), Seq: binary.BigEndian.Uint64(b[24:])}
	if d, o := binary.BigEndian.Uint32(b[8:]), int64(binary.BigEndian.Uint64(b[16:])); d != disk || o != off {
		return v, fmt.Errorf("%v of disk %d offset %d: %w", v, d, o, ErrMisplaced)
	}
	return v, nil
}

func isZero(b []byte) bool {
	for _, x := range b {
		if x != 0 {
			return false
		}
	}
	return true
}
