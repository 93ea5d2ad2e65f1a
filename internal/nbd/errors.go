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

// refusalMapping maps the error of an export's open (or list) to the option
// reply that refuses it; the first match wins, and anything else is
// NBD_REP_ERR_PLATFORM (the server could not serve it now). As in
// errnoMapping, the entry marked back is the one a quiver node forwarding
// to another turns the reply type back into (Refused.Unwrap).
var refusalMapping = []struct {
	err   error
	reply uint32
	back  bool
}{
	{pool.ErrInvalid, repErrInvalid, true},
	{pool.ErrUnauthorized, repErrPolicy, true},
	{pool.ErrVolumeNotFound, repErrUnknown, true},
	{pool.ErrDiskNotFound, repErrUnknown, false},
	{pool.ErrSnapshotNotFound, repErrUnknown, false},
}

// openErrorCode maps an export's open (or list) error to an option reply:
// a *Refused's own, else refusalMapping's.
func openErrorCode(err error) uint32 {
	var r *Refused
	if errors.As(err, &r) {
		return r.Reply
	}
	for _, m := range refusalMapping {
		if errors.Is(err, m.err) {
			return m.reply
		}
	}
	return repErrPlatform
}

// Refused is an export that another quiver NBD server refused: its error
// reply to NBD_OPT_GO, reply type (with the error bit) and message. A node
// that serves the export through that server (internal/forward: any node,
// through the volume's primary) returns it from Exports.Open, and this
// server answers the client the same reply, type and message, as it came:
// a refusal looks the same whichever node the client asked.
type Refused struct {
	Reply   uint32
	Message string
}

func (r *Refused) Error() string { return r.Message }

// Unwrap is the domain error the reply type stands for (the entry of
// refusalMapping marked back): pool.ErrInvalid, pool.ErrUnauthorized or
// pool.ErrVolumeNotFound, a refusal that stands whichever server is asked;
// nil for any other type (NBD_REP_ERR_PLATFORM, NBD_REP_ERR_SHUTDOWN: that
// server could not serve the export now).
func (r *Refused) Unwrap() error {
	for _, m := range refusalMapping {
		if m.back && m.reply == r.Reply {
			return m.err
		}
	}
	return nil
}

// refusalMessage is the message of an open's refusal: a *Refused's own, as
// it came, else the error's.
func refusalMessage(err error) string {
	var r *Refused
	if errors.As(err, &r) {
		return r.Message
	}
	return err.Error()
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
