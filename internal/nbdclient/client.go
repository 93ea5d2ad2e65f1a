package nbdclient

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
)

// The protocol's constants, as much as this client uses.
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
	cmdWriteZeroes = 6
	cmdFlagFUA     = 1 << 0
	cmdFlagNoHole  = 1 << 1
	cmdFlagFast    = 1 << 4

	// maxOptionReply bounds an option reply the client reads into memory.
	maxOptionReply = 1 << 16
)

var (
	// ErrLost: the connection could not be made, broke, carried something
	// that is not NBD, or the server did not answer in time.
	ErrLost = errors.New("nbd connection lost")
	// ErrHandshake: the server's greeting or option replies were not what
	// the protocol says, or the connection broke during them.
	ErrHandshake = errors.New("nbd handshake failed")
	// ErrRefused: the server refused the export (an error reply to
	// NBD_OPT_GO); the error is a *Refusal, with the server's reply.
	ErrRefused = errors.New("nbd server refused the export")
)

// Refusal is the server's error reply to NBD_OPT_GO: its reply type (with
// the error bit, "Option reply types") and its message, as they came. It
// is ErrRefused.
type Refusal struct {
	Reply   uint32
	Message string
}

func (r *Refusal) Error() string {
	return fmt.Sprintf("%v (reply type %#x): %s", ErrRefused, r.Reply, r.Message)
}

func (r *Refusal) Is(target error) bool { return target == ErrRefused }

// Errno is the error value of a reply ("Error values"): Linux's errno
// numbers.
type Errno uint32

func (e Errno) Error() string {
	return fmt.Sprintf("NBD error %d (%v)", uint32(e), syscall.Errno(e))
}

// Options are how a connection is made and bounded.
type Options struct {
	// Dial makes the connection (nil: net.Dialer).
	Dial func(ctx context.Context, network, addr string) (net.Conn, error)
	// DialTimeout bounds the connect alone (0: only ctx bounds it).
	DialTimeout time.Duration
	// Timeout bounds the handshake and each request (required).
	Timeout time.Duration
}

// Conn is one NBD connection to one export. Its methods are safe for
// concurrent use. Once it fails, every request, pending and later, fails
// with the error that broke it (ErrLost).
type Conn struct {
	c        net.Conn
	size     int64
	readOnly bool
	timeout  time.Duration

	// Sending: a request appends its frame to outq; Unplug, by whoever
	// finds no sender at work, writes every queued frame with one writev
	// until the queue is empty (flat combining).
	smu     sync.Mutex
	outq    net.Buffers
	sending bool
	spare   net.Buffers // the sender's buffer of the last round, reused

	mu      sync.Mutex
	next    uint64
	pending map[uint64]*call
	err     error
}

// call is a request in flight: done gets its end exactly once, from the
// reply reader (its reply), from Fail (the connection broke) or from the
// request itself (the connection had failed already).
type call struct {
	buf   []byte // a READ's destination
	done  func(err error, more bool)
	timer *time.Timer // fails the connection if no reply comes in time
}

// Dial connects to addr and negotiates export. The handshake ends by ctx's
// deadline or opts.Timeout, whichever comes first. Its errors do not show
// export, which may carry a token, a credential or a signature: the caller
// names it as it may be shown.
func Dial(ctx context.Context, addr, export string, opts Options) (*Conn, error) {
	if opts.Timeout <= 0 {
		return nil, fmt.Errorf("nbdclient: no timeout")
	}
	dial := opts.Dial
	if dial == nil {
		var d net.Dialer
		dial = d.DialContext
	}
	dctx := ctx
	if opts.DialTimeout > 0 {
		var cancel context.CancelFunc
		dctx, cancel = context.WithTimeout(ctx, opts.DialTimeout)
		defer cancel()
	}
	nc, err := dial(dctx, "tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("%w: %s: %w", ErrLost, addr, err)
	}
	deadline := time.Now().Add(opts.Timeout)
	if dl, ok := ctx.Deadline(); ok && dl.Before(deadline) {
		deadline = dl
	}
	_ = nc.SetDeadline(deadline)
	size, flags, err := negotiate(nc, export)
	if err != nil {
		nc.Close()
		return nil, fmt.Errorf("%s: %w", addr, err)
	}
	_ = nc.SetDeadline(time.Time{})
	c := &Conn{c: nc, size: size, readOnly: flags&flagReadOnly != 0, timeout: opts.Timeout, pending: map[uint64]*call{}}
	go c.readReplies()
	return c, nil
}

