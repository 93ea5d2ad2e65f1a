package nbd

import (
	"errors"
	"syscall"
	"time"

	"golang.org/x/time/rate"

	"github.com/quiverstorage/quiver/internal/pool"
)

// Errors of the server itself.
var (
	ErrServerClosed = errors.New("nbd: server closed")
	// ErrAbandon, from a disk, says that the request must not be answered
	// at all: the server closes the connection instead, and the client
	// sends the request again on its next connection (QEMU's
	// reconnect-delay). A cluster primary that may have lost its term
	// (docs/cluster.md, "Lease fencing") neither acknowledges nor fails.
	ErrAbandon = errors.New("nbd: request abandoned, the connection closes")
)

// errnoMapping maps domain errors to NBD error values; the first match wins.
// It is the only place where errors meet the NBD wire, both ways: where
// several errors share a value, the entry marked back is the one a quiver
// node forwarding to another (internal/forward) turns the value back into
// (DomainError), so that its own NBD server answers the same value.
var errnoMapping = []struct {
	err   error
	errno uint32
	back  bool
}{
	{pool.ErrReadOnly, errPerm, false},
	{pool.ErrFenced, errPerm, true},
	{pool.ErrSyncFailed, errIO, false}, // whatever failed the sync: data may be lost, retrying cannot help
	{pool.ErrDiskRemoved, errIO, false},
	{pool.ErrOutOfRange, errInval, false},
	{pool.ErrInvalid, errInval, true},
	{pool.ErrNoSpace, errNoSpc, true}, // the storage layer's class: ENOSPC, EDQUOT, EFBIG
	{pool.ErrNotSupported, errNotSup, true},
	{errShuttingDown, errShutdown, false}, // a forwarding node tries the next primary instead
	{syscall.ENOMEM, errNoMem, true},
}

// DomainError is the domain error that a quiver NBD server answers errno
// for (the entry of errnoMapping marked back), or nil for a value without
// one: EIO (any failure of the disk), ESHUTDOWN, and values quiver does
// not send.
func DomainError(errno uint32) error {
	for _, m := range errnoMapping {
		if m.back && m.errno == errno {
			return m.err
		}
	}
	return nil
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

// failed answers a request that failed with err. Failures of the disk (EIO,
// ENOSPC) are what an operator must see: they are logged at warn, paced by
// the server's failureLog (a failing disk fails every request), and counted
// (Observer.DataError). Everything else is the client's doing (EINVAL,
// EPERM of a fenced writer, ...) and logged at debug.
func (c *conn) failed(req *request, err error) {
	if errors.Is(err, ErrAbandon) {
		c.log.Info("request abandoned: closing the connection without an answer", "export", c.export,
			"op", req.typ, "offset", req.off, "len", req.length, "err", err)
		c.wmu.Lock()
		c.broken.Store(true)
		_ = c.nc.Close()
		c.wmu.Unlock()
		return
	}
	errno := toErrno(err)
	gone := errors.Is(err, pool.ErrClosed) || errors.Is(err, pool.ErrDiskNotFound) || errors.Is(err, pool.ErrVolumeNotFound)
	switch {
	case (errno == errIO || errno == errNoSpc) && !gone:
		name := "EIO"
		if errno == errNoSpc {
			name = "ENOSPC"
		}
		if o := c.srv.cfg.Observer; o != nil {
			o.DataError(name)
		}
		if c.srv.failureLog.Allow() {
			c.log.Warn("request failed on the disk", "export", c.export, "op", req.typ, "offset", req.off,
				"len", req.length, "errno", name, "err", err)
		}
	default:
		c.log.Debug("request failed", "op", req.typ, "offset", req.off, "len", req.length, "err", err)
	}
	c.replyError(req, errno, err.Error())
}

// newFailureLog paces the warnings of failed requests: ten at once, then
// one a second.
func newFailureLog() *rate.Limiter { return rate.NewLimiter(rate.Every(time.Second), 10) }
