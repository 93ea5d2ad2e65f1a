package storage

import (
	"errors"
	"fmt"

	"golang.org/x/sys/unix"
)

// Sender is implemented by files of the operating system: a range of the
// file can go from the page cache straight to a socket with sendfile(2),
// without a copy into and out of the server's memory. Over loopback TCP and
// unix sockets the kernel hands the page-cache pages themselves to the
// socket, and the receiver copies from them.
//
// The pages are shared, not copied: a write to the range that completes
// after TrySendTo returns but before the peer has read the data may show in
// what the peer reads, as with any read that overlaps a write in flight.
type Sender interface {
	// TrySendTo sends head and then the n bytes of the file at off to the
	// connected stream socket sock (a blocking one), all of it, when every
	// page of the range is in the page cache. When one is not, or the
	// kernel cannot tell (cachestat(2), Linux 6.5), it fails with
	// ErrWouldBlock or ErrNotSupported having sent nothing. It returns the
	// bytes sent, head included: once that is not zero the stream holds
	// part of a message, and a failure leaves it broken. It allocates
	// nothing.
	TrySendTo(sock int, head []byte, off int64, n int) (int, error)
}

var _ Sender = (*osFile)(nil)

// errShortSend: sendfile(2) stopped before the end of the range, which only
// happens when the file is shorter than the range.
var errShortSend = errors.New("sendfile: the file ended before the range")

func (o *osFile) TrySendTo(sock int, head []byte, off int64, n int) (int, error) {
	if n <= 0 || off < 0 {
		return 0, fmt.Errorf("sendfile of [%d, +%d): not a range", off, n)
	}
	cached, err := cachedRange(int(o.fd), off, n)
	switch {
	case errors.Is(err, unix.ENOSYS):
		return 0, errTryUnsupported
	case err != nil:
		return 0, Classify(err)
	case !cached:
		return 0, errTryAgain
	}
	sent := 0
	for len(head) > 0 {
		// MSG_MORE: the data follows at once, in the same segments.
		m, err := unix.SendmsgN(sock, head, nil, nil, unix.MSG_MORE|unix.MSG_NOSIGNAL)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return sent, &SendError{Err: err}
		}
		sent += m
		head = head[m:]
	}
	for done := 0; done < n; {
		m, err := unix.Sendfile(sock, int(o.fd), &off, n-done) // advances off
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return sent, &SendError{Err: err}
		}
		if m == 0 {
			return sent, errShortSend
		}
		sent += m
		done += m
	}
	return sent, nil
}

// SendError is a failure of the socket side of TrySendTo (the peer went
// away, SO_SNDTIMEO expired): not a fault of the file.
type SendError struct{ Err error }

func (e *SendError) Error() string { return "sendfile to socket: " + e.Err.Error() }
func (e *SendError) Unwrap() error { return e.Err }

// cachedRange reports whether every page of [off, off+n) of fd is in the
// page cache (cachestat(2)). Pages beyond the end of the file are not.
func cachedRange(fd int, off int64, n int) (bool, error) {
	const page = 4096
	first := off &^ (page - 1)
	pages := (off + int64(n) - first + page - 1) / page
	r := unix.CachestatRange{Off: uint64(first), Len: uint64(pages * page)}
	var st unix.Cachestat_t
	if err := unix.Cachestat(uint(fd), &r, &st, 0); err != nil {
		return false, err
	}
	return st.Cache >= uint64(pages), nil
}
