package fscap

import "errors"

var (
	// ErrNotSupported means the filesystem (or kernel) does not offer the
	// operation: FICLONE on ext4, an extent size hint outside XFS, FIEMAP on
	// tmpfs. Callers fall back to a slower method; it is never a data error.
	ErrNotSupported = errors.New("not supported by the filesystem")

	// ErrHasData means an extent size hint was set on a file that already
	// has blocks allocated; XFS only accepts the hint while the file is empty.
	ErrHasData = errors.New("file already has allocated blocks")
)
