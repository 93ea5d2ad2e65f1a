package storage

import (
	"errors"
	"io/fs"

	"golang.org/x/sys/unix"

	"github.com/quiverstorage/quiver/internal/beneath"
	"github.com/quiverstorage/quiver/internal/fscap"
)

// Sentinels, tested with errors.Is. Every error of this package that comes
// from the kernel is classified into one of the first four where it fits,
// and still wraps the errno.
var (
	// ErrNoSpace: the filesystem is full or a quota is reached (ENOSPC,
	// EDQUOT, EFBIG).
	ErrNoSpace = errors.New("no space left in pool")
	// ErrIO: the storage failed (EIO).
	ErrIO = errors.New("input/output error")
	// ErrReadOnly: the filesystem cannot be written (EROFS).
	ErrReadOnly = errors.New("read-only")
	// ErrNotSupported: the filesystem or kernel does not offer the
	// operation (EOPNOTSUPP, ENOTTY, EXDEV, EINVAL for an ioctl, ENOSYS).
	// Callers fall back to a slower method.
	ErrNotSupported = fscap.ErrNotSupported
	// ErrWouldBlock: a Try read or write was not done because it would
	// have had to wait (EAGAIN with RWF_NOWAIT), or was only partly done.
	ErrWouldBlock = errors.New("request would block")
	// ErrLocked: File.Lock found the lock held by another open file.
	ErrLocked = errors.New("locked by another process")
	// ErrEscape, ErrNotRegular and ErrHardLink refuse what leads outside
	// the root (package beneath).
	ErrEscape     = beneath.ErrEscape
	ErrNotRegular = beneath.ErrNotRegular
	ErrHardLink   = beneath.ErrHardLink
	// ErrNoData is SeekData's answer when no data follows the offset
	// (ENXIO).
	ErrNoData = errors.New("no data after offset")
)

// Error is an error of the storage with its class: Error() is the cause's
// message, and errors.Is matches both the class and the cause.
type Error struct {
	Kind error // one of the sentinels
	Err  error // the cause, usually wrapping an errno
}

func (e *Error) Error() string   { return e.Err.Error() }
func (e *Error) Unwrap() []error { return []error{e.Kind, e.Err} }

// Classify returns err with its class (ErrNoSpace, ErrIO, ErrReadOnly,
// ErrNotSupported) when the errno it wraps has one; nil stays nil, and an
// error already classified or of no class is returned as it is.
func Classify(err error) error {
	if err == nil {
		return nil
	}
	var se *Error
	if errors.As(err, &se) {
		return err
	}
	if kind := kindOf(err); kind != nil {
		return &Error{Kind: kind, Err: err}
	}
	return err
}

func kindOf(err error) error {
	var errno unix.Errno
	if !errors.As(err, &errno) {
		return nil
	}
	switch errno {
	case unix.ENOSPC, unix.EDQUOT, unix.EFBIG:
		return ErrNoSpace
	case unix.EIO:
		return ErrIO
	case unix.EROFS:
		return ErrReadOnly
	case unix.EOPNOTSUPP, unix.ENOTTY, unix.ENOSYS:
		return ErrNotSupported
	}
	return nil
}

// notSupported classifies err as ErrNotSupported whatever its errno (EXDEV
// and EINVAL mean "not supported" for the clone and copy calls only).
func notSupported(err error) error {
	if errors.Is(err, ErrNotSupported) {
		return err
	}
	return &Error{Kind: ErrNotSupported, Err: err}
}

// IsNotExist reports a missing file.
func IsNotExist(err error) bool { return errors.Is(err, fs.ErrNotExist) }
