package connlimit

import (
	"errors"
	"net"
	"sync"
	"syscall"
	"time"
)

// Reasons a connection is refused, the label values of the rejection metrics.
const (
	ReasonTotal = "total" // the server holds its maximum number of connections
	ReasonPeer  = "peer"  // the peer holds its maximum number of connections
	ReasonFDs   = "fds"   // accept failed for want of file descriptors (EMFILE, ENFILE)
)

// Limiter counts connections in total and per peer. The zero value is not
// usable; New makes one. It is safe for concurrent use.
type Limiter struct {
	max, perPeer int
	mu           sync.Mutex
	total        int
	peers        map[string]int
}

// New returns a Limiter allowing max connections in all and perPeer from
// one peer. A limit of 0 or less is no limit.
func New(max, perPeer int) *Limiter {
	return &Limiter{max: max, perPeer: perPeer, peers: map[string]int{}}
}

// Peer is the key a connection from addr is counted under: the IP address
// for TCP (every port of a host is one peer), "local" for a unix socket.
func Peer(addr net.Addr) string {
	switch a := addr.(type) {
	case *net.TCPAddr:
		return a.IP.String()
	case *net.UnixAddr:
		return "local"
	case nil:
		return ""
	}
	if host, _, err := net.SplitHostPort(addr.String()); err == nil {
		return host
	}
	return addr.String()
}

// Acquire takes a slot for a connection from peer. It returns "" when the
// connection may stay, which the caller undoes with Release(peer), or the
// reason (ReasonTotal, ReasonPeer) it must be closed.
func (l *Limiter) Acquire(peer string) string {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.max > 0 && l.total >= l.max {
		return ReasonTotal
	}
	if l.perPeer > 0 && l.peers[peer] >= l.perPeer {
		return ReasonPeer
	}
	l.total++
	l.peers[peer]++
	return ""
}

// Release gives back the slot of a connection from peer.
func (l *Limiter) Release(peer string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.total--
	if n := l.peers[peer] - 1; n > 0 {
		l.peers[peer] = n
	} else {
		delete(l.peers, peer)
	}
}

// Count returns the connections held in total and by peer.
func (l *Limiter) Count(peer string) (total, fromPeer int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.total, l.peers[peer]
}

// Backoff paces an accept loop after errors that pass (see Temporary).
type Backoff struct{ delay time.Duration }

// Wait sleeps after a failed accept: 5 ms the first time, doubling up to a
// second. Reset after a successful accept.
func (b *Backoff) Wait() {
	if b.delay == 0 {
		b.delay = 5 * time.Millisecond
	} else if b.delay *= 2; b.delay > time.Second {
		b.delay = time.Second
	}
	time.Sleep(b.delay)
}

// Reset is called after a successful accept.
func (b *Backoff) Reset() { b.delay = 0 }

// Temporary reports whether an accept error passes: the process or system
// is out of file descriptors (EMFILE, ENFILE) or memory for sockets
// (ENOBUFS, ENOMEM), the connection was reset before it was accepted
// (ECONNABORTED), or a deadline expired. The listener still works; the
// accept loop should wait and try again rather than stop serving.
func Temporary(err error) bool {
	for _, e := range []error{syscall.EMFILE, syscall.ENFILE, syscall.ENOBUFS, syscall.ENOMEM, syscall.ECONNABORTED, syscall.EINTR} {
		if errors.Is(err, e) {
			return true
		}
	}
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// OutOfFDs reports whether an accept error is for want of file descriptors.
func OutOfFDs(err error) bool {
	return errors.Is(err, syscall.EMFILE) || errors.Is(err, syscall.ENFILE)
}
