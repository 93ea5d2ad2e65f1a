package fscap

import (
	"fmt"
	"os"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// SetExtentSizeHint asks XFS to allocate f in extents of the given size
// (FS_IOC_FSSETXATTR with FS_XFLAG_EXTSIZE), which keeps a large disk file
// that is written randomly from fragmenting. bytes must be a multiple of the
// filesystem block size; 0 clears the hint.
//
// XFS only accepts the hint while f has no blocks allocated, so set it right
// after creating the file (truncating it to its size first is fine). A file
// with blocks gives an error wrapping ErrHasData. Other filesystems give an
// error wrapping ErrNotSupported.
//
// Durability: the hint is inode metadata; it is durable once f is fsynced.
func SetExtentSizeHint(f *os.File, bytes uint32) error {
	if err := setExtentSizeHint(f, bytes); err != nil {
		return fmt.Errorf("set extent size hint of %s to %d: %w", f.Name(), bytes, err)
	}
	return nil
}

func setExtentSizeHint(f *os.File, bytes uint32) error {
	fs, err := fstatfsName(f)
	if err != nil {
		return err
	}
	attr, err := getFsxattr(f)
	if err != nil {
		if fs != "xfs" || isErrno(err, unix.ENOTTY, unix.EOPNOTSUPP) {
			return notSupported(err)
		}
		return err
	}
	if fs == "xfs" {
		// Checked here because XFS's own answer would be a bare EINVAL.
		fi, err := f.Stat()
		if err != nil {
			return err
		}
		if st, ok := fi.Sys().(*syscall.Stat_t); (ok && st.Blocks > 0) || attr.Nextents > 0 {
			return ErrHasData
		}
	}
	if bytes == 0 {
		attr.Xflags &^= fsXflagExtsize
	} else {
		attr.Xflags |= fsXflagExtsize
	}
	attr.Extsize = bytes
	return setFsxattr(f, fs, attr, func(got fsxattr) error {
		if got.Extsize != bytes || (got.Xflags&fsXflagExtsize != 0) != (bytes != 0) {
			return fmt.Errorf("%s kept flags %#x, extent size %d", fs, got.Xflags, got.Extsize)
		}
		return nil
	})
}

// setFsxattr sets attr on f (FS_IOC_FSSETXATTR) and reads it back: kept
// says what the filesystem did not keep. ext4 and btrfs know the ioctl but
// not XFS's flags, and ext4 takes the call and silently drops them, so only
// what reads back is believed; on XFS an EINVAL is a real answer about the
// values or the file, so it stays as is.
func setFsxattr(f *os.File, fs string, attr fsxattr, kept func(got fsxattr) error) error {
	err := withFD(f, func(fd int) error { return ioctlPtr(fd, fsIocFsSetXattr, unsafe.Pointer(&attr)) })
	if err != nil && (fs != "xfs" || isErrno(err, unix.ENOTTY, unix.EOPNOTSUPP)) {
		return notSupported(err)
	}
	if err != nil {
		return err
	}
	got, err := getFsxattr(f)
	if err != nil {
		return err
	}
	if err := kept(got); err != nil {
		return notSupported(err)
	}
	return nil
}

// getFsxattr reads f's extended attributes (FS_IOC_FSGETXATTR).
func getFsxattr(f *os.File) (fsxattr, error) {
	var attr fsxattr
	err := withFD(f, func(fd int) error { return ioctlPtr(fd, fsIocFsGetXattr, unsafe.Pointer(&attr)) })
	return attr, err
}

// SetCowExtentSize sets XFS's copy-on-write extent size hint of f
// (FS_IOC_FSSETXATTR with FS_XFLAG_COWEXTSIZE): how much XFS reserves in
// f's copy-on-write fork around a write into a shared block. XFS takes the
// larger of it and the extent size hint, and 128 KiB when neither is set.
// Unlike the extent size hint it can be set on a file that has blocks.
// Other filesystems give an error wrapping ErrNotSupported.
//
// Durability: inode metadata, durable once f is fsynced.
func SetCowExtentSize(f *os.File, bytes uint32) error {
	if err := setCowExtentSize(f, bytes); err != nil {
		return fmt.Errorf("set copy-on-write extent size of %s to %d: %w", f.Name(), bytes, err)
	}
	return nil
}

func setCowExtentSize(f *os.File, bytes uint32) error {
	fs, err := fstatfsName(f)
	if err != nil {
		return err
	}
	if fs != "xfs" {
		return notSupported(fmt.Errorf("%s has no copy-on-write extent size", fs))
	}
	attr, err := getFsxattr(f)
	if err != nil {
		if isErrno(err, unix.ENOTTY, unix.EOPNOTSUPP) {
			return notSupported(err)
		}
		return err
	}
	if bytes == 0 {
		attr.Xflags &^= fsXflagCowExtsize
	} else {
		attr.Xflags |= fsXflagCowExtsize
	}
	attr.Cowextsize = bytes
	return setFsxattr(f, fs, attr, func(got fsxattr) error {
		if got.Cowextsize != bytes || (got.Xflags&fsXflagCowExtsize != 0) != (bytes != 0) {
			return fmt.Errorf("%s kept flags %#x, copy-on-write extent size %d", fs, got.Xflags, got.Cowextsize)
		}
		return nil
	})
}

// CowExtentSize returns the copy-on-write extent size XFS uses for f: the
// larger of its copy-on-write extent size hint and its extent size hint, or
// 0 when neither is set (XFS's default then, 32 blocks). Other filesystems
// give an error wrapping ErrNotSupported.
func CowExtentSize(f *os.File) (uint32, error) {
	fs, err := fstatfsName(f)
	if err != nil {
		return 0, err
	}
	if fs != "xfs" {
		return 0, notSupported(fmt.Errorf("%s has no copy-on-write extent size", fs))
	}
	attr, err := getFsxattr(f)
	if err != nil {
		return 0, err
	}
	var n uint32
	if attr.Xflags&fsXflagCowExtsize != 0 {
		n = attr.Cowextsize
	}
	if attr.Xflags&fsXflagExtsize != 0 {
		n = max(n, attr.Extsize)
	}
	return n, nil
}