// negotiate runs the fixed newstyle handshake ("Newstyle negotiation") and
// NBD_OPT_GO, and returns the export's size and transmission flags.
func negotiate(rw io.ReadWriter, export string) (int64, uint16, error) {
	var hello [18]byte
	if _, err := io.ReadFull(rw, hello[:]); err != nil {
		return 0, 0, fmt.Errorf("%w: greeting: %w", ErrHandshake, err)
	}
	if binary.BigEndian.Uint64(hello[0:]) != magicNBD || binary.BigEndian.Uint64(hello[8:]) != magicIHaveOpt {
		return 0, 0, fmt.Errorf("%w: not a newstyle NBD server", ErrHandshake)
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
		return 0, 0, fmt.Errorf("%w: send NBD_OPT_GO: %w", ErrHandshake, err)
	}
	br := bufio.NewReader(rw)
	size, flags := int64(-1), uint16(0)
	for {
		var h [20]byte
		if _, err := io.ReadFull(br, h[:]); err != nil {
			return 0, 0, fmt.Errorf("%w: option reply: %w", ErrHandshake, err)
		}
		if binary.BigEndian.Uint64(h[0:]) != magicOptionReply || binary.BigEndian.Uint32(h[8:]) != optGo {
			return 0, 0, fmt.Errorf("%w: malformed option reply", ErrHandshake)
		}
		typ, n := binary.BigEndian.Uint32(h[12:]), binary.BigEndian.Uint32(h[16:])
		if n > maxOptionReply {
			return 0, 0, fmt.Errorf("%w: option reply of %d bytes", ErrHandshake, n)
		}
		body := make([]byte, n)
		if _, err := io.ReadFull(br, body); err != nil {
			return 0, 0, fmt.Errorf("%w: option reply: %w", ErrHandshake, err)
		}
		switch {
		case typ&repError != 0:
			return 0, 0, &Refusal{Reply: typ, Message: string(body)}
		case typ == repInfo && len(body) >= 12 && binary.BigEndian.Uint16(body) == infoExprt:
			size, flags = int64(binary.BigEndian.Uint64(body[2:])), binary.BigEndian.Uint16(body[10:])
		case typ == repAck:
			if size < 0 {
				return 0, 0, fmt.Errorf("%w: no NBD_INFO_EXPORT before the ack", ErrHandshake)
			}
			if br.Buffered() > 0 {
				return 0, 0, fmt.Errorf("%w: bytes after the ack", ErrHandshake)
			}
			return size, flags, nil
		}
	}
}

// Size is the export's size in bytes.
func (c *Conn) Size() int64 { return c.size }

// ReadOnly reports whether the server serves the export read-only.
func (c *Conn) ReadOnly() bool { return c.readOnly }

// Failed reports whether the connection has failed.
func (c *Conn) Failed() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.err != nil
}

// Fail ends the connection with err (wrapped in ErrLost unless it is):
// every pending request gets it, and so does every later one.
func (c *Conn) Fail(err error) {
	if !errors.Is(err, ErrLost) {
		err = fmt.Errorf("%w: %w", ErrLost, err)
	}
	c.mu.Lock()
	if c.err != nil {
		c.mu.Unlock()
		return
	}
	c.err = err
	calls := make([]*call, 0, len(c.pending))
	for h, cl := range c.pending {
		calls = append(calls, cl)
		delete(c.pending, h)
	}
	c.mu.Unlock()
	_ = c.c.Close()
	// Outside c.mu: a request's end may start another (sent again
	// elsewhere) or fail this connection again.
	for _, cl := range calls {
		cl.timer.Stop()
		cl.done(err, false)
	}
}

