package fscap

import (
	"os"

	"golang.org/x/sys/unix"
)

// copyFileRange copies up to n bytes at off from src to dst with one
// copy_file_range call, leaving both file offsets alone.
func copyFileRange(dst, src *os.File, off, n int64) (int64, error) {
	var done int
	err := withFDs(dst, src, func(dfd, sfd int) error {
		return retryEINTR(func() error {
			roff, woff := off, off
			var err error
			done, err = unix.CopyFileRange(sfd, &roff, dfd, &woff, int(n), 0)
			return err
		})
	})
	return int64(done), err
}

// seekDataHole returns the first data at or after off and the first hole
// after that (SEEK_DATA, SEEK_HOLE).
func seekDataHole(f *os.File, off int64) (data, hole int64, err error) {
	err = withFD(f, func(fd int) error {
		return retryEINTR(func() error {
			var err error
			if data, err = unix.Seek(fd, off, unix.SEEK_DATA); err != nil {
				return err
			}
			hole, err = unix.Seek(fd, data, unix.SEEK_HOLE)
			return err
		})
	})
	return data, hole, err
}
