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

// Resolver returns the NBD address of the volume's primary now. An error
// that wraps ErrRefused or pool.ErrInvalid is final (no primary will come:
// the volume is unknown, the caller may not see it); any other is tried
// again until RetryFor.
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
	// MaxPause bounds the pause between two attempts to find and reach a
	// primary while there is none (default 1 s; it starts at 50 ms and
	// doubles). A shorter one finds a promoted primary sooner for more
	// look-ups during a failover.
	MaxPause time.Duration
	// Dial makes the TCP connection (default: net.Dialer).
	Dial func(ctx context.Context, network, addr string) (net.Conn, error)
	// Moves, when set, follows the volume's primary: it returns a channel
	// that receives whenever the primary may have changed, until ctx
	// ends (then it is closed). It is called once connected, and must
	// send once it watches (a move before is then seen too). The Disk resolves the primary again each
	// time and, when it is another one than its connection's, drops that
	// connection at once: the requests in flight on it are sent again to
	// the new primary, every disk at once, instead of after
	// RequestTimeout. Without it a request leaves a primary that stopped
	// answering only when its try times out.
	Moves func(ctx context.Context) <-chan struct{}
	// Name, when set, is the export name each connection opens at the
	// primary, made anew for each from the client's (a cluster node signs
	// its hop: cluster.Node.SignHop). Default: the client's name as it is.
	Name func(export string) string
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
	export string
	// shown is export without its token, for logs and errors: a
	// forwarding node's errors reach its client.
	shown    string
	resolve  Resolver
	opts     Options
	size     int64
	readOnly bool
	// moved is signalled when the primary moved: a connection attempt
	// waiting to try again tries at once.
	moved chan struct{}
	stop  context.CancelFunc // ends Moves

	connecting sync.Mutex // held while connecting: one connection at a time

	mu     sync.Mutex // guards the fields below; never held while connecting
	c      *nbdclient.Conn
	addr   string // c's primary
	closed bool
	// dialing is the primary a connection is being made to, and
	// cancelDial ends that attempt.
	dialing    string
	cancelDial context.CancelFunc
}

var _ pool.Disk = (*Disk)(nil)

// Open connects to the primary of the moment (retrying for up to
// RetryFor, or until ctx ends, while there is none) and returns the
// handle. A refusal by the primary (the export's name, disk or token is
// wrong: ErrRefused) is final.
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
	if opts.MaxPause <= 0 {
		opts.MaxPause = time.Second
	}
	if opts.Dial == nil {
		var nd net.Dialer
		opts.Dial = nd.DialContext
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	d := &Disk{export: export, shown: nbd.RedactToken(export), resolve: resolve, opts: opts, moved: make(chan struct{}, 1), stop: func() {}}
	c, err := d.conn(ctx, time.Now().Add(opts.RetryFor))
	if err != nil {
		return nil, err
	}
	d.size, d.readOnly = c.Size(), c.ReadOnly()
	if opts.Moves != nil {
		wctx, stop := context.WithCancel(context.Background())
		d.stop = stop
		go d.follow(wctx, opts.Moves(wctx))
	}
	return d, nil
}

// follow drops the connection to a primary that is not the volume's any
// more, each time moves says that it may have changed.
func (d *Disk) follow(ctx context.Context, moves <-chan struct{}) {
	for range moves {
		rctx, cancel := context.WithTimeout(ctx, d.opts.DialTimeout)
		addr, err := d.resolve(rctx)
		cancel()
		if err != nil {
			// No primary named now (the old one's lease expired, the
			// new one is not promoted yet): the next move names it.
			continue
		}
		d.mu.Lock()
		c, cur := d.c, d.addr
		if d.cancelDial != nil && d.dialing != addr {
			d.cancelDial()
		}
		d.mu.Unlock()
		if c != nil && cur != addr {
			d.opts.Logger.Info("the primary moved: sending the requests in flight again to the new one",
				"export", d.shown, "from", cur, "to", addr)
			c.Fail(fmt.Errorf("the primary moved from %s to %s", cur, addr))
		}
		select {
		case d.moved <- struct{}{}:
		default:
		}
	}
}

// conn returns the current connection, or makes one to the primary of the
// moment, trying again until deadline.
func (d *Disk) conn(ctx context.Context, deadline time.Time) (*nbdclient.Conn, error) {
	if c, err := d.current(); c != nil || err != nil {
		return c, err
	}
	d.connecting.Lock()
	defer d.connecting.Unlock()
	pause := 50 * time.Millisecond
	for {
		if c, err := d.current(); c != nil || err != nil {
			return c, err // made meanwhile, or closed
		}
		// A look-up that does not answer (etcd without a leader, an API
		// that hangs) is bounded like a request, so that RetryFor holds.
		rctx, cancel := context.WithTimeout(ctx, d.opts.RequestTimeout)
		addr, err := d.resolve(rctx)
		cancel()
		if err == nil {
			var c *nbdclient.Conn
			if c, err = d.dial(ctx, addr); err == nil {
				return c, nil
			}
		}
		if errors.Is(err, ErrRefused) || errors.Is(err, pool.ErrInvalid) {
			return nil, err // the primary's word, or the resolver's: final
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return nil, fmt.Errorf("no primary answered for %s: %w", d.shown, err)
		}
		d.opts.Logger.Debug("no primary yet; trying again", "export", d.shown, "err", err)
		select {
		case <-ctx.Done():
		case <-d.moved:
		case <-time.After(pause):
		}
		pause = min(2*pause, d.opts.MaxPause)
	}
}

