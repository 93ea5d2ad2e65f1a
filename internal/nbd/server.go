package nbd

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
	"golang.org/x/time/rate"

	"github.com/quiverstorage/quiver/internal/connlimit"
)

// DefaultAddr is the standard NBD port, on loopback.
const DefaultAddr = "127.0.0.1:10809"

// Config tunes the server. Zero values take the defaults (docs/security.md
// lists each limit and why it has its default).
type Config struct {
	MaxConns        int // connections at once; more are closed at accept (default 1024)
	MaxConnsPerPeer int // connections at once from one IP address, or over one unix socket (default 256)
	// MaxHandshakes bounds the connections still negotiating (default 128),
	// MaxHandshakesPerPeer those of one peer (default 16): clients that
	// connect and stall cannot take the slots of connections that serve
	// data, and one peer cannot take every negotiation slot.
	MaxHandshakes        int
	MaxHandshakesPerPeer int
	// GreetingTimeout: the client's flags must arrive within it of the
	// connection (default 3 s), so a connection that never sends a byte
	// holds its slot that long.
	GreetingTimeout  time.Duration
	HandshakeTimeout time.Duration // the whole negotiation must finish within it (default 10 s)
	// RefusalTime: an open refused for want of access or of the export
	// (NBD_REP_ERR_POLICY, NBD_REP_ERR_UNKNOWN) is answered this long
	// after the open began, at the soonest (default 50 ms), so that how
	// long the check took says nothing of which part was wrong: a wrong
	// token for a volume checked on its primary, through another node,
	// and a volume that does not exist (docs/security.md). A Forwarded
	// open's refusal is the forwarding node's to hold.
	RefusalTime time.Duration
	// Forwarded, when set, recognizes an open that another node of the
	// cluster forwards for its client (docs/cluster.md, "Refusals"): it
	// returns the export name that client asked that node for, and true;
	// false for any other name, which is opened as it came. A forwarded
	// open is opened, logged and refused under the client's name, and its
	// refusal is answered at once, without RefusalTime: the forwarding node
	// holds it from its client's open, so that it takes as long there as
	// every other refusal. Forwarded must not accept a name a client
	// could make (the cluster signs it).
	Forwarded func(name string) (export string, ok bool)
	Workers   int // requests executed at once per connection (default 16); with 1, one at a time in order
	// MaxConnBytes caps the READ and WRITE bytes in flight on one
	// connection (default 64 MiB), MaxPeerBytes on all the connections of
	// one peer (default 256 MiB), MaxBytes across the server (default
	// 1 GiB). At the cap the connection's reader stops reading
	// requests until replies drain (memory.go).
	MaxConnBytes int64
	MaxPeerBytes int64
	MaxBytes     int64
	// SendTimeout ends a connection whose client takes none of a reply for
	// that long (default 60 s).
	SendTimeout time.Duration
	// TLS, if set, lets clients upgrade with NBD_OPT_STARTTLS (tls.go); it
	// is used for each handshake, so a GetCertificate that reads the
	// current pair rotates certificates for new connections. RequireTLS
	// refuses everything but NBD_OPT_STARTTLS and NBD_OPT_ABORT before
	// the upgrade.
	TLS        *tls.Config
	RequireTLS bool
	// Polled keeps plain TCP and unix connections in Go's network poller
	// for the transmission phase instead of moving them to a blocking
	// socket (socket.go). For benchmarks (a hidden flag): it is how the
	// blocking reader is measured against the poller.
	Polled   bool
	Logger   *slog.Logger
	Observer Observer // optional: told about connections
}

