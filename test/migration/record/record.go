// Package record is the on-disk format of the live-migration test's guest
// writer: one Size-byte record per slot, record i at offset i*Size, holding
// sequence number i. The guest program (test/migration/guestwriter) encodes
// records; the test decodes the disks read back over NBD.
//
// A record is
//
//	[0:8)       Magic
//	[8:16)      sequence number, little endian
//	[16:24)     disk number (0 for the first disk the guest writes, 1 for the next)
//	[24:4088)   filler derived from the sequence and disk numbers
//	[4088:4092) CRC-32C of [0:4088), little endian
//	[4092:4096) zero
//
// The filler makes every byte of the record depend on the sequence and disk
// numbers, so a record torn between two writes, shifted or copied to another
// slot fails Decode.
//
// The package imports only the standard library, so that the guest program
// stays a small static binary.
//
// Imports from quiver: nothing.
package record

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
)

// Size is the size of a record: one 4 KiB block, the unit of an O_DIRECT
// write on a virtio-blk disk.
const Size = 4096

// Magic starts every record.
const Magic = "QVMIGSEQ"

const (
	seqOff    = 8
	diskOff   = 16
	fillOff   = 24
	crcOff    = Size - 8
	paddedEnd = Size
)

// ErrEmpty: the slot holds only zeros, it was never written.
var ErrEmpty = errors.New("empty slot")

// ErrCorrupt: the slot holds something that is not an intact record.
var ErrCorrupt = errors.New("corrupt record")

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// Encode fills buf (Size bytes) with the record of seq for disk.
func Encode(buf []byte, seq, disk uint64) {
	if len(buf) != Size {
		panic(fmt.Sprintf("record.Encode: buffer of %d bytes, want %d", len(buf), Size))
	}
	copy(buf, Magic)
	binary.LittleEndian.PutUint64(buf[seqOff:], seq)
	binary.LittleEndian.PutUint64(buf[diskOff:], disk)
	fill(buf[fillOff:crcOff], seq, disk)
	binary.LittleEndian.PutUint32(buf[crcOff:], crc32.Checksum(buf[:crcOff], castagnoli))
	clear(buf[crcOff+4 : paddedEnd])
}

// Decode returns the sequence and disk numbers of the record in buf (Size
// bytes). It fails with ErrEmpty for an all-zero slot and with ErrCorrupt
// (wrapped, with the reason) for anything else that is not a record Encode
// could have written.
func Decode(buf []byte) (seq, disk uint64, err error) {
	if len(buf) != Size {
		return 0, 0, fmt.Errorf("%w: %d bytes, want %d", ErrCorrupt, len(buf), Size)
	}
	if allZero(buf) {
		return 0, 0, ErrEmpty
	}
	if string(buf[:len(Magic)]) != Magic {
		return 0, 0, fmt.Errorf("%w: magic %q", ErrCorrupt, buf[:len(Magic)])
	}
	if got, want := binary.LittleEndian.Uint32(buf[crcOff:]), crc32.Checksum(buf[:crcOff], castagnoli); got != want {
		return 0, 0, fmt.Errorf("%w: checksum %08x, computed %08x", ErrCorrupt, got, want)
	}
	seq = binary.LittleEndian.Uint64(buf[seqOff:])
	disk = binary.LittleEndian.Uint64(buf[diskOff:])
	want := make([]byte, crcOff-fillOff)
	fill(want, seq, disk)
	if string(want) != string(buf[fillOff:crcOff]) {
		return 0, 0, fmt.Errorf("%w: filler does not match seq %d disk %d", ErrCorrupt, seq, disk)
	}
	if !allZero(buf[crcOff+4 : paddedEnd]) {
		return 0, 0, fmt.Errorf("%w: trailing bytes not zero", ErrCorrupt)
	}
	return seq, disk, nil
}

// fill writes a xorshift64 stream seeded by seq and disk into b.
func fill(b []byte, seq, disk uint64) {
	x := seq*0x9e3779b97f4a7c15 ^ (disk+1)*0xbf58476d1ce4e5b9 | 1
	for i := 0; i < len(b); i += 8 {
		x ^= x << 13
		x ^= x >> 7
		x ^= x << 17
		binary.LittleEndian.PutUint64(b[i:], x)
	}
}

func allZero(b []byte) bool {
	for _, c := range b {
		if c != 0 {
			return false
		}
	}
	return true
}

// Count checks a disk image of size bytes that the guest wrote as disk: slot
// i must hold the record of sequence i for that disk, from slot 0 up to some
// slot n-1, and every slot from n on must be empty. It returns n, the number
// of records, or an error naming the first slot that breaks the rule (a
// corrupt record, a record out of order or for another disk, or a record
// after an empty slot, which means a write was lost).
func Count(img []byte, disk uint64) (n int64, err error) {
	slots := int64(len(img)) / Size
	n = -1
	for i := range slots {
		seq, d, err := Decode(img[i*Size : (i+1)*Size])
		switch {
		case errors.Is(err, ErrEmpty):
			if n < 0 {
				n = i
			}
		case err != nil:
			return 0, fmt.Errorf("slot %d: %w", i, err)
		case n >= 0:
			return 0, fmt.Errorf("slot %d holds seq %d after empty slot %d: a write was lost", i, seq, n)
		case seq != uint64(i) || d != disk:
			return 0, fmt.Errorf("slot %d holds seq %d of disk %d, want seq %d of disk %d", i, seq, d, i, disk)
		}
	}
	if n < 0 {
		n = slots
	}
	return n, nil
}
