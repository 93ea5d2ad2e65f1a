package fscap

import (
	"errors"
	"fmt"
	"os"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Ioctl numbers that golang.org/x/sys/unix does not define. They use the
// asm-generic encoding (dir<<30 | size<<16 | type<<8 | nr) of amd64, arm64,
// riscv64 and loong64; on an architecture with another encoding the kernel
// answers ENOTTY, which surfaces as ErrNotSupported rather than as a wrong
// operation.
const (
	iocWrite = 1
	iocRead  = 2

	// FS_IOC_FSGETXATTR = _IOR('X', 31, struct fsxattr)
	fsIocFsGetXattr = iocRead<<30 | uintptr(unsafe.Sizeof(fsxattr{}))<<16 | 'X'<<8 | 31
	// FS_IOC_FSSETXATTR = _IOW('X', 32, struct fsxattr)
	fsIocFsSetXattr = iocWrite<<30 | uintptr(unsafe.Sizeof(fsxattr{}))<<16 | 'X'<<8 | 32
	// FS_IOC_FIEMAP = _IOWR('f', 11, struct fiemap)
	fsIocFiemap = (iocRead|iocWrite)<<30 | uintptr(unsafe.Sizeof(fiemap{}))<<16 | 'f'<<8 | 11

	fsXflagExtsize    = 0x00000800 // FS_XFLAG_EXTSIZE
	fsXflagCowExtsize = 0x00010000 // FS_XFLAG_COWEXTSIZE
	fiemapFlagSync    = 0x00000001 // FIEMAP_FLAG_SYNC
)

// fsxattr mirrors struct fsxattr from <linux/fs.h> (28 bytes).
type fsxattr struct {
	Xflags     uint32
	Extsize    uint32
	Nextents   uint32
	Projid     uint32
	Cowextsize uint32
	Pad        [8]byte
}

// fiemap mirrors the header of struct fiemap from <linux/fiemap.h> (32
// bytes). With ExtentCount 0 the kernel only counts extents into
// MappedExtents, so no extent array follows.
type fiemap struct {
	Start         uint64
	Length        uint64
	Flags         uint32
	MappedExtents uint32
	ExtentCount   uint32
	Reserved      uint32
}

// withFD runs fn with f's descriptor, keeping f open for the duration.
func withFD(f *os.File, fn func(fd int) error) error {
	rc, err := f.SyscallConn()
	if err != nil {
		return err
	}
	var opErr error
	if err := rc.Control(func(fd uintptr) { opErr = fn(int(fd)) }); err != nil {
		return err
	}
	return opErr
}

// withFDs runs fn with the descriptors of a and b.
func withFDs(a, b *os.File, fn func(fda, fdb int) error) error {
	return withFD(a, func(fda int) error {
		return withFD(b, func(fdb int) error { return fn(fda, fdb) })
	})
}

// ioctlPtr issues an ioctl whose argument is a pointer to a struct that the
// kernel reads, writes or both; it retries on EINTR.
func ioctlPtr(fd int, req uintptr, arg unsafe.Pointer) error {
	for {
		_, _, e := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), req, uintptr(arg))
		switch e {
		case 0:
			return nil
		case unix.EINTR:
			continue
		default:
			return e
		}
	}
}

// isErrno reports whether err is one of the given errnos.
func isErrno(err error, errnos ...unix.Errno) bool {
	var e unix.Errno
	if !errors.As(err, &e) {
		return false
	}
	for _, want := range errnos {
		if e == want {
			return true
		}
	}
	return false
}

// notSupported wraps cause (usually the kernel's errno) so that
// errors.Is(err, ErrNotSupported) holds and the cause stays in the message.
func notSupported(cause error) error {
	return fmt.Errorf("%w: %w", ErrNotSupported, cause)
}

// filesystemName names a statfs magic number.
func filesystemName(magic int64) string {
	switch uint32(magic) {
	case unix.XFS_SUPER_MAGIC:
		return "xfs"
	case unix.BTRFS_SUPER_MAGIC:
		return "btrfs"
	case unix.EXT4_SUPER_MAGIC:
		return "ext4"
	case unix.TMPFS_MAGIC:
		return "tmpfs"
	case unix.NFS_SUPER_MAGIC:
		return "nfs"
	default:
		return fmt.Sprintf("unknown(0x%x)", uint32(magic))
	}
}

// fstatfsName names the filesystem holding f.
func fstatfsName(f *os.File) (string, error) {
	var st unix.Statfs_t
	err := withFD(f, func(fd int) error {
		return retryEINTR(func() error { return unix.Fstatfs(fd, &st) })
	})
	if err != nil {
		return "", err
	}
	return filesystemName(int64(st.Type)), nil
}

// statfsName names the filesystem holding the file or directory at path.
func statfsName(path string) (string, error) {
	var st unix.Statfs_t
	if err := retryEINTR(func() error { return unix.Statfs(path, &st) }); err != nil {
		return "", err
	}
	return filesystemName(int64(st.Type)), nil
}

func retryEINTR(fn func() error) error {
	for {
		if err := fn(); err != unix.EINTR {
			return err
		}
	}
}
