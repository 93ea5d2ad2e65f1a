package forward

import (
	"errors"
	"fmt"
	"syscall"

	"github.com/quiverstorage/quiver/internal/nbdclient"
	"github.com/quiverstorage/quiver/internal/pool"
)

// errConnLost: the connection to the primary broke, or did not answer in
// time. The request is sent again on a new connection.
var errConnLost = errors.New("connection to the primary lost")

// errRefused: the primary's node refused the export at the handshake (not
// the primary any more, or not ready yet). Tried again.
var errRefused = errors.New("export refused")

// NBD error values ("Error values") that the serving node maps domain
// errors to.
const (
	errPerm     = 1
	errNoMem    = 12
	errInval    = 22
	errNoSpc    = 28
	errNotSup   = 95
	errShutdown = 108
)

// forwardErr maps an nbdclient error to this package's: an NBD error
// value back to the domain error the serving node mapped to it (so this
// node's NBD server answers the same value), a refused export to
// errRefused, anything else to errConnLost.
func forwardErr(err error) error {
	var errno nbdclient.Errno
	switch {
	case err == nil:
		return nil
	case errors.As(err, &errno):
		return fromErrno(uint32(errno))
	case errors.Is(err, nbdclient.ErrRefused):
		return fmt.Errorf("%w: %w", errRefused, err)
	default:
		return fmt.Errorf("%w: %w", errConnLost, err)
	}
}

// fromErrno maps an NBD error value back to the domain error the serving
// node mapped to it.
func fromErrno(errno uint32) error {
	switch errno {
	case errPerm:
		return pool.ErrFenced
	case errInval:
		return pool.ErrInvalid
	case errNoSpc:
		return pool.ErrNoSpace
	case errNotSup:
		return pool.ErrNotSupported
	case errNoMem:
		return syscall.ENOMEM
	case errShutdown:
		return errConnLost // the primary is shutting down: go to the next
	}
	return fmt.Errorf("primary answered NBD error %d", errno)
}
