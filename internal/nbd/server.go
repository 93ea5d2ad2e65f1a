package nbd

import (
	"bufio"
	"context"
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
)

// DefaultAddr is the standard NBD port, on loopback.
const DefaultAddr = "127.0.0.1:10809"

// Config tunes the server. Zero values take the defaults.
type Config struct {
	MaxConns         int           // connections at once; more are closed at accept (default 1024)
	HandshakeTimeout time.Duration // negotiation must finish within it (default 10 s)
	Workers          int           // requests executed at once per connection (default 16); with 1, one at a time in order
	Logger           *slog.Logger
	Observer         Observer // optional: told about connections
}

// Observer is told when connections open and close (metrics).
type Observer interface {
	ConnOpened()
	ConnClosed()
}

func (c *Config) defaults() {
	if c.MaxConns <= 0 {
		c.MaxConns = 1024
	}
	if c.HandshakeTimeout <= 0 {
		c.HandshakeTimeout = 10 * time.Second
	}
	if c.Workers <= 0 {
		c.Workers = 16
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
	mu      sync.Mutex
	lns     map[net.Listener]bool
	conns   map[*conn]bool
	wg      sync.WaitGroup
}

// NewServer returns a server for exports.
func NewServer(exports Exports, cfg Config) *Server {
	cfg.defaults()
	return &Server{exports: exports, cfg: cfg, log: cfg.Logger, lns: map[net.Listener]bool{}, conns: map[*conn]bool{}}
}

// ListenUnix listens on a unix socket, replacing a stale socket file.
func ListenUnix(path string) (net.Listener, error) {
	if st, err := os.Lstat(path); err == nil && st.Mode()&os.ModeSocket != 0 {
		_ = os.Remove(path)
	}
	return net.Listen("unix", path)
}

// Serve accepts connections on ln until Shutdown. It returns ErrServerClosed
// after Shutdown.
func (s *Server) Serve(ln net.Listener) error {
	s.mu.Lock()
	if s.closing.Load() {
		s.mu.Unlock()
		_ = ln.Close()
		return ErrServerClosed
	}
	s.lns[ln] = true
	s.mu.Unlock()
	for {
		nc, err := ln.Accept()
		if err != nil {
			if s.closing.Load() {
				return ErrServerClosed
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				time.Sleep(10 * time.Millisecond)
				continue
			}
			return err
		}
		s.start(nc)
	}
}

func (s *Server) start(nc net.Conn) {
	id := s.nextID.Add(1)
	c := &conn{srv: s, nc: nc, log: s.log.With("conn", id, "remote", nc.RemoteAddr().String())}
	c.r = bufio.NewReaderSize(connReader{c}, 256<<10)
	s.mu.Lock()
	if len(s.conns) >= s.cfg.MaxConns || s.closing.Load() {
		s.mu.Unlock()
		s.log.Warn("refusing NBD connection: limit reached", "max", s.cfg.MaxConns)
		_ = nc.Close()
		return
	}
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
			s.mu.Unlock()
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
	_ = c.nc.SetDeadline(time.Now().Add(s.cfg.HandshakeTimeout))
	if s.closing.Load() { // Shutdown's deadline may predate ours
		return
	}
	if err := c.negotiate(context.Background()); err != nil {
		if !errors.Is(err, errAbort) {
			c.log.Debug("negotiation ended", "err", err)
		}
		return
	}
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
				_ = c.nc.Close()
			case <-stop:
			}
		}()
	}
	err := c.serve(context.Background())
	if err != nil && !errors.Is(err, errDisconnect) && !s.closing.Load() {
		c.log.Debug("connection ended", "export", c.export, "err", err)
	}
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
			_ = c.nc.Close()
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
