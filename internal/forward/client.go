package forward

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"syscall"
	"time"

	"github.com/quiverstorage/quiver/internal/pool"
)

// The client side of the NBD protocol (NetworkBlockDevice/nbd doc/proto.md):
// fixed newstyle negotiation with NBD_OPT_GO, then simple replies only (no
// structured replies are asked for, so a READ's data follows its reply
// header).
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

	flagReadOnly = 1 << 1

	cmdRead        = 0
	cmdWrite       = 1
	cmdDisc        = 2
	cmdFlush       = 3
	cmdTrim        = 4
	cmdCache       = 5
	cmdWriteZeroes = 6
	cmdFlagFUA     = 1 << 0
	cmdFlagNoHole  = 1 << 1
	cmdFlagFast    = 1 << 4

	// NBD error values ("Error values").
	errPerm     = 1
	errNoMem    = 12
	errInval    = 22
	errNoSpc    = 28
	errNotSup   = 95
	errShutdown = 108
)

// errConnLost: the connection to the primary broke, or did not answer in
// time. The request is sent again on a new connection.
var errConnLost = errors.New("connection to the primary lost")

// errRefused: the primary's node refused the export at the handshake (not
// the primary any more, or not ready yet). Tried again.
var errRefused = errors.New("export refused")

// fromErrno maps an NBD error value back to the domain error the serving
// node mapped to it, so this node's NBD server answers the same value.
func fromErrno(errno uint32) error {
	switch errno {
	case errPerm:
		return pool.ErrFenced
	case errInval:
		return pool.ErrInvalid
	case errNoSpc:
		return pool.ErrNoSpace
	case errNotSup:
		return pool.ErrNotSupported
	case errNoMem:
		return syscall.ENOMEM
	case errShutdown:
		return errConnLost // the primary is shutting down: go to the next
	}
	return fmt.Errorf("primary answered NBD error %d", errno)
}

// client is one NBD connection. Requests may be sent from many goroutines;
// a reader goroutine matches replies to them by handle. Once the
// connection fails, every request, pending and later, fails with
// errConnLost.
type client struct {
	c        net.Conn
	size     int64
	readOnly bool
	timeout  time.Duration

	wmu sync.Mutex // one request frame at a time

	mu      sync.Mutex
	next    uint64
	pending map[uint64]*call
	err     error
}

type call struct {
	buf  []byte // a READ's destination
	done chan error
}

func dial(ctx context.Context, dialer func(context.Context, string, string) (net.Conn, error), addr, export string,
	dialTimeout, timeout time.Duration) (*client, error) {
	dctx, cancel := context.WithTimeout(ctx, dialTimeout)
	defer cancel()
	nc, err := dialer(dctx, "tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("%w: %s: %w", errConnLost, addr, err)
	}
	_ = nc.SetDeadline(time.Now().Add(timeout)) // the handshake: the primary may wait for its copies
	size, flags, err := negotiate(nc, export)
	if err != nil {
		nc.Close()
		return nil, fmt.Errorf("primary at %s: %w", addr, err)
	}
	_ = nc.SetDeadline(time.Time{})
	c := &client{c: nc, size: size, readOnly: flags&flagReadOnly != 0, timeout: timeout, pending: map[uint64]*call{}}
	go c.readReplies()
	return c, nil
}