// readBuffer is the reply reader's buffer: at queue depth 32 one read(2)
// brings in the replies of many small requests.
const readBuffer = 256 << 10

func (c *Conn) readReplies() {
	br := bufio.NewReaderSize(c.c, readBuffer)
	for {
		var r [16]byte
		if _, err := io.ReadFull(br, r[:]); err != nil {
			c.Fail(err)
			return
		}
		if binary.BigEndian.Uint32(r[0:]) != magicSimpleReply {
			c.Fail(errors.New("malformed reply"))
			return
		}
		errno, h := binary.BigEndian.Uint32(r[4:]), binary.BigEndian.Uint64(r[8:])
		c.mu.Lock()
		cl := c.pending[h]
		delete(c.pending, h)
		c.mu.Unlock()
		if cl == nil {
			c.Fail(errors.New("reply to an unknown handle"))
			return
		}
		cl.timer.Stop()
		if errno != 0 {
			cl.done(Errno(errno), c.replyBuffered(br))
			continue
		}
		if cl.buf != nil {
			if _, err := io.ReadFull(br, cl.buf); err != nil {
				err = fmt.Errorf("%w: read data: %w", ErrLost, err)
				cl.done(err, false)
				c.Fail(err)
				return
			}
		}
		cl.done(nil, c.replyBuffered(br))
	}
}

// replyBuffered reports whether the next reply is in br whole, so that
// the reader hands it on without waiting (Start's more).
func (c *Conn) replyBuffered(br *bufio.Reader) bool {
	n := br.Buffered()
	if n < 16 {
		return false
	}
	r, _ := br.Peek(16)
	if binary.BigEndian.Uint32(r[0:]) != magicSimpleReply || binary.BigEndian.Uint32(r[4:]) != 0 {
		return true // an error, or a stream that fails: no data to wait for
	}
	c.mu.Lock()
	cl := c.pending[binary.BigEndian.Uint64(r[8:])]
	c.mu.Unlock()
	return cl == nil || n >= 16+len(cl.buf)
}

// do sends one request and waits for its reply.
func (c *Conn) do(cmd, flags uint16, off int64, length uint32, data, buf []byte) error {
	ch := make(chan error, 1)
	c.start(cmd, flags, off, length, data, buf, func(err error, _ bool) { ch <- err })
	c.Unplug()
	return <-ch
}

// start queues one request and calls done with its end (see Start), at
// most the timeout after: a server that does not answer in time is taken
// for gone, and the connection is closed.
func (c *Conn) start(cmd, flags uint16, off int64, length uint32, data, buf []byte, done func(error, bool)) {
	cl := &call{buf: buf, done: done}
	c.mu.Lock()
	if c.err != nil {
		err := c.err
		c.mu.Unlock()
		done(err, false)
		return
	}
	h := c.next
	c.next++
	c.pending[h] = cl
	cl.timer = time.AfterFunc(c.timeout, func() { c.expire(h) })
	c.mu.Unlock()
	hdr := make([]byte, 0, 28)
	hdr = binary.BigEndian.AppendUint32(hdr, magicRequest)
	hdr = binary.BigEndian.AppendUint16(hdr, flags)
	hdr = binary.BigEndian.AppendUint16(hdr, cmd)
	hdr = binary.BigEndian.AppendUint64(hdr, h)
	hdr = binary.BigEndian.AppendUint64(hdr, uint64(off))
	hdr = binary.BigEndian.AppendUint32(hdr, length)
	c.smu.Lock()
	c.outq = append(c.outq, hdr)
	if len(data) > 0 {
		c.outq = append(c.outq, data)
	}
	c.smu.Unlock()
}

