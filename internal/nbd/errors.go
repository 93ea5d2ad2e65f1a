package nbd

import (
	"errors"
	"syscall"

	"github.com/quiverstorage/quiver/internal/pool"
)

// Errors of the server itself.
var (
	ErrServerClosed = errors.New("nbd: server closed")
)

// errnoMapping maps domain errors to NBD error values; the first match wins.
// It is the only place where errors meet the NBD wire.
var errnoMapping = []struct {
	err   error
	errno uint32
}{
	{pool.ErrReadOnly, errPerm},
	{pool.ErrFenced, errPerm},
	{pool.ErrSyncFailed, errIO}, // whatever failed the sync: data may be lost, retrying cannot help
	{pool.ErrDiskRemoved, errIO},
	{pool.ErrOutOfRange, errInval},
	{pool.ErrInvalid, errInval},
	{pool.ErrNoSpace, errNoSpc},
	{syscall.ENOSPC, errNoSpc},
	{syscall.EDQUOT, errNoSpc},
	{syscall.EFBIG, errNoSpc},
	{pool.ErrNotSupported, errNotSup},
	{syscall.EOPNOTSUPP, errNotSup},
	{errShuttingDown, errShutdown},
	{syscall.ENOMEM, errNoMem},
}

// errShuttingDown answers requests that arrive while the server drains.
var errShuttingDown = errors.New("server is shutting down")

// toErrno maps any error to an NBD error value; unknown errors are EIO.
func toErrno(err error) uint32 {
	for _, m := range errnoMapping {
		if errors.Is(err, m.err) {
			return m.errno
		}
	}
	return errIO
}
