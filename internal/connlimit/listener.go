package connlimit

import (
	"net"
	"sync"
)

// Listener wraps a net.Listener: connections beyond the Limiter's limits are
// closed as soon as they are accepted, and accept errors that pass
// (Temporary) are retried after a pause instead of returned.
type Listener struct {
	net.Listener
	Limiter *Limiter
	// Rejected, when set, is called with the reason of every refusal
	// (ReasonTotal, ReasonPeer, ReasonFDs).
	Rejected func(reason string)
}

// Accept returns the next connection within the limits. It returns an
// error only when the listener fails for good (it was closed).
func (l *Listener) Accept() (net.Conn, error) {
	var b Backoff
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			if !Temporary(err) {
				return nil, err
			}
			if OutOfFDs(err) {
				l.reject(ReasonFDs)
			}
			b.Wait()
			continue
		}
		b.Reset()
		peer := Peer(c.RemoteAddr())
		if reason := l.Limiter.Acquire(peer); reason != "" {
			_ = c.Close()
			l.reject(reason)
			continue
		}
		return &conn{Conn: c, release: func() { l.Limiter.Release(peer) }}, nil
	}
}

func (l *Listener) reject(reason string) {
	if l.Rejected != nil {
		l.Rejected(reason)
	}
}

// conn gives back its slot once, when it is first closed.
type conn struct {
	net.Conn
	once    sync.Once
	release func()
}

func (c *conn) Close() error {
	err := c.Conn.Close()
	c.once.Do(c.release)
	return err
}

// CloseWrite half-closes a TCP connection (net/http uses it to linger
// before closing after an error).
func (c *conn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return nil
}
