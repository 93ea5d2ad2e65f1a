package forward

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sync"
	"time"

	"github.com/quiverstorage/quiver/internal/nbd"
	"github.com/quiverstorage/quiver/internal/nbdclient"
	"github.com/quiverstorage/quiver/internal/pool"
)

// Resolver returns the NBD address of the volume's primary now.
type Resolver func(ctx context.Context) (addr string, err error)

// Options configure a Disk.
type Options struct {
	// RequestTimeout bounds one try of a request at one primary (default
	// 20 s: longer than a primary holds a request while its lease is
	// short).
	RequestTimeout time.Duration
	// RetryFor bounds how long a request is tried again across primaries
	// (default 90 s); after that the client's connection is closed without
	// an answer (nbd.ErrAbandon), for the client to try again.
	RetryFor time.Duration
	// DialTimeout bounds one connection attempt (default 3 s).
	DialTimeout time.Duration
	// Dial makes the TCP connection (default: net.Dialer).
	Dial func(ctx context.Context, network, addr string) (net.Conn, error)
	// OnConnect, when set, is called with the address of each new
	// connection, before any request is sent on it.
	OnConnect func(addr string)
	Logger    *slog.Logger
}

// Disk is a disk served by the volume's primary, wherever it is (see the
// package comment). Durability is the primary's: a write acknowledged
// through it is on every in-sync copy, durable after a later Flush (or at
// once with FUA). Its methods are safe for concurrent use.
type Disk struct {
	export   string
	resolve  Resolver
	opts     Options
	size     int64
	readOnly bool

	mu     sync.Mutex // guards c; held while connecting
	c      *nbdclient.Conn
	closed bool
}

var _ pool.Disk = (*Disk)(nil)

// Open connects to the primary of the moment (retrying for up to
// RetryFor while there is none) and returns the handle.
func Open(ctx context.Context, export string, resolve Resolver, opts Options) (*Disk, error) {
	if opts.RequestTimeout <= 0 {
		opts.RequestTimeout = 20 * time.Second
	}
	if opts.RetryFor <= 0 {
		opts.RetryFor = 90 * time.Second
	}
	if opts.DialTimeout <= 0 {
		opts.DialTimeout = 3 * time.Second
	}
	if opts.Dial == nil {
		var nd net.Dialer
		opts.Dial = nd.DialContext
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	d := &Disk{export: export, resolve: resolve, opts: opts}
	c, err := d.conn(ctx, time.Now().Add(opts.RetryFor))
	if err != nil {
		return nil, err
	}
	d.size, d.readOnly = c.Size(), c.ReadOnly()
	return d, nil
}

// conn returns the current connection, or makes one to the primary of the
// moment, trying again until deadline.
func (d *Disk) conn(ctx context.Context, deadline time.Time) (*nbdclient.Conn, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return nil, fmt.Errorf("forwarded export %s: %w", d.export, pool.ErrClosed)
	}
	if d.c != nil && !d.c.Failed() {
		return d.c, nil
	}
	pause := 50 * time.Millisecond
	for {
		addr, err := d.resolve(ctx)
		if err == nil {
			// The handshake is bounded by the request timeout: the
			// primary may wait for its copies.
			var c *nbdclient.Conn
			c, err = nbdclient.Dial(ctx, addr, d.export, nbdclient.Options{Dial: d.opts.Dial,
				DialTimeout: d.opts.DialTimeout, Timeout: d.opts.RequestTimeout})
			err = forwardErr(err)
			if err == nil {
				if d.size != 0 && c.Size() != d.size {
					c.Close()
					return nil, fmt.Errorf("primary at %s serves %d bytes, not %d: %w", addr, c.Size(), d.size, pool.ErrInvalid)
				}
				if d.opts.OnConnect != nil {
					d.opts.OnConnect(addr)
				}
				d.c = c
				d.opts.Logger.Debug("forwarding to the primary", "export", d.export, "addr", addr)
				return c, nil
			}
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return nil, fmt.Errorf("no primary answered for %s: %w", d.export, err)
		}
		d.opts.Logger.Debug("no primary yet; trying again", "export", d.export, "err", err)
		select {
		case <-ctx.Done():
		case <-time.After(pause):
		}
		pause = min(2*pause, time.Second)
	}
}

// do runs one request, sending it again on a new connection whenever the
// current one breaks, for up to RetryFor.
func (d *Disk) do(run func(c *nbdclient.Conn) error) error {
	deadline := time.Now().Add(d.opts.RetryFor)
	for {
		c, err := d.conn(context.Background(), deadline)
		if err != nil {
			if errors.Is(err, pool.ErrClosed) || errors.Is(err, pool.ErrInvalid) {
				return err
			}
			return fmt.Errorf("%w: %w", nbd.ErrAbandon, err)
		}
		err = forwardErr(run(c))
		if err == nil || !errors.Is(err, errConnLost) {
			return err
		}
		c.Fail(err)
		if time.Now().After(deadline) {
			return fmt.Errorf("%w: %w", nbd.ErrAbandon, err)
		}
		d.opts.Logger.Info("primary connection lost; sending the request again", "export", d.export, "err", err)
	}
}

func (d *Disk) Size() int64    { return d.size }
func (d *Disk) ReadOnly() bool { return d.readOnly }

func (d *Disk) ReadAt(p []byte, off int64) error {
	return d.do(func(c *nbdclient.Conn) error { return c.ReadAt(p, off) })
}

func (d *Disk) WriteAt(p []byte, off int64, f bool) error {
	return d.do(func(c *nbdclient.Conn) error { return c.WriteAt(p, off, f) })
}

func (d *Disk) Flush() error {
	return d.do((*nbdclient.Conn).Flush)
}

func (d *Disk) Trim(off, length int64, f bool) error {
	return d.do(func(c *nbdclient.Conn) error { return c.Trim(off, length, f) })
}

func (d *Disk) Zero(off, length int64, flags pool.ZeroFlags) error {
	mayTrim, fast, fua := flags&pool.ZeroMayTrim != 0, flags&pool.ZeroFast != 0, flags&pool.ZeroFUA != 0
	return d.do(func(c *nbdclient.Conn) error { return c.Zero(off, length, mayTrim, fast, fua) })
}

// Cache is a hint: it is not forwarded.
func (d *Disk) Cache(off, length int64) error { return nil }

// Extents reports the range as data: the primary's allocation map is not
// forwarded (a client reads zeros where there are holes).
func (d *Disk) Extents(off, length int64, limit int) ([]pool.Extent, error) {
	return []pool.Extent{{Offset: off, Length: length}}, nil
}

// Capabilities: none, every request goes to the primary.
func (d *Disk) Capabilities() pool.Capabilities { return pool.Capabilities{} }

// Close closes the connection to the primary.
func (d *Disk) Close() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.closed = true
	if d.c != nil {
		d.c.Close()
		d.c = nil
	}
	return nil
}