// expire fails the connection if request h is still unanswered.
func (c *Conn) expire(h uint64) {
	c.mu.Lock()
	_, waiting := c.pending[h]
	c.mu.Unlock()
	if waiting {
		c.Fail(fmt.Errorf("no answer within %s", c.timeout))
	}
}

// Unplug sends every request queued (Start) and not sent yet, unless
// another goroutine is sending: that one sends them (flat combining). At
// queue depth 32 that is one system call for many requests, with no
// goroutine of its own to wake. A failed send fails the connection, and so
// every request on it.
func (c *Conn) Unplug() {
	c.smu.Lock()
	if c.sending {
		c.smu.Unlock()
		return
	}
	c.sending = true
	for len(c.outq) > 0 {
		bufs := c.outq
		c.outq = c.spare[:0]
		c.smu.Unlock()
		_ = c.c.SetWriteDeadline(time.Now().Add(c.timeout))
		all := bufs
		_, err := all.WriteTo(c.c) // consumes all; bufs keeps the slice
		if err != nil {
			c.Fail(fmt.Errorf("send: %w", err))
		}
		clear(bufs)
		c.smu.Lock()
		c.spare = bufs[:0]
	}
	c.sending = false
	c.smu.Unlock()
}

// StartRead starts reading len(p) bytes at off into p, and StartWrite
// writing p at off (with fua the server answers once it is durable),
// without waiting: done gets the request's end, as ReadAt or WriteAt
// would return it, exactly once, from the connection's reply reader (more:
// the next reply is buffered and done's next call follows at once), or from
// whoever fails the connection, or at once if it had failed. The request is
// sent at the next Unplug (or with any other request); p is the
// connection's until done.
func (c *Conn) StartRead(p []byte, off int64, done func(err error, more bool)) {
	c.start(cmdRead, 0, off, uint32(len(p)), nil, p, done)
}

func (c *Conn) StartWrite(p []byte, off int64, fua bool, done func(err error, more bool)) {
	c.start(cmdWrite, fuaFlag(fua), off, uint32(len(p)), p, nil, done)
}

func fuaFlag(fua bool) uint16 {
	if fua {
		return cmdFlagFUA
	}
	return 0
}

// ReadAt reads len(p) bytes at off.
func (c *Conn) ReadAt(p []byte, off int64) error {
	return c.do(cmdRead, 0, off, uint32(len(p)), nil, p)
}

// WriteAt writes p at off; with fua the server answers once it is durable.
func (c *Conn) WriteAt(p []byte, off int64, fua bool) error {
	return c.do(cmdWrite, fuaFlag(fua), off, uint32(len(p)), p, nil)
}

// Flush asks for every write answered before it to be durable.
func (c *Conn) Flush() error { return c.do(cmdFlush, 0, 0, 0, nil, nil) }

// Trim deallocates [off, off+length).
func (c *Conn) Trim(off, length int64, fua bool) error {
	return c.do(cmdTrim, fuaFlag(fua), off, uint32(length), nil, nil)
}

// Zero writes zeros to [off, off+length): with mayTrim the server may
// deallocate them, with fast it refuses (EOPNOTSUPP) rather than write
// zeros slowly.
func (c *Conn) Zero(off, length int64, mayTrim, fast, fua bool) error {
	flags := fuaFlag(fua)
	if !mayTrim {
		flags |= cmdFlagNoHole
	}
	if fast {
		flags |= cmdFlagFast
	}
	return c.do(cmdWriteZeroes, flags, off, uint32(length), nil, nil)
}

// Close sends NBD_CMD_DISC and closes the connection.
func (c *Conn) Close() {
	if !c.Failed() {
		hdr := binary.BigEndian.AppendUint32(nil, magicRequest)
		hdr = binary.BigEndian.AppendUint16(hdr, 0)
		hdr = binary.BigEndian.AppendUint16(hdr, cmdDisc)
		hdr = append(hdr, make([]byte, 20)...)
		c.smu.Lock()
		c.outq = append(c.outq, hdr)
		c.smu.Unlock()
		c.Unplug()
	}
	c.Fail(errors.New("closed"))
}
