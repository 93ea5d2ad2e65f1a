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
	err := withFD(f, func(fd int) error { return ioctlPtr(fd, fsIocFiemap, unsafe.Pointer(&fm)) })
	if isErrno(err, unix.EOPNOTSUPP, unix.ENOTTY) {
		err = notSupported(err)
	}
	if err != nil {
		return 0, fmt.Errorf("extents of %s: %w", f.Name(), err)
	}
	return int(fm.MappedExtents), nil
}
