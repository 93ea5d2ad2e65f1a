package fscap

import (
	"fmt"
	"os"
	"unsafe"

	"golang.org/x/sys/unix"
)

// FIEMAP extent flags (<linux/fiemap.h>) that make a range not solid.
const (
	fiemapExtentUnknown   = 0x00000002
	fiemapExtentDelalloc  = 0x00000004
	fiemapExtentEncoded   = 0x00000008
	fiemapExtentUnwritten = 0x00000800
	fiemapExtentShared    = 0x00002000
)

// fiemapExtent mirrors struct fiemap_extent (56 bytes).
type fiemapExtent struct {
	Logical  uint64
	Physical uint64
	Length   uint64
	_        [2]uint64
	Flags    uint32
	_        [3]uint32
}

// solidMaxExtents is how many extents a solid range may span.
const solidMaxExtents = 8

// fiemapBuf is a FIEMAP request with room for solidMaxExtents+1 extents: one
// more than a solid range may have, to tell "too many" from "just enough".
type fiemapBuf struct {
	hdr fiemap
	ext [solidMaxExtents + 1]fiemapExtent
}

// Solid reports whether [off, off+length) of f is fully backed by at most a
// few extents that f owns outright: no hole, no unwritten (preallocated)
// part, nothing shared with another file by a reflink. A write into a solid
// range overwrites in place and leaves the extent map as it is; a write into
// any other range splits extent records (copy-on-write of a shared extent,
// or written and unwritten halves of a preallocation), and the records are
// what FICLONE walks. Delayed-allocation data counts as solid: it is
// allocated in one piece at writeback. Filesystems without FIEMAP give an
// error wrapping ErrNotSupported.
func Solid(f *os.File, off, length int64) (bool, error) {
	var b fiemapBuf
	b.hdr = fiemap{Start: uint64(off), Length: uint64(length), ExtentCount: uint32(len(b.ext))}
	if err := fiemapInto(f, unsafe.Pointer(&b)); err != nil {
		return false, err
	}
	n := int(b.hdr.MappedExtents)
	if n == 0 || n > solidMaxExtents {
		return false, nil
	}
	next := uint64(off)
	for _, e := range b.ext[:n] {
		flags := e.Flags
		if flags&fiemapExtentDelalloc != 0 {
			flags &^= fiemapExtentUnknown // delayed allocation: not placed yet
		}
		if flags&(fiemapExtentUnknown|fiemapExtentEncoded|fiemapExtentUnwritten|fiemapExtentShared) != 0 {
			return false, nil
		}
		if e.Logical > next { // a hole before this extent
			return false, nil
		}
		next = max(next, e.Logical+e.Length)
	}
	return next >= uint64(off+length), nil
}

// sharingBatch is how many extents one FIEMAP call of Sharing returns.
const sharingBatch = 32

// Sharing reports, for [off, off+length) of f as it stands in memory (no
// flush first), whether any of it is written data on the device (not a
// hole, a preallocation or a delayed allocation) and whether any of it is
// shared with another file by a reflink. A range with data and nothing
// shared may have stopped being shared a moment ago, by a change to the
// other file that is not yet durable. Filesystems without FIEMAP give an
// error wrapping ErrNotSupported.
func Sharing(f *os.File, off, length int64) (data, shared bool, err error) {
	var b struct {
		hdr fiemap
		ext [sharingBatch]fiemapExtent
	}
	next, end := uint64(off), uint64(off+length)
	for next < end {
		b.hdr = fiemap{Start: next, Length: end - next, ExtentCount: sharingBatch}
		if err := fiemapInto(f, unsafe.Pointer(&b)); err != nil {
			return false, false, err
		}
		n := int(b.hdr.MappedExtents)
		if n == 0 {
			break
		}
		for _, e := range b.ext[:n] {
			if e.Flags&fiemapExtentShared != 0 {
				shared = true
			}
			if e.Flags&(fiemapExtentUnknown|fiemapExtentDelalloc|fiemapExtentUnwritten) == 0 {
				data = true
			}
		}
		last := b.ext[n-1]
		if last.Flags&ExtentLast != 0 || n < sharingBatch {
			break
		}
		next = last.Logical + last.Length
	}
	return data, shared, nil
}

// sameBatch is how many extents one FIEMAP call of SameBlocks returns: a
// range it is asked about is a few blocks of one chunk.
const sameBatch = 8

// SameBlocks reports whether every byte of [off, off+length) of f is
// written data (not a hole, a preallocation or a delayed allocation) at the
// same device address as the same byte of g, both as the filesystem stands
// in memory (no flush first): whether f and g share exactly these blocks.
// It answers false for a range spread over more extents than it looks at.
// Filesystems without FIEMAP give an error wrapping ErrNotSupported.
func SameBlocks(f, g *os.File, off, length int64) (bool, error) {
	a, err := dataMap(f, off, length)
	if err != nil || a == nil {
		return false, err
	}
	b, err := dataMap(g, off, length)
	if err != nil || b == nil {
		return false, err
	}
	// Both cover the range without a gap: compare the address of every
	// byte, one overlap of an extent of each at a time.
	for i, j, at := 0, 0, uint64(off); at < uint64(off+length); {
		x, y := a[i], b[j]
		if x.Physical+(at-x.Logical) != y.Physical+(at-y.Logical) {
			return false, nil
		}
		end := min(x.Logical+x.Length, y.Logical+y.Length)
		if x.Logical+x.Length == end {
			i++
		}
		if y.Logical+y.Length == end {
			j++
		}
		at = end
	}
	return true, nil
}

