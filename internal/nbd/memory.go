package nbd

import (
	"runtime"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"time"
)

// Memory for requests in flight is bounded per connection, per peer and
// across the server. Every READ and WRITE reserves its length before its buffer is
// taken (for a WRITE, before its payload is read) and gives it back when its
// reply has been sent and its buffer released. While a connection's
// reservations would pass Config.MaxConnBytes, its peer's
// Config.MaxPeerBytes or the server's Config.MaxBytes, its reader stops
// reading requests: a client that does not
// read its replies stops getting new requests served instead of growing the
// server's memory, and the kernel's socket buffers push back on it. A
// budget with nothing in flight admits any one request, so a request up to
// maxPayload can always run. The per-peer cap keeps one client (which may
// open many connections) from taking the whole server's budget.
//
// A reply the client does not take within Config.SendTimeout ends the
// connection (SO_SNDTIMEO on the blocking socket), so a reservation cannot
// be held forever by a client that stopped reading.
//
// The accounting is a few atomic operations per request and allocates
// nothing; only a reader that must wait takes a lock.

// memory is the server's side of the accounting.
type memory struct {
	inflight atomic.Int64 // bytes reserved by every connection
	waiters  atomic.Int32 // readers waiting in waitServer
	mu       sync.Mutex
	freed    chan struct{} // closed (and replaced) when bytes are released while waiters > 0

	trimPending atomic.Bool
	lastTrim    atomic.Int64 // unix nanoseconds of the last returnMemory
}

// tryReserve reserves n bytes of the server's budget max, unless that
// would pass it while something is in flight.
func (m *memory) tryReserve(n, max int64) bool { return tryReserve(&m.inflight, n, max) }

func (m *memory) release(n int64) {
	m.inflight.Add(-n)
	if m.waiters.Load() > 0 {
		m.mu.Lock()
		if m.freed != nil {
			close(m.freed)
			m.freed = nil
		}
		m.mu.Unlock()
	}
}

// freedChan returns the channel the next release closes.
func (m *memory) freedChan() chan struct{} {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.freed == nil {
		m.freed = make(chan struct{})
	}
	return m.freed
}

// peerBytes counts the bytes in flight of every connection from one peer
// (Config.MaxPeerBytes), and its connections; Server.peers holds one per
// peer with connections.
type peerBytes struct {
	inflight    atomic.Int64
	conns       int // guarded by Server.mu
	negotiating int // guarded by Server.mu (Config.MaxHandshakesPerPeer)
}

// tryReserve reserves n bytes of budget max on counter, unless that would
// pass max while something is in flight.
func tryReserve(counter *atomic.Int64, n, max int64) bool {
	for {
		cur := counter.Load()
		if cur != 0 && cur+n > max {
			return false
		}
		if counter.CompareAndSwap(cur, cur+n) {
			return true
		}
	}
}

// reserve takes n bytes for req from the connection's, its peer's and the
// server's budgets, waiting (and not reading) while any is at its cap. Only
// the reader calls it.
func (c *conn) reserve(req *request, n int64) {
	s := c.srv
	waited := false
	for {
		if cur := c.inflight.Load(); cur != 0 && cur+n > s.cfg.MaxConnBytes {
			if !waited {
				waited = true
				c.memWaited("conn")
			}
			c.waitConn(n)
			continue
		}
		if !tryReserve(&c.peerMem.inflight, n, s.cfg.MaxPeerBytes) {
			if !waited {
				waited = true
				c.memWaited("peer")
			}
			c.waitServer(&c.peerMem.inflight, n, s.cfg.MaxPeerBytes)
			continue
		}
		if s.mem.tryReserve(n, s.cfg.MaxBytes) {
			break
		}
		c.peerMem.inflight.Add(-n)
		if !waited {
			waited = true
			c.memWaited("server")
		}
		c.waitServer(&s.mem.inflight, n, s.cfg.MaxBytes)
	}
	if v := c.inflight.Add(n); v > c.peak {
		c.peak = v
	}
	req.cost, req.conn = n, c
}

// unreserve gives back what reserve took; any goroutine may call it.
func (c *conn) unreserve(n int64) {
	c.inflight.Add(-n)
	if c.memWait.Load() {
		select {
		case c.memWake <- struct{}{}:
		default:
		}
	}
	c.peerMem.inflight.Add(-n)
	c.srv.mem.release(n)
}

func (c *conn) memWaited(scope string) {
	// The reader's own batched requests and replies hold reservations:
	// run and send them first.
	c.readerFlush()
	if o := c.srv.cfg.Observer; o != nil {
		o.MemoryWait(scope)
	}
}

// waitConn sleeps until the connection releases bytes (or n fits).
func (c *conn) waitConn(n int64) {
	c.memWait.Store(true)
	defer c.memWait.Store(false)
	if cur := c.inflight.Load(); cur == 0 || cur+n <= c.srv.cfg.MaxConnBytes {
		return
	}
	<-c.memWake
}

// waitServer sleeps until some connection releases bytes (or n fits in
// counter's budget max).
func (c *conn) waitServer(counter *atomic.Int64, n, max int64) {
	m := &c.srv.mem
	ch := m.freedChan()
	m.waiters.Add(1)
	defer m.waiters.Add(-1)
	if cur := counter.Load(); cur == 0 || cur+n <= max {
		return
	}
	t := time.NewTimer(time.Second) // a safety net: releases close ch
	defer t.Stop()
	select {
	case <-ch:
	case <-t.C:
	}
}

// trimAfter is how much a closed connection must have had in flight for
// the server to hand memory back to the system afterwards.
const trimAfter = 32 << 20

// trimInterval spaces the returns of memory to the system.
const trimInterval = 10 * time.Second

// connClosed hands memory back to the operating system after a connection
// that held large buffers (pooled buffers survive two garbage collections,
// and a collection may not come for minutes on an idle server). Returns are
// coalesced, at most one per trimInterval.
func (s *Server) connClosed(c *conn) {
	if c.peak < trimAfter || !s.mem.trimPending.CompareAndSwap(false, true) {
		return
	}
	go func() {
		defer s.mem.trimPending.Store(false)
		wait := time.Second // let other connections of the same client close too
		if next := time.Unix(0, s.mem.lastTrim.Load()).Add(trimInterval); time.Until(next) > wait {
			wait = time.Until(next)
		}
		time.Sleep(wait)
		runtime.GC() // moves pooled buffers to the victim cache
		debug.FreeOSMemory()
		s.mem.lastTrim.Store(time.Now().UnixNano())
	}()
}
