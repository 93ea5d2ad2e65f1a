package pool

import (
	"cmp"
	"slices"
	"sync"
)

// Dirty tracking lets a snapshot clone the disks while the VM keeps writing
// (see Volume.capture): while a capture tracks writes, every write, trim and
// zero through a live disk handle records the range it is about to change,
// and the capture later re-clones just those ranges with the I/O gate closed.

// dirtyGranule is the unit dirty ranges are rounded out to. FICLONERANGE
// needs ranges aligned to the filesystem block, and 64 KiB is a multiple of
// every block size XFS and btrfs allow; a coarse granule also merges nearby
// small writes into fewer ranges to re-clone.
const dirtyGranule = 64 << 10

// maxDirtyRanges bounds a dirty set. Re-cloning costs a few microseconds of
// ioctl per range on top of remapping its extents, so with this many
// separate ranges a whole-file clone is about as quick; past it the set
// overflows (stops recording) instead of growing without bound, and the
// disk is cloned whole. There is no bound on bytes: re-cloning a large range
// costs no more than the same part of a whole-file clone.
const maxDirtyRanges = 1 << 16

// compactBatch is how many unsorted ranges a dirty set collects at least
// before it sorts and merges them.
const compactBatch = 1024

// span is the byte range [off, end) of a disk.
type span struct{ off, end int64 }

// dirtySet is the set of byte ranges of one disk written since it was made,
// rounded out to whole granules. It is safe for concurrent use. Ranges are
// appended as they come and sorted and merged in batches, so adding costs
// amortized O(log n) and memory stays within a few times maxDirtyRanges.
type dirtySet struct {
	mu       sync.Mutex
	spans    []span // spans[:merged] sorted, disjoint and not adjacent; the rest as added
	merged   int
	overflow bool // more than maxDirtyRanges ranges: spans dropped, the whole disk is dirty
}

// add records [off, off+length); off must not be negative.
func (s *dirtySet) add(off, length int64) {
	if length <= 0 {
		return
	}
	sp := span{off &^ (dirtyGranule - 1), roundUp(off+length, dirtyGranule)}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.overflow {
		return
	}
	s.spans = append(s.spans, sp)
	if len(s.spans)-s.merged >= max(s.merged, compactBatch) {
		s.compact()
	}
}

// compact (mu held) sorts and merges the ranges, and overflows the set when
// too many remain.
func (s *dirtySet) compact() {
	slices.SortFunc(s.spans, func(a, b span) int { return cmp.Compare(a.off, b.off) })
	out := s.spans[:0]
	for _, sp := range s.spans {
		if n := len(out); n > 0 && sp.off <= out[n-1].end {
			out[n-1].end = max(out[n-1].end, sp.end)
			continue
		}
		out = append(out, sp)
	}
	s.spans, s.merged = out, len(out)
	if len(out) > maxDirtyRanges {
		s.spans, s.merged, s.overflow = nil, 0, true
	}
}

// ranges returns the recorded ranges sorted, merged and clipped to a disk of
// size bytes, or ok false when the set overflowed.
func (s *dirtySet) ranges(size int64) (spans []span, ok bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.overflow {
		s.compact()
	}
	if s.overflow {
		return nil, false
	}
	out := make([]span, 0, len(s.spans))
	for _, sp := range s.spans {
		if sp.off >= size {
			break
		}
		out = append(out, span{sp.off, min(sp.end, size)})
	}
	return out, true
}

// count returns how many separate ranges the set holds, or more than
// maxDirtyRanges when it overflowed.
func (s *dirtySet) count() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.overflow {
		s.compact()
	}
	if s.overflow {
		return maxDirtyRanges + 1
	}
	return len(s.spans)
}

// dirtyTracker holds a dirty set per disk of a volume while a capture
// tracks writes. Its map does not change once the tracker is published.
type dirtyTracker struct {
	disks map[string]*dirtySet
}

func newDirtyTracker(disks []DiskSpec) *dirtyTracker {
	t := &dirtyTracker{disks: make(map[string]*dirtySet, len(disks))}
	for _, d := range disks {
		t.disks[d.Name] = &dirtySet{}
	}
	return t
}

// count returns how many separate ranges the sets hold in all.
func (t *dirtyTracker) count() int {
	n := 0
	for _, s := range t.disks {
		n += s.count()
	}
	return n
}

// markDirty records that [off, off+length) of disk is about to change, when
// a capture tracks writes. The caller holds the gate shared and calls it
// before changing the file, so even a write that fails half-way is recorded.
// When no capture tracks writes it costs one atomic load.
func (v *Volume) markDirty(disk string, off, length int64) {
	if t := v.dirty.Load(); t != nil {
		if s := t.disks[disk]; s != nil {
			s.add(off, length)
		}
	}
}

func roundUp(x, unit int64) int64 { return (x + unit - 1) / unit * unit }
