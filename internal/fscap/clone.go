package fscap

import (
	"fmt"
	"os"

	"golang.org/x/sys/unix"
)

// Reflink makes dst share all of src's extents (ioctl FICLONE), so dst reads
// as a copy of src while using no new data blocks; later writes to either
// file are copied on write. dst must be open for writing and takes src's
// size. Both files must be on the same filesystem.
//
// It returns an error wrapping ErrNotSupported when the filesystem cannot
// share extents (EOPNOTSUPP, ENOTTY, EINVAL) or the files are on different
// filesystems (EXDEV); dst is then unchanged.
//
// Durability: none. The clone is durable once dst is fsynced.
func Reflink(dst, src *os.File) error {
	err := withFDs(dst, src, func(dfd, sfd int) error {
		return retryEINTR(func() error { return unix.IoctlFileClone(dfd, sfd) })
	})
	if isErrno(err, unix.EOPNOTSUPP, unix.EXDEV, unix.EINVAL, unix.ENOTTY) {
		err = notSupported(err)
	}
	if err != nil {
		return fmt.Errorf("reflink %s to %s: %w", src.Name(), dst.Name(), err)
	}
	return nil
}
