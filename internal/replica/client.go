package replica

import (
	"bufio"
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"sync"
	"syscall"
	"time"
)

// The client side of the NBD protocol (NetworkBlockDevice/nbd doc/proto.md),
// as much as a primary needs to forward writes to a copy: fixed newstyle
// negotiation with NBD_OPT_GO, then simple replies only (no structured
// replies: a primary never reads from a copy).
const (
	magicNBD         = 0x4e42444d41474943 // "NBDMAGIC"
	magicIHaveOpt    = 0x49484156454f5054 // "IHAVEOPT"
	magicOptionReply = 0x3e889045565a9
	magicRequest     = 0x25609513
	magicSimpleReply = 0x67446698

	clientFixedNewstyle = 1 << 0
	clientNoZeroes      = 1 << 1

	optGo     = 7
	repAck    = 1
	repInfo   = 3
	repError  = 1 << 31
	infoExprt = 0

	cmdWrite       = 1
	cmdDisc        = 2
	cmdFlush       = 3
	cmdTrim        = 4
	cmdWriteZeroes = 6
	cmdFlagFUA     = 1 << 0
	cmdFlagNoHole  = 1 << 1
)

// conn is one NBD connection to a copy's export. Requests may be sent from
// many goroutines at once; a reader goroutine matches replies to them by
// handle. Once the connection fails every request, pending and later, fails
// with ErrCopyDown.
type conn struct {
	c       net.Conn
	size    int64
	timeout time.Duration

	wmu sync.Mutex // serializes request frames

	mu      sync.Mutex
	next    uint64
	pending map[uint64]chan error
	err     error // set once the connection failed
	done    chan struct{}
}

// dial connects to addr and negotiates export (NBD_OPT_GO).
func dial(ctx context.Context, addr, export string, timeout time.Duration) (*conn, error) {
	var d net.Dialer
	return dialWith(ctx, d.DialContext, addr, export, timeout)
}

func dialWith(ctx context.Context, dialFn func(ctx context.Context, network, addr string) (net.Conn, error),
	addr, export string, timeout time.Duration) (*conn, error) {
	nc, err := dialFn(ctx, "tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("copy at %s: %w: %w", addr, ErrCopyDown, err)
	}
	if dl, ok := ctx.Deadline(); ok {
		_ = nc.SetDeadline(dl)
	} else {
		_ = nc.SetDeadline(time.Now().Add(timeout))
	}
	size, err := negotiate(nc, export)
	if err != nil {
		nc.Close()
		return nil, fmt.Errorf("copy at %s, export %q: %w", addr, export, err)
	}
	_ = nc.SetDeadline(time.Time{})
	c := &conn{c: nc, size: size, timeout: timeout, pending: map[uint64]chan error{}, done: make(chan struct{})}
	go c.readReplies()
	return c, nil
}

// negotiate runs the fixed newstyle handshake ("Newstyle negotiation") and
// NBD_OPT_GO, and returns the export's size.
func negotiate(rw io.ReadWriter, export string) (int64, error) {
	var hello [18]byte
	if _, err := io.ReadFull(rw, hello[:]); err != nil {
		return 0, fmt.Errorf("%w: greeting: %w", ErrHandshake, err)
	}
	if binary.BigEndian.Uint64(hello[0:]) != magicNBD || binary.BigEndian.Uint64(hello[8:]) != magicIHaveOpt {
		return 0, fmt.Errorf("%w: not a newstyle NBD server", ErrHandshake)
	}
	req := binary.BigEndian.AppendUint32(nil, clientFixedNewstyle|clientNoZeroes)
	data := binary.BigEndian.AppendUint32(nil, uint32(len(export)))
	data = append(data, export...)
	data = binary.BigEndian.AppendUint16(data, 0) // no information requests
	req = binary.BigEndian.AppendUint64(req, magicIHaveOpt)
	req = binary.BigEndian.AppendUint32(req, optGo)
	req = binary.BigEndian.AppendUint32(req, uint32(len(data)))
	req = append(req, data...)
	if _, err := rw.Write(req); err != nil {
		return 0, fmt.Errorf("%w: send NBD_OPT_GO: %w", ErrHandshake, err)
	}
	br := bufio.NewReader(rw)
	size := int64(-1)
	for {
		var h [20]byte
		if _, err := io.ReadFull(br, h[:]); err != nil {
			return 0, fmt.Errorf("%w: option reply: %w", ErrHandshake, err)
		}
		if binary.BigEndian.Uint64(h[0:]) != magicOptionReply || binary.BigEndian.Uint32(h[8:]) != optGo {
			return 0, fmt.Errorf("%w: malformed option reply", ErrHandshake)
		}
		typ, n := binary.BigEndian.Uint32(h[12:]), binary.BigEndian.Uint32(h[16:])
		if n > 1<<16 {
			return 0, fmt.Errorf("%w: option reply of %d bytes", ErrHandshake, n)
		}
		body := make([]byte, n)
		if _, err := io.ReadFull(br, body); err != nil {
			return 0, fmt.Errorf("%w: option reply: %w", ErrHandshake, err)
		}
		switch {
		case typ&repError != 0:
			return 0, fmt.Errorf("%w: server refused the export (reply type %#x): %s", ErrHandshake, typ, body)
		case typ == repInfo && len(body) >= 12 && binary.BigEndian.Uint16(body) == infoExprt:
			size = int64(binary.BigEndian.Uint64(body[2:]))
		case typ == repAck:
			if size < 0 {
				return 0, fmt.Errorf("%w: no NBD_INFO_EXPORT before the ack", ErrHandshake)
			}
			if br.Buffered() > 0 {
				return 0, fmt.Errorf("%w: bytes after the ack", ErrHandshake)
			}
			return size, nil
		}
	}
}

