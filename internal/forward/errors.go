package forward

import (
	"errors"
	"fmt"
	"syscall"

	"github.com/quiverstorage/quiver/internal/nbd"
	"github.com/quiverstorage/quiver/internal/nbdclient"
)

// errConnLost: the connection to the primary broke, or did not answer in
// time. The request is sent again on a new connection.
var errConnLost = errors.New("connection to the primary lost")

// errRefused: the primary's node refused the export at the handshake (not
// the primary any more, or not ready yet). Tried again.
var errRefused = errors.New("export refused")

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
// node mapped to it (nbd.DomainError). ESHUTDOWN, the primary draining,
// is errConnLost: the request goes to the next primary.
func fromErrno(errno uint32) error {
	if syscall.Errno(errno) == syscall.ESHUTDOWN {
		return errConnLost
	}
	if err := nbd.DomainError(errno); err != nil {
		return err
	}
	return fmt.Errorf("primary answered NBD error %d", errno)
}