// negotiate runs the fixed newstyle handshake and NBD_OPT_GO, and returns
// the export's size and transmission flags.
func negotiate(rw io.ReadWriter, export string) (int64, uint16, error) {
	var hello [18]byte
	if _, err := io.ReadFull(rw, hello[:]); err != nil {
		return 0, 0, fmt.Errorf("%w: greeting: %w", errConnLost, err)
	}
	if binary.BigEndian.Uint64(hello[0:]) != magicNBD || binary.BigEndian.Uint64(hello[8:]) != magicIHaveOpt {
		return 0, 0, fmt.Errorf("%w: not a newstyle NBD server", errConnLost)
	}
	req := binary.BigEndian.AppendUint32(nil, clientFixedNewstyle|clientNoZeroes)
	data := binary.BigEndian.AppendUint32(nil, uint32(len(export)))
	data = append(data, export...)
	data = binary.BigEndian.AppendUint16(data, 0)
	req = binary.BigEndian.AppendUint64(req, magicIHaveOpt)
	req = binary.BigEndian.AppendUint32(req, optGo)
	req = binary.BigEndian.AppendUint32(req, uint32(len(data)))
	req = append(req, data...)
	if _, err := rw.Write(req); err != nil {
		return 0, 0, fmt.Errorf("%w: send NBD_OPT_GO: %w", errConnLost, err)
	}
	br := bufio.NewReader(rw)
	size, flags := int64(-1), uint16(0)
	for {
		var h [20]byte
		if _, err := io.ReadFull(br, h[:]); err != nil {
			return 0, 0, fmt.Errorf("%w: option reply: %w", errConnLost, err)
		}
		if binary.BigEndian.Uint64(h[0:]) != magicOptionReply || binary.BigEndian.Uint32(h[8:]) != optGo {
			return 0, 0, fmt.Errorf("%w: malformed option reply", errConnLost)
		}
		typ, n := binary.BigEndian.Uint32(h[12:]), binary.BigEndian.Uint32(h[16:])
		if n > 1<<16 {
			return 0, 0, fmt.Errorf("%w: option reply of %d bytes", errConnLost, n)
		}
		body := make([]byte, n)
		if _, err := io.ReadFull(br, body); err != nil {
			return 0, 0, fmt.Errorf("%w: option reply: %w", errConnLost, err)
		}
		switch {
		case typ&repError != 0:
			return 0, 0, fmt.Errorf("%w: %s", errRefused, body)
		case typ == repInfo && len(body) >= 12 && binary.BigEndian.Uint16(body) == infoExprt:
			size, flags = int64(binary.BigEndian.Uint64(body[2:])), binary.BigEndian.Uint16(body[10:])
		case typ == repAck:
			if size < 0 {
				return 0, 0, fmt.Errorf("%w: no NBD_INFO_EXPORT before the ack", errConnLost)
			}
			if br.Buffered() > 0 {
				return 0, 0, fmt.Errorf("%w: bytes after the ack", errConnLost)
			}
			return size, flags, nil
		}
	}
}

func (c *client) failed() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.err != nil
}

func (c *client) fail(err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.err != nil {
		return
	}
	c.err = err
	for h, cl := range c.pending {
		cl.done <- err
		delete(c.pending, h)
	}
	_ = c.c.Close()
}

func (c *client) readReplies() {
	br := bufio.NewReader(c.c)
	for {
		var r [16]byte
		if _, err := io.ReadFull(br, r[:]); err != nil {
			c.fail(fmt.Errorf("%w: %w", errConnLost, err))
			return
		}
		if binary.BigEndian.Uint32(r[0:]) != magicSimpleReply {
			c.fail(fmt.Errorf("%w: malformed reply", errConnLost))
			return
		}
		errno, h := binary.BigEndian.Uint32(r[4:]), binary.BigEndian.Uint64(r[8:])
		c.mu.Lock()
		cl := c.pending[h]
		delete(c.pending, h)
		c.mu.Unlock()
		if cl == nil {
			c.fail(fmt.Errorf("%w: reply to an unknown handle", errConnLost))
			return
		}
		if errno != 0 {
			cl.done <- fromErrno(errno)
			continue
		}
		if cl.buf != nil {
			if _, err := io.ReadFull(br, cl.buf); err != nil {
				err = fmt.Errorf("%w: read data: %w", errConnLost, err)
				cl.done <- err
				c.fail(err)
				return
			}
		}
		cl.done <- nil
	}
}

// do sends one request and waits for its reply, at most the timeout: a
// primary that does not answer in time is treated as gone (the connection
// is closed, and the request goes to the primary of the moment).
func (c *client) do(cmd, flags uint16, off int64, length uint32, data, buf []byte) error {
	cl := &call{buf: buf, done: make(chan error, 1)}
	c.mu.Lock()
	if c.err != nil {
		c.mu.Unlock()
		return c.err
	}
	h := c.next
	c.next++
	c.pending[h] = cl
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
		c.fail(fmt.Errorf("%w: send: %w", errConnLost, err))
	}
	t := time.NewTimer(c.timeout)
	defer t.Stop()
	select {
	case err := <-cl.done:
		return err
	case <-t.C:
		c.fail(fmt.Errorf("%w: no answer within %s", errConnLost, c.timeout))
		return <-cl.done
	}
}

// close sends NBD_CMD_DISC and closes the connection.
func (c *client) close() {
	if !c.failed() {
		hdr := binary.BigEndian.AppendUint32(nil, magicRequest)
		hdr = binary.BigEndian.AppendUint16(hdr, 0)
		hdr = binary.BigEndian.AppendUint16(hdr, cmdDisc)
		hdr = append(hdr, make([]byte, 20)...)
		c.wmu.Lock()
		_ = c.c.SetWriteDeadline(time.Now().Add(time.Second))
		_, _ = c.c.Write(hdr)
		c.wmu.Unlock()
	}
	c.fail(fmt.Errorf("%w: closed", errConnLost))
}