// Observer is told when connections open, close and are refused (metrics).
type Observer interface {
	ConnOpened()
	ConnClosed()
	// ConnRejected is called for a connection closed at accept, or an
	// accept that failed, with the reason: connlimit.ReasonTotal,
	// ReasonPeer, ReasonFDs or ReasonHandshakes.
	ConnRejected(reason string)
	// MemoryWait is called when a connection stops reading requests until
	// in-flight reply bytes drain: scope "conn" (Config.MaxConnBytes) or
	// "peer" (Config.MaxPeerBytes) or "server" (Config.MaxBytes).
	MemoryWait(scope string)
	// DataError is called for a request that failed on the disk, with the
	// NBD error's name (EIO, ENOSPC).
	DataError(errno string)
}

// ReasonHandshakes is the rejection reason when MaxHandshakes connections
// are negotiating.
const ReasonHandshakes = "handshakes"

// DefaultConfig is the configuration with every default filled in (for
// flags that show them).
func DefaultConfig() Config {
	var c Config
	c.defaults()
	return c
}

func (c *Config) defaults() {
	if c.MaxConns <= 0 {
		c.MaxConns = 1024
	}
	if c.MaxConnsPerPeer <= 0 {
		c.MaxConnsPerPeer = 256
	}
	if c.MaxHandshakes <= 0 {
		c.MaxHandshakes = 128
	}
	if c.MaxHandshakesPerPeer <= 0 {
		c.MaxHandshakesPerPeer = 16
	}
	if c.GreetingTimeout <= 0 {
		c.GreetingTimeout = 3 * time.Second
	}
	if c.HandshakeTimeout <= 0 {
		c.HandshakeTimeout = 10 * time.Second
	}
	c.GreetingTimeout = min(c.GreetingTimeout, c.HandshakeTimeout)
	if c.RefusalTime <= 0 {
		c.RefusalTime = 50 * time.Millisecond
	}
	if c.Workers <= 0 {
		c.Workers = 16
	}
	if c.MaxConnBytes <= 0 {
		c.MaxConnBytes = 64 << 20
	}
	if c.MaxPeerBytes <= 0 {
		c.MaxPeerBytes = 256 << 20
	}
	if c.MaxBytes <= 0 {
		c.MaxBytes = 1 << 30
	}
	if c.SendTimeout <= 0 {
		c.SendTimeout = time.Minute
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
}

// Server serves exports over NBD on any number of listeners.
type Server struct {
	exports Exports
	cfg     Config
	log     *slog.Logger

	closing atomic.Bool
	nextID  atomic.Uint64
	limit   *connlimit.Limiter
	// rejectLog paces the warnings about refused connections.
	rejectLog *rate.Limiter
	// failureLog paces the warnings about requests failed on the disk.
	failureLog *rate.Limiter
	// negotiating counts connections in negotiation (MaxHandshakes).
	negotiating atomic.Int64
	mem         memory // bytes in flight (memory.go)
	mu          sync.Mutex
	lns         map[net.Listener]bool
	conns       map[*conn]bool
	peers       map[string]*peerBytes
	wg          sync.WaitGroup
}

// NewServer returns a server for exports.
func NewServer(exports Exports, cfg Config) *Server {
	cfg.defaults()
	return &Server{exports: exports, cfg: cfg, log: cfg.Logger, lns: map[net.Listener]bool{}, conns: map[*conn]bool{},
		peers: map[string]*peerBytes{}, limit: connlimit.New(cfg.MaxConns, cfg.MaxConnsPerPeer), rejectLog: rate.NewLimiter(rate.Every(time.Second), 1),
		failureLog: newFailureLog()}
}

// ListenUnix listens on a unix socket, replacing a stale socket file.
func ListenUnix(path string) (net.Listener, error) {
	if st, err := os.Lstat(path); err == nil && st.Mode()&os.ModeSocket != 0 {
		_ = os.Remove(path)
	}
	return net.Listen("unix", path)
}

// Serve accepts connections on ln until Shutdown. It returns ErrServerClosed
// after Shutdown. Accept errors that pass (out of file descriptors, a
// connection reset before it was accepted) make it pause and go on; only a
// listener that fails for good ends it.
func (s *Server) Serve(ln net.Listener) error {
	s.mu.Lock()
	if s.closing.Load() {
		s.mu.Unlock()
		_ = ln.Close()
		return ErrServerClosed
	}
	s.lns[ln] = true
	s.mu.Unlock()
	var backoff connlimit.Backoff
	for {
		nc, err := ln.Accept()
		if err != nil {
			if s.closing.Load() {
				return ErrServerClosed
			}
			if connlimit.Temporary(err) {
				if connlimit.OutOfFDs(err) {
					s.rejected(connlimit.ReasonFDs, "", err)
				}
				backoff.Wait()
				continue
			}
			return err
		}
		backoff.Reset()
		s.start(nc)
	}
}

// rejected counts a refused connection and logs it, at most once a second
// (an attack makes thousands). Callers count before they close the
// connection, so that a client that sees the close finds it counted.
func (s *Server) rejected(reason, peer string, err error) {
	if s.cfg.Observer != nil {
		s.cfg.Observer.ConnRejected(reason)
	}
	if s.rejectLog.Allow() {
		s.log.Warn("refusing NBD connection", "reason", reason, "peer", peer, "err", err,
			"max_conns", s.cfg.MaxConns, "max_conns_per_peer", s.cfg.MaxConnsPerPeer, "max_handshakes", s.cfg.MaxHandshakes)
	}
}

// peerOf names a connection's peer for the per-peer limits: its IP address
// over TCP; over a unix socket, the socket it came in by. Every client of one
// socket is one peer, and each socket its own: the compute node's endpoint
// publishes one socket per volume, so one VM that holds its budget, its
// connection slots or its handshakes leaves the other VMs of the node theirs.
func peerOf(nc net.Conn) string {
	if la, ok := nc.LocalAddr().(*net.UnixAddr); ok {
		return "unix:" + la.Name
	}
	return connlimit.Peer(nc.RemoteAddr())
}

func (s *Server) start(nc net.Conn) {
	peer := peerOf(nc)
	if s.closing.Load() {
		_ = nc.Close()
		return
	}
	if s.negotiating.Add(1) > int64(s.cfg.MaxHandshakes) {
		s.negotiating.Add(-1)
		s.rejected(ReasonHandshakes, peer, nil)
		_ = nc.Close()
		return
	}
	if reason := s.limit.Acquire(peer); reason != "" {
		s.negotiating.Add(-1)
		s.rejected(reason, peer, nil)
		_ = nc.Close()
		return
	}
	s.mu.Lock()
	if s.closing.Load() {
		s.mu.Unlock()
		s.negotiating.Add(-1)
		s.limit.Release(peer)
		_ = nc.Close()
		return
	}
	pm := s.peers[peer]
	if pm == nil {
		pm = &peerBytes{}
		s.peers[peer] = pm
	}
	if pm.negotiating >= s.cfg.MaxHandshakesPerPeer {
		if pm.conns == 0 {
			delete(s.peers, peer)
		}
		s.mu.Unlock()
		s.negotiating.Add(-1)
		s.limit.Release(peer)
		s.rejected(ReasonHandshakes, peer, nil)
		_ = nc.Close()
		return
	}
	pm.conns++
	pm.negotiating++
	// Only an admitted connection gets its buffers.
	id := s.nextID.Add(1)
	c := &conn{srv: s, nc: nc, peer: peer, peerMem: pm, log: s.log.With("conn", id, "remote", nc.RemoteAddr().String())}
	c.r = bufio.NewReaderSize(connReader{c}, 256<<10)
	s.conns[c] = true
	s.wg.Add(1)
	s.mu.Unlock()
	if tc, ok := nc.(*net.TCPConn); ok {
		_ = tc.SetNoDelay(true)
	}
	if sc, ok := nc.(syscall.Conn); ok {
		c.raw, _ = sc.SyscallConn()
	}
	if _, ok := nc.(*net.UnixConn); ok && c.raw != nil {
		growSendBuffer(c.raw)
	}
	if s.cfg.Observer != nil {
		s.cfg.Observer.ConnOpened()
	}
	go func() {
		defer s.wg.Done()
		defer func() {
			s.mu.Lock()
			delete(s.conns, c)
			if pm.conns--; pm.conns == 0 {
				delete(s.peers, peer)
			}
			s.mu.Unlock()
			s.limit.Release(peer)
			s.connClosed(c)
			if s.cfg.Observer != nil {
				s.cfg.Observer.ConnClosed()
			}
		}()
		s.run(c)
	}()
}

func (s *Server) run(c *conn) {
	defer func() { _ = c.nc.Close() }() // c.nc changes in leavePoller
	defer c.closeDisk()
	negotiating := true
	defer func() {
		if negotiating {
			s.endNegotiation(c)
		}
	}()
	start := time.Now()
	c.handshakeDeadline = start.Add(s.cfg.HandshakeTimeout)
	_ = c.nc.SetDeadline(start.Add(s.cfg.GreetingTimeout))
	if s.closing.Load() { // Shutdown's deadline may predate ours
		return
	}
	if err := c.negotiate(context.Background()); err != nil {
		if !errors.Is(err, errAbort) {
			c.log.Debug("negotiation ended", "err", err)
		}
		return
	}
	s.endNegotiation(c)
	negotiating = false
	_ = c.nc.SetDeadline(time.Time{})
	s.mu.Lock() // Shutdown stops the reading of the connection it sees
	c.leavePoller()
	closing := s.closing.Load()
	s.mu.Unlock()
	if closing {
		return
	}
	c.log.Debug("transmission", "export", c.export, "structured", c.structured)
	if c.revoked != nil {
		stop := make(chan struct{})
		defer close(stop)
		go func() {
			select {
			case <-c.revoked:
				c.log.Info("attachment detached: closing the connection", "export", c.export)
				c.closeConn()
			case <-stop:
			}
		}()
	}
	err := c.serve(context.Background())
	if err != nil && !errors.Is(err, errDisconnect) && !s.closing.Load() {
		c.log.Debug("connection ended", "export", c.export, "err", err)
	}
}

// endNegotiation gives back c's negotiation slots.
func (s *Server) endNegotiation(c *conn) {
	s.negotiating.Add(-1)
	s.mu.Lock()
	c.peerMem.negotiating--
	s.mu.Unlock()
}

// Shutdown stops accepting, makes every connection stop reading new
// requests, lets in-flight requests finish and get their replies, flushes
// each writable export and closes. It waits for that or for ctx.
func (s *Server) Shutdown(ctx context.Context) error {
	s.closing.Store(true)
	s.mu.Lock()
	for ln := range s.lns {
		_ = ln.Close()
	}
	for c := range s.conns {
		c.stopReading()
	}
	s.mu.Unlock()
	done := make(chan struct{})
	go func() { s.wg.Wait(); close(done) }()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		s.mu.Lock()
		for c := range s.conns {
			c.closeConn()
		}
		s.mu.Unlock()
		return fmt.Errorf("nbd shutdown: %w", ctx.Err())
	}
}

// Conns returns the number of open connections.
func (s *Server) Conns() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.conns)
}

// unixSendBuffer is the send buffer asked for on unix connections: a whole
// large READ reply then goes out with one sendmsg instead of several, each
// after a wait for the client to drain the last (the default, wmem_default,
// is about 200 KiB).
const unixSendBuffer = 4 << 20

// growSendBuffer raises the send buffer of a unix connection, beyond
// net.core.wmem_max when the process may (CAP_NET_ADMIN), else up to it.
func growSendBuffer(rc syscall.RawConn) {
	_ = rc.Control(func(fd uintptr) {
		if unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_SNDBUFFORCE, unixSendBuffer) != nil {
			_ = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_SNDBUF, unixSendBuffer)
		}
	})
}
