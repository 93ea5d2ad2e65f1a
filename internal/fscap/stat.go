package fscap

import (
	"fmt"
	"os"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Allocated returns the bytes of storage path occupies (st_blocks * 512),
// which for a sparse file is less than its size. Extents shared by a reflink
// count in full for every file that shares them.
func Allocated(path string) (int64, error) {
	var st unix.Stat_t
	if err := retryEINTR(func() error { return unix.Stat(path, &st) }); err != nil {
		return 0, fmt.Errorf("allocated bytes of %s: %w", path, err)
	}
	return st.Blocks * 512, nil
}

// Usage returns the size of the filesystem holding dir and the bytes still
// available to unprivileged users (statfs f_bavail), the figure capacity
// checks should use.
func Usage(dir string) (total, free int64, err error) {
	var st unix.Statfs_t
	if err := retryEINTR(func() error { return unix.Statfs(dir, &st) }); err != nil {
		return 0, 0, fmt.Errorf("usage of %s: %w", dir, err)
	}
	unit := int64(st.Frsize)
	if unit == 0 {
		unit = int64(st.Bsize)
	}
	return int64(st.Blocks) * unit, int64(st.Bavail) * unit, nil
}

// Extents returns how many extents hold f's data according to FIEMAP, after
// flushing f's dirty data so delayed allocations are counted. It is meant
// for tests and benchmarks that check fragmentation. Filesystems without
// FIEMAP (tmpfs, NFS) give an error wrapping ErrNotSupported.
func Extents(f *os.File) (int, error) {
	fm := fiemap{Length: ^uint64(0), Flags: fiemapFlagSync}
	if err := fiemapInto(f, unsafe.Pointer(&fm)); err != nil {
		return 0, err
	}
	return int(fm.MappedExtents), nil
}

// Extent is one extent of a file's data, as FIEMAP reports it.
type Extent struct {
	Logical, Physical, Length uint64
	Flags                     uint32
}

// Flags of an Extent (<linux/fiemap.h>).
const (
	ExtentLast    = 0x00000001 // FIEMAP_EXTENT_LAST
	ExtentUnknown = fiemapExtentUnknown
	ExtentShared  = fiemapExtentShared // shared with another file (reflink)
)

// extentBatch is how many extents one FIEMAP call returns at most.
const extentBatch = 256

// ExtentMap returns every extent of f's data in file order, after flushing
// f's dirty data so delayed allocations have addresses. Filesystems without
// FIEMAP (tmpfs, NFS) give an error wrapping ErrNotSupported.
func ExtentMap(f *os.File) ([]Extent, error) {
	type request struct {
		hdr fiemap
		ext [extentBatch]fiemapExtent
	}
	var out []Extent
	var start uint64
	for {
		req := &request{hdr: fiemap{Start: start, Length: ^uint64(0) - start, Flags: fiemapFlagSync, ExtentCount: extentBatch}}
		if err := fiemapInto(f, unsafe.Pointer(req)); err != nil {
			return nil, err
		}
		n := int(req.hdr.MappedExtents)
		for _, e := range req.ext[:n] {
			out = append(out, Extent{Logical: e.Logical, Physical: e.Physical, Length: e.Length, Flags: e.Flags})
		}
		if n == 0 || req.ext[n-1].Flags&ExtentLast != 0 {
			return out, nil
		}
		last := req.ext[n-1]
		start = last.Logical + last.Length
	}
}
