package fscap

import (
	"fmt"
	"os"

	"golang.org/x/sys/unix"
)

// ReflinkRange makes [off, off+length) of dst share the extents of the same
// range of src (ioctl FICLONERANGE), replacing what dst held there: data of
// src becomes shared data of dst, and a hole in src becomes a hole in dst.
// Length 0 means up to src's end of file. dst must be open for writing and
// grows when the range ends past its end; both files must be on the same
// filesystem.
//
// off, and off+length unless the range ends at src's end of file, must be
// multiples of the filesystem block size. The kernel answers a misaligned
// range with EINVAL, the same errno some filesystems give for not cloning at
// all, so both return an error wrapping ErrNotSupported, like EOPNOTSUPP,
// ENOTTY and EXDEV; callers fall back to a whole-file method either way.
// The range of dst is then unchanged.
//
// While the kernel remaps the range, it holds both files' inode locks, so
// writes to src wait; cloning a large, fragmented file in pieces bounds that
// wait.
//
// Durability: none. The clone is durable once dst is fsynced.
func ReflinkRange(dst, src *os.File, off, length int64) error {
	if off < 0 || length < 0 {
		return fmt.Errorf("reflink [%d, +%d) of %s to %s: negative offset or length", off, length, src.Name(), dst.Name())
	}
	err := withFDs(dst, src, func(dfd, sfd int) error {
		arg := unix.FileCloneRange{
			Src_fd:      int64(sfd),
			Src_offset:  uint64(off),
			Src_length:  uint64(length),
			Dest_offset: uint64(off),
		}
		return retryEINTR(func() error { return unix.IoctlFileCloneRange(dfd, &arg) })
	})
	if isErrno(err, unix.EOPNOTSUPP, unix.EXDEV, unix.EINVAL, unix.ENOTTY) {
		err = notSupported(err)
	}
	if err != nil {
		return fmt.Errorf("reflink [%d, +%d) of %s to %s: %w", off, length, src.Name(), dst.Name(), err)
	}
	return nil
}