// current is the connection in use, nil if there is none (or it failed);
// an error once the Disk is closed.
func (d *Disk) current() (*nbdclient.Conn, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return nil, fmt.Errorf("forwarded export %s: %w", d.shown, pool.ErrClosed)
	}
	if d.c != nil && !d.c.Failed() {
		return d.c, nil
	}
	return nil, nil
}

// dial connects to the primary at addr; a move of the primary elsewhere
// (follow) ends the attempt.
func (d *Disk) dial(ctx context.Context, addr string) (*nbdclient.Conn, error) {
	dctx, cancel := context.WithCancel(ctx)
	defer cancel()
	d.mu.Lock()
	d.dialing, d.cancelDial = addr, cancel
	d.mu.Unlock()
	defer func() {
		d.mu.Lock()
		d.dialing, d.cancelDial = "", nil
		d.mu.Unlock()
	}()
	// The handshake is bounded by the request timeout: the primary may
	// wait for its copies.
	name := d.export
	if d.opts.Name != nil {
		name = d.opts.Name(d.export)
	}
	c, err := nbdclient.Dial(dctx, addr, name, nbdclient.Options{Dial: d.opts.Dial,
		DialTimeout: d.opts.DialTimeout, Timeout: d.opts.RequestTimeout})
	if err != nil {
		return nil, forwardErr(err)
	}
	if d.size != 0 && c.Size() != d.size {
		c.Close()
		return nil, fmt.Errorf("primary at %s serves %d bytes, not %d: %w", addr, c.Size(), d.size, pool.ErrInvalid)
	}
	if d.opts.OnConnect != nil {
		d.opts.OnConnect(addr)
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		c.Close()
		return nil, fmt.Errorf("forwarded export %s: %w", d.shown, pool.ErrClosed)
	}
	d.c, d.addr = c, addr
	d.opts.Logger.Debug("forwarding to the primary", "export", d.shown, "addr", addr)
	return c, nil
}

// do runs one request, sending it again on a new connection whenever the
// current one breaks, for up to RetryFor. A refusal of the export by the
// primary when connecting again (the attachment was detached meanwhile)
// abandons the request at once: the client's next connection is refused.
func (d *Disk) do(run func(c *nbdclient.Conn) error) error {
	return d.retry(time.Now().Add(d.opts.RetryFor), run)
}

// retry is do's loop, until deadline.
func (d *Disk) retry(deadline time.Time, run func(c *nbdclient.Conn) error) error {
	for {
		c, err := d.conn(context.Background(), deadline)
		if err != nil {
			if errors.Is(err, pool.ErrClosed) || (errors.Is(err, pool.ErrInvalid) && !errors.Is(err, ErrRefused)) {
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
		d.opts.Logger.Info("primary connection lost; sending the request again", "export", d.shown, "err", err)
	}
}

var _ pool.Starter = (*Disk)(nil)

// StartRead and StartWrite start a request on the current connection
// without waiting for it (pool.Starter): its end, when the primary
// answers, goes to done from the connection's reply reader, with the error
// ReadAt or WriteAt would have returned. A request whose connection breaks
// (or that finds none) is not ended there: it goes on from a goroutine of
// its own exactly as ReadAt or WriteAt (do) would go on, to the next
// primary, within RetryFor of its start, and ends from there.
func (d *Disk) StartRead(p []byte, off int64, done pool.Done) {
	d.start(done, func(c *nbdclient.Conn) error { return c.ReadAt(p, off) },
		func(c *nbdclient.Conn, end func(error, bool)) { c.StartRead(p, off, end) })
}

func (d *Disk) StartWrite(p []byte, off int64, fua bool, done pool.Done) {
	d.start(done, func(c *nbdclient.Conn) error { return c.WriteAt(p, off, fua) },
		func(c *nbdclient.Conn, end func(error, bool)) { c.StartWrite(p, off, fua, end) })
}

// start starts a request with begin on the current connection, and runs
// it with run, as do does, where that connection breaks.
func (d *Disk) start(done pool.Done, run func(c *nbdclient.Conn) error, begin func(*nbdclient.Conn, func(error, bool))) {
	deadline := time.Now().Add(d.opts.RetryFor)
	c, err := d.current()
	switch {
	case err != nil:
		done(err, false)
		return
	case c == nil: // connecting may wait: not on the caller's goroutine
		go func() { done(d.retry(deadline, run), false) }()
		return
	}
	begin(c, func(err error, more bool) {
		err = forwardErr(err)
		if err == nil || !errors.Is(err, errConnLost) {
			done(err, more)
			return
		}
		c.Fail(err)
		if time.Now().After(deadline) {
			done(fmt.Errorf("%w: %w", nbd.ErrAbandon, err), false)
			return
		}
		d.opts.Logger.Info("primary connection lost; sending the request again", "export", d.shown, "err", err)
		go func() { done(d.retry(deadline, run), false) }()
	})
}

// Unplug sends the requests started and not sent yet (pool.Starter).
func (d *Disk) Unplug() {
	d.mu.Lock()
	c := d.c
	d.mu.Unlock()
	if c != nil {
		c.Unplug()
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

// Capabilities: reads and writes start without waiting (pool.Starter);
// every request goes to the primary.
func (d *Disk) Capabilities() pool.Capabilities { return pool.Capabilities{Starter: d} }

// Close closes the connection to the primary and stops following it.
func (d *Disk) Close() error {
	d.stop()
	d.mu.Lock()
	defer d.mu.Unlock()
	d.closed = true
	if d.cancelDial != nil {
		d.cancelDial()
	}
	if d.c != nil {
		d.c.Close()
		d.c = nil
	}
	return nil
}