// fail ends the connection with err: every pending request gets it.
func (c *conn) fail(err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.err != nil {
		return
	}
	c.err = err
	close(c.done)
	for h, ch := range c.pending {
		ch <- err
		delete(c.pending, h)
	}
	_ = c.c.Close()
}

func (c *conn) readReplies() {
	br := bufio.NewReader(c.c)
	for {
		var r [16]byte
		if _, err := io.ReadFull(br, r[:]); err != nil {
			c.fail(fmt.Errorf("%w: %w", ErrCopyDown, err))
			return
		}
		if binary.BigEndian.Uint32(r[0:]) != magicSimpleReply {
			c.fail(fmt.Errorf("%w: malformed reply", ErrCopyDown))
			return
		}
		errno, h := binary.BigEndian.Uint32(r[4:]), binary.BigEndian.Uint64(r[8:])
		c.mu.Lock()
		ch := c.pending[h]
		delete(c.pending, h)
		c.mu.Unlock()
		if ch == nil {
			c.fail(fmt.Errorf("%w: reply to an unknown handle", ErrCopyDown))
			return
		}
		if errno != 0 {
			// NBD's error values are Linux's errno numbers.
			ch <- fmt.Errorf("%w: NBD error %d (%v)", ErrCopyRefused, errno, syscall.Errno(errno))
		} else {
			ch <- nil
		}
	}
}

// do sends one request and waits for its reply, at most the timeout: a copy
// that does not answer in time is down, and the connection is closed.
func (c *conn) do(cmd, flags uint16, off int64, length uint32, data []byte) error {
	ch := make(chan error, 1)
	c.mu.Lock()
	if c.err != nil {
		c.mu.Unlock()
		return c.err
	}
	h := c.next
	c.next++
	c.pending[h] = ch
	c.mu.Unlock()
	hdr := make([]byte, 0, 28)
	hdr = binary.BigEndian.AppendUint32(hdr, magicRequest)
	hdr = binary.BigEndian.AppendUint16(hdr, flags)
	hdr = binary.BigEndian.AppendUint16(hdr, cmd)
	hdr = binary.BigEndian.AppendUint64(hdr, h)
	hdr = binary.BigEndian.AppendUint64(hdr, uint64(off))
	hdr = binary.BigEndian.AppendUint32(hdr, length)
	c.wmu.Lock()
	_ = c.c.SetWriteDeadline(time.Now().Add(c.timeout))
	bufs := net.Buffers{hdr}
	if len(data) > 0 {
		bufs = append(bufs, data)
	}
	_, err := bufs.WriteTo(c.c)
	c.wmu.Unlock()
	if err != nil {
		c.fail(fmt.Errorf("%w: send: %w", ErrCopyDown, err))
	}
	t := time.NewTimer(c.timeout)
	defer t.Stop()
	select {
	case err := <-ch:
		return err
	case <-t.C:
		c.fail(fmt.Errorf("%w: no answer within %s", ErrCopyDown, c.timeout))
		return <-ch
	}
}

func fuaFlag(fua bool) uint16 {
	if fua {
		return cmdFlagFUA
	}
	return 0
}

func (c *conn) write(p []byte, off int64, fua bool) error {
	return c.do(cmdWrite, fuaFlag(fua), off, uint32(len(p)), p)
}

func (c *conn) flush() error { return c.do(cmdFlush, 0, 0, 0, nil) }

func (c *conn) trim(off, length int64, fua bool) error {
	return c.do(cmdTrim, fuaFlag(fua), off, uint32(length), nil)
}

func (c *conn) zero(off, length int64, mayTrim, fua bool) error {
	flags := fuaFlag(fua)
	if !mayTrim {
		flags |= cmdFlagNoHole
	}
	return c.do(cmdWriteZeroes, flags, off, uint32(length), nil)
}

// close sends NBD_CMD_DISC and closes the connection.
func (c *conn) close() {
	c.mu.Lock()
	failed := c.err != nil
	c.mu.Unlock()
	if !failed {
		hdr := binary.BigEndian.AppendUint32(nil, magicRequest)
		hdr = binary.BigEndian.AppendUint16(hdr, 0)
		hdr = binary.BigEndian.AppendUint16(hdr, cmdDisc)
		hdr = append(hdr, make([]byte, 20)...)
		c.wmu.Lock()
		_ = c.c.SetWriteDeadline(time.Now().Add(time.Second))
		_, _ = c.c.Write(hdr)
		c.wmu.Unlock()
	}
	c.fail(fmt.Errorf("%w: closed", ErrCopyDown))
}

// Client is a write-only NBD client of one export, as the primary uses
// for its copies; tests use it to drive a server (many requests in flight
// at once). Its methods are safe for concurrent use.
type Client struct{ c *conn }

// DialNBD connects to export at addr with dialFn (nil: net.Dialer) and
// negotiates it; each request is bounded by timeout.
func DialNBD(ctx context.Context, dialFn func(ctx context.Context, network, addr string) (net.Conn, error),
	addr, export string, timeout time.Duration) (*Client, error) {
	if dialFn == nil {
		var d net.Dialer
		dialFn = d.DialContext
	}
	c, err := dialWith(ctx, dialFn, addr, export, timeout)
	if err != nil {
		return nil, err
	}
	return &Client{c: c}, nil
}

// Size is the export's size.
func (c *Client) Size() int64 { return c.c.size }

// WriteAt sends one WRITE and waits for its reply.
func (c *Client) WriteAt(p []byte, off int64, fua bool) error { return c.c.write(p, off, fua) }

// Flush sends one FLUSH and waits for its reply.
func (c *Client) Flush() error { return c.c.flush() }

// Close disconnects.
func (c *Client) Close() { c.c.close() }
