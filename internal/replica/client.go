package replica

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/quiverstorage/quiver/internal/nbdclient"
)

// conn is one NBD connection to a copy's export (nbdclient), its errors
// mapped to this package's: ErrCopyDown once it failed (every request,
// pending and later), ErrCopyRefused for an NBD error, ErrHandshake when
// the copy's server refused the export. A primary never reads from a copy.
type conn struct {
	c    *nbdclient.Conn
	size int64
}

// dial connects to addr and negotiates export; the handshake and each
// request are bounded by timeout (and the handshake by ctx).
func dial(ctx context.Context, addr, export string, timeout time.Duration) (*conn, error) {
	if addr == "" {
		return nil, fmt.Errorf("%w: its node is down (no NBD address in the cluster)", ErrCopyDown)
	}
	c, err := nbdclient.Dial(ctx, addr, export, nbdclient.Options{Timeout: timeout})
	if err != nil {
		return nil, fmt.Errorf("copy at %s: %w", addr, copyErr(err))
	}
	return &conn{c: c, size: c.Size()}, nil
}

// copyErr maps an nbdclient error to this package's.
func copyErr(err error) error {
	var errno nbdclient.Errno
	switch {
	case err == nil:
		return nil
	case errors.As(err, &errno):
		return fmt.Errorf("%w: %w", ErrCopyRefused, err)
	case errors.Is(err, nbdclient.ErrHandshake), errors.Is(err, nbdclient.ErrRefused):
		return fmt.Errorf("%w: %w", ErrHandshake, err)
	default:
		return fmt.Errorf("%w: %w", ErrCopyDown, err)
	}
}

func (c *conn) write(p []byte, off int64, fua bool) error { return copyErr(c.c.WriteAt(p, off, fua)) }

func (c *conn) flush() error { return copyErr(c.c.Flush()) }

func (c *conn) trim(off, length int64, fua bool) error { return copyErr(c.c.Trim(off, length, fua)) }

func (c *conn) zero(off, length int64, mayTrim, fua bool) error {
	return copyErr(c.c.Zero(off, length, mayTrim, false, fua))
}

// close sends NBD_CMD_DISC and closes the connection.
func (c *conn) close() { c.c.Close() }
