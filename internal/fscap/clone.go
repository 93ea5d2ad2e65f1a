package fscap

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"
)

// Methods Clone reports.
const (
	MethodReflink = "reflink"
	MethodCopy    = "copy"
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

// Clone creates dstPath (exclusively, mode 0600) as a copy of srcPath and
// returns the method it used: MethodReflink when caps.Reflink is set and
// FICLONE succeeds, otherwise MethodCopy through CopySparse. A reflink that
// turns out unsupported falls back to the copy.
//
// progress, when not nil, receives the bytes copied after each chunk and adds
// up to DataBytes of the source; a reflink reports that total in one call.
// src must not change during the clone.
//
// On any error, including a cancelled ctx (the error wraps ctx.Err()), Clone
// removes dstPath, unless the error is that dstPath already existed, in which
// case that file is left alone.
//
// Durability: when Clone returns nil, dstPath's content and size are fsynced
// and its directory has been fsynced, so the new file survives a crash.
func Clone(ctx context.Context, dstPath, srcPath string, caps Caps, progress func(n int64)) (method string, err error) {
	if err := ctx.Err(); err != nil {
		return "", fmt.Errorf("clone %s to %s: %w", srcPath, dstPath, err)
	}
	src, err := os.Open(srcPath)
	if err != nil {
		return "", fmt.Errorf("clone %s to %s: %w", srcPath, dstPath, err)
	}
	defer src.Close()

	dst, err := os.OpenFile(dstPath, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return "", fmt.Errorf("clone %s to %s: %w", srcPath, dstPath, err)
	}
	defer func() {
		if err != nil {
			dst.Close()
			os.Remove(dstPath)
		}
	}()

	method, err = cloneInto(ctx, dst, src, caps, progress)
	if err == nil {
		err = finish(dst)
	}
	if err != nil {
		return "", fmt.Errorf("clone %s to %s: %w", srcPath, dstPath, err)
	}
	return method, nil
}

// cloneInto fills the empty dst from src by reflink or copy.
func cloneInto(ctx context.Context, dst, src *os.File, caps Caps, progress func(n int64)) (string, error) {
	if caps.Reflink {
		err := Reflink(dst, src)
		if err == nil {
			if progress != nil {
				n, err := DataBytes(src)
				if err != nil {
					return "", err
				}
				progress(n)
			}
			return MethodReflink, nil
		}
		if !errors.Is(err, ErrNotSupported) {
			return "", err
		}
	}
	if err := CopySparse(ctx, dst, src, progress); err != nil {
		return "", err
	}
	return MethodCopy, nil
}

// finish makes dst's mode exactly 0600 whatever the umask, fsyncs it, closes
// it and fsyncs its directory.
func finish(dst *os.File) error {
	if err := dst.Chmod(0o600); err != nil {
		return err
	}
	if err := dst.Sync(); err != nil {
		return err
	}
	if err := dst.Close(); err != nil {
		return err
	}
	return syncDir(filepath.Dir(dst.Name()))
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}
