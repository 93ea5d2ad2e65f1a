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

// ErrRefused: the primary refused the export at the handshake, and that
// stands whichever node is asked: the name, the disk or the token is
// wrong (nbd.Refused.Unwrap is a domain error). The error is also the
// *nbd.Refused with the primary's reply, which this node's NBD server
// answers its client as it came: the same refusal as the primary's, and
// as this node's own for a volume it does not know. Not tried again.
var ErrRefused = errors.New("the primary refused the export")

// errUnavailable: the primary's node could not serve the export now (not
// the primary any more, not ready yet, draining: NBD_REP_ERR_PLATFORM,
// NBD_REP_ERR_SHUTDOWN). Tried again.
var errUnavailable = errors.New("export not served now")

// forwardErr maps an nbdclient error to this package's: an NBD error
// value back to the domain error the serving node mapped to it (so this
// node's NBD server answers the same value), a refused export to
// ErrRefused or errUnavailable, anything else to errConnLost.
func forwardErr(err error) error {
	var errno nbdclient.Errno
	var refusal *nbdclient.Refusal
	switch {
	case err == nil:
		return nil
	case errors.As(err, &errno):
		return fromErrno(uint32(errno))
	case errors.As(err, &refusal):
		r := &nbd.Refused{Reply: refusal.Reply, Message: refusal.Message}
		if r.Unwrap() != nil {
			return fmt.Errorf("%w: %w", ErrRefused, r)
		}
		return fmt.Errorf("%w: %w", errUnavailable, err)
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