// dataMap returns the extents of [off, off+length) of f as it stands in
// memory, or nil when the range is not all written data in at most
// sameBatch extents.
func dataMap(f *os.File, off, length int64) ([]fiemapExtent, error) {
	var b struct {
		hdr fiemap
		ext [sameBatch]fiemapExtent
	}
	b.hdr = fiemap{Start: uint64(off), Length: uint64(length), ExtentCount: sameBatch}
	if err := fiemapInto(f, unsafe.Pointer(&b)); err != nil {
		return nil, err
	}
	n := int(b.hdr.MappedExtents)
	if n == 0 {
		return nil, nil
	}
	next := uint64(off)
	for _, e := range b.ext[:n] {
		if e.Flags&(fiemapExtentUnknown|fiemapExtentDelalloc|fiemapExtentEncoded|fiemapExtentUnwritten) != 0 {
			return nil, nil
		}
		if e.Logical > next { // a hole
			return nil, nil
		}
		next = max(next, e.Logical+e.Length)
	}
	if next < uint64(off+length) {
		return nil, nil
	}
	return b.ext[:n], nil
}

// Differences returns the ranges of [0, size) where f and g may hold
// different bytes, as their extent maps stand once their dirty data is
// written back (ExtentMap): everywhere except where both are holes, or both
// map written data at the very same device address (blocks a reflink
// shares). A preallocated or unknown extent of either counts as different.
// Ranges are sorted and merged. Filesystems without FIEMAP give an error
// wrapping ErrNotSupported.
func Differences(f, g *os.File, size int64) ([][2]int64, error) {
	return compareMaps(f, g, size, false)
}

// SharedBlocks returns the ranges of [0, size) where f and g both map
// written data at the very same device address (blocks a reflink shares),
// as their extent maps stand once their dirty data is written back:
// Differences' complement, less the holes of both.
func SharedBlocks(f, g *os.File, size int64) ([][2]int64, error) {
	return compareMaps(f, g, size, true)
}

// compareMaps returns the ranges where f and g differ (shared false) or
// share blocks (shared true).
func compareMaps(f, g *os.File, size int64, shared bool) ([][2]int64, error) {
	a, err := ExtentMap(f)
	if err != nil {
		return nil, err
	}
	b, err := ExtentMap(g)
	if err != nil {
		return nil, err
	}
	const uncertain = fiemapExtentUnknown | fiemapExtentDelalloc | fiemapExtentEncoded | fiemapExtentUnwritten
	// at returns the extent of es covering x (from index *i on), if any.
	at := func(es []Extent, i *int, x uint64) (Extent, bool, uint64) {
		for *i < len(es) && es[*i].Logical+es[*i].Length <= x {
			*i++
		}
		if *i < len(es) && es[*i].Logical <= x {
			return es[*i], true, es[*i].Logical + es[*i].Length
		}
		if *i < len(es) {
			return Extent{}, false, es[*i].Logical // a hole up to the next extent
		}
		return Extent{}, false, uint64(size)
	}
	var out [][2]int64
	add := func(lo, hi uint64) {
		if k := len(out) - 1; k >= 0 && uint64(out[k][0]+out[k][1]) == lo {
			out[k][1] += int64(hi - lo)
			return
		}
		out = append(out, [2]int64{int64(lo), int64(hi - lo)})
	}
	var i, j int
	for x := uint64(0); x < uint64(size); {
		ea, inA, endA := at(a, &i, x)
		eb, inB, endB := at(b, &j, x)
		end := min(endA, endB, uint64(size))
		if end <= x {
			break
		}
		holes := !inA && !inB
		both := inA && inB && (ea.Flags|eb.Flags)&uncertain == 0 &&
			ea.Physical+(x-ea.Logical) == eb.Physical+(x-eb.Logical)
		if shared && both || !shared && !holes && !both {
			add(x, end)
		}
		x = end
	}
	return out, nil
}

// fiemapInto runs FIEMAP on f into buf: a fiemap header followed by room
// for the extents its ExtentCount says.
func fiemapInto(f *os.File, buf unsafe.Pointer) error {
	err := withFD(f, func(fd int) error { return ioctlPtr(fd, fsIocFiemap, buf) })
	if isErrno(err, unix.EOPNOTSUPP, unix.ENOTTY) {
		err = notSupported(err)
	}
	if err != nil {
		return fmt.Errorf("extent map of %s: %w", f.Name(), err)
	}
	return nil
}
