package nbd

import (
	"errors"
	"net"
	"os"
	"runtime"
	"sync"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// The transmission phase runs on a blocking socket outside Go's network
// poller.
//
// Go parks a goroutine whose socket has nothing to read, and the poller
// (epoll) wakes it when data comes; meanwhile the thread that ran it, and
// any idle one, wait in epoll_pwait, and each arriving request wakes them:
// measured at queue depth 1 over TCP, two epoll_pwait calls and a
// nanosleep per request in threads that have nothing to do, competing with
// the client for the CPU on a small machine. nbdkit instead blocks a
// thread in recv(2), and the kernel wakes just that thread.
//
// quiver does the same once negotiation is over: the socket is duplicated,
// put in blocking mode, and the original descriptor (the one registered
// with epoll) is closed. The reader then sleeps in read(2), a system call
// Go knows about, so the rest of the program runs meanwhile; each open
// connection holds one thread while it is open, as in nbdkit, and a second
// one while a reply waits for a client that does not read. Replies are
// sent without waiting first (MSG_DONTWAIT, see send), and only when the
// socket's buffer is full does the sender wait in the kernel. Only TCP and
// unix connections move; anything else (a wrapper, a pipe) stays polled.

// blockingConn is a connected socket in blocking mode, not in the poller.
type blockingConn struct {
	f             *os.File // reads and writes hold a reference: the descriptor is closed after the last
	rc            syscall.RawConn
	local, remote net.Addr
	closeOnce     sync.Once
	closeErr      error
}

var errNoDeadline = errors.New("blocking NBD connection: deadlines are not supported")

func (b *blockingConn) Read(p []byte) (int, error)  { return b.f.Read(p) }
func (b *blockingConn) Write(p []byte) (int, error) { return b.f.Write(p) }

// Close shuts the socket down first, which wakes a reader blocked in
// read(2): the descriptor is released once that read returns.
func (b *blockingConn) Close() error {
	b.closeOnce.Do(func() {
		b.shutdown(unix.SHUT_RDWR)
		b.closeErr = b.f.Close()
	})
	return b.closeErr
}

// shutdown calls shutdown(2) unless the socket is closed already.
func (b *blockingConn) shutdown(how int) {
	_ = b.rc.Control(func(fd uintptr) { _ = unix.Shutdown(int(fd), how) })
}

func (b *blockingConn) LocalAddr() net.Addr                { return b.local }
func (b *blockingConn) RemoteAddr() net.Addr               { return b.remote }
func (b *blockingConn) SetDeadline(t time.Time) error      { return errNoDeadline }
func (b *blockingConn) SetReadDeadline(t time.Time) error  { return errNoDeadline }
func (b *blockingConn) SetWriteDeadline(t time.Time) error { return errNoDeadline }

// leavePoller moves the connection to a blocking socket (see above). It
// runs between negotiation and transmission with no other goroutine using
// the connection, and leaves it as it was if any step fails.
func (c *conn) leavePoller() {
	switch c.nc.(type) {
	case *net.TCPConn, *net.UnixConn:
	default:
		return // a wrapper may buffer or filter what it reads: leave it be
	}
	if c.raw == nil || (c.srv != nil && c.srv.cfg.Polled) {
		return
	}
	dup := -1
	err := c.raw.Control(func(fd uintptr) {
		d, err := unix.FcntlInt(fd, unix.F_DUPFD_CLOEXEC, 0)
		if err != nil {
			return
		}
		// The mode belongs to the socket, not the descriptor: the
		// original is blocking from here on too, and is closed below.
		if unix.SetNonblock(d, false) != nil {
			_ = unix.Close(d)
			return
		}
		// A blocking send gives up after SendTimeout without progress
		// (memory.go): the client is not reading its replies.
		if c.srv != nil {
			tv := unix.NsecToTimeval(c.srv.cfg.SendTimeout.Nanoseconds())
			_ = unix.SetsockoptTimeval(d, unix.SOL_SOCKET, unix.SO_SNDTIMEO, &tv)
		}
		dup = d
	})
	if err != nil || dup < 0 {
		return
	}
	f := os.NewFile(uintptr(dup), "nbd")
	rc, err := f.SyscallConn()
	if err != nil {
		_ = f.Close()
		return
	}
	c.ncMu.Lock()
	old := c.nc
	c.nc = &blockingConn{f: f, rc: rc, local: old.LocalAddr(), remote: old.RemoteAddr()}
	c.ncMu.Unlock()
	c.raw, c.snd.blocking = rc, true
	_ = old.Close() // deregisters from epoll; the socket lives on in f
}

// stopReading makes a reader blocked on the connection return (for
// Shutdown): in-flight requests still get their replies. On a blocking
// socket shutdown(SHUT_RD) wakes the reader; it does not stop a TCP peer's
// later data from being read, so connReader also refuses to read once the
// server is closing.
func (c *conn) stopReading() {
	c.ncMu.Lock()
	defer c.ncMu.Unlock()
	if b, ok := c.nc.(*blockingConn); ok {
		b.shutdown(unix.SHUT_RD)
		return
	}
	_ = c.nc.SetReadDeadline(time.Now())
}

// closeConn closes the connection's socket from another goroutine than
// its own.
func (c *conn) closeConn() {
	c.ncMu.Lock()
	defer c.ncMu.Unlock()
	_ = c.nc.Close()
}

// errStopped ends the reader of a blocking socket when the server shuts down.
var errStopped = errors.New("server shutting down: no more requests read")

// connReader is what the connection's bufio.Reader reads from: whichever
// socket the connection has now.
type connReader struct{ c *conn }

// Read reads from the socket. Before it sleeps in the kernel, requests
// just handed to the write executor or to the workers get to run on this
// thread's P: a goroutine readied by the reader waits in that P's run
// queue, and while the reader sleeps in a system call the P is held, so
// another thread would have to be woken to steal it (measured at QD32
// randwrite on ext4: 0.50 context switches per request without this, 0.35
// with it).
//
// It also yields at least every yieldEvery. The reader otherwise never
// passes through the scheduler: its system calls are raw or return on the
// fast path, so the runtime sees one goroutine running for as long as the
// connection is busy. After 10 ms of that, sysmon (Go 1.26) preempts it
// and, finding it in a system call, hands its P to another thread, and
// every such hand-off puts sysmon back to waking every 20 us: measured,
// sysmon took 13% of the server's CPU at 1 MiB READs and 30% at 4k
// randread QD32 over TCP (perf), against about 1000 cheap yields a second.
func (r connReader) Read(p []byte) (int, error) {
	c := r.c
	if c.srv != nil && c.srv.closing.Load() {
		if c.snd.blocking {
			return 0, errStopped
		}
		c.lateRead = true
	}
	if c.snd.blocking {
		if now := time.Now(); c.queued.Load() != 0 || now.Sub(c.yielded) >= yieldEvery {
			c.yielded = now
			runtime.Gosched()
		}
	}
	return c.nc.Read(p)
}

// yieldEvery is how long the reader runs at most without yielding: well
// under sysmon's 10 ms.
const yieldEvery = time.Millisecond

// errSendTimeout ends a connection whose client took none of a reply for
// Config.SendTimeout.
var errSendTimeout = errors.New("client took no reply data within the send timeout")

// maxIovecs is how many buffers one sendmsg takes (IOV_MAX).
const maxIovecs = 1024

// sender is send's state. The function handed to RawConn.Write is a method
// value made once per connection and its arguments travel in these
// fields, so that a send allocates nothing. c.wmu guards it.
type sender struct {
	blocking bool // the socket is a blockingConn
	nowait   bool // trySend: stop where the socket's buffer is full
	bufs     [][]byte
	vec      []unix.Iovec
	err      error
	fn       func(fd uintptr) bool // s.write
}

// send writes bufs to the connection, all of it, or fails; c.wmu is held.
// bufs is consumed.
//
// Each sendmsg takes at most rawSendMax bytes and is first tried with
// MSG_DONTWAIT as a raw system call, which the Go scheduler does not see:
// a plain system call that runs past 20 us, as a send over TCP loopback
// does (it runs the receiver's side too), may have its P handed to another
// thread, and entering one wakes sysmon, which costs context switches per
// reply (measured: 1 MiB READs, 0.25 context switches each sent this way,
// 1.1 as plain system calls). The bound keeps each raw call short, since a
// garbage collection waits for every P: a single sendmsg of 4 MiB took 9
// to 12 ms under load. When the socket's buffer is full, a blocking socket
// waits in the kernel (a plain system call), a polled one in the poller.
func (c *conn) send(bufs [][]byte) error {
	if c.raw == nil {
		if c.tlsOut != nil {
			return c.sendTLS(bufs)
		}
		nb := net.Buffers(bufs)
		_, err := nb.WriteTo(c.nc)
		return err
	}
	s := &c.snd
	if s.fn == nil {
		s.fn = s.write
	}
	s.bufs, s.err = bufs, nil
	err := c.raw.Write(s.fn)
	clear(s.vec) // drop the pointers into request buffers
	s.bufs = nil
	if err == nil {
		err = s.err
	}
	return err
}

// errWouldBlock ends trySend where the socket's buffer is full.
var errWouldBlock = errors.New("socket buffer full")

// trySend sends what of bufs the socket takes now, without waiting, and
// returns the rest: nil once all is sent. A connection whose replies do
// not go out through send's raw path (TLS, a wrapper) sends nothing here.
// A failure breaks the stream, as in sendReply. c.wmu is held; bufs is
// consumed.
func (c *conn) trySend(bufs [][]byte) ([][]byte, error) {
	if c.raw == nil {
		return bufs, nil
	}
	s := &c.snd
	if s.fn == nil {
		s.fn = s.write
	}
	s.bufs, s.err, s.nowait = bufs, nil, true
	err := c.raw.Write(s.fn)
	left := s.bufs
	clear(s.vec)
	s.bufs, s.nowait = nil, false
	if err == nil {
		err = s.err
	}
	switch {
	case err == errWouldBlock:
		return left, nil
	case err != nil:
		c.breakStream(err)
		return nil, err
	}
	return nil, nil
}

// rawSendMax is the most one sendmsg sends: a whole 1 MiB READ reply with
// its chunk headers (28 bytes each; the 4 KiB covers a reply cut into up to
// 146 chunks around holes), about 250 us over TCP loopback on an idle
// machine. Cut in 256 KiB calls, as before, the same replies cost the
// server 1.4x the CPU per MiB and gave 0.72x the throughput in an A/B run
// on an idle machine (the loopback stack handles four sends and a 28-byte
// tail segment per reply); on a loaded machine one run showed the two
// equal and one showed a single call dearer (issue 18 in
// docs/benchmarks.md, test/bench/sendshape). Larger replies go out in
// calls of this size.
const rawSendMax = 1<<20 + 4<<10

func (s *sender) write(fd uintptr) bool {
	for {
		s.bufs = consume(s.bufs, 0) // no empty buffers in front
		if len(s.bufs) == 0 {
			return true
		}
		// At most rawSendMax bytes per call.
		clear(s.vec)
		s.vec = s.vec[:0]
		size := 0
		for _, p := range s.bufs[:min(len(s.bufs), maxIovecs)] {
			if len(p) == 0 {
				continue
			}
			n := min(len(p), rawSendMax-size)
			v := unix.Iovec{Base: &p[0]}
			v.SetLen(n)
			s.vec = append(s.vec, v)
			if size += n; size == rawSendMax {
				break
			}
		}
		msg := unix.Msghdr{Iov: &s.vec[0]}
		msg.SetIovlen(len(s.vec))
		ptr := uintptr(unsafe.Pointer(&msg))
		n, _, errno := syscall.RawSyscall(unix.SYS_SENDMSG, fd, ptr, unix.MSG_DONTWAIT|unix.MSG_NOSIGNAL)
		if errno == unix.EAGAIN && s.nowait {
			s.err = errWouldBlock
			return true
		}
		if errno == unix.EAGAIN && s.blocking {
			n, _, errno = syscall.Syscall(unix.SYS_SENDMSG, fd, ptr, unix.MSG_NOSIGNAL)
			if errno == unix.EAGAIN { // SO_SNDTIMEO passed without progress
				s.err = errSendTimeout
				return true
			}
		}
		switch errno {
		case 0:
			s.bufs = consume(s.bufs, int(n))
		case unix.EINTR:
		case unix.EAGAIN:
			return false // wait in the poller until the socket is writable
		default:
			s.err = errno
			return true
		}
	}
}

// consume drops the first n bytes of bufs.
func consume(bufs [][]byte, n int) [][]byte {
	for n > 0 && len(bufs) > 0 {
		if n < len(bufs[0]) {
			bufs[0] = bufs[0][n:]
			return bufs
		}
		n -= len(bufs[0])
		bufs = bufs[1:]
	}
	for len(bufs) > 0 && len(bufs[0]) == 0 {
		bufs = bufs[1:]
	}
	return bufs
}
