package nbd

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/quiverstorage/quiver/internal/pool"
)

// conn is one client connection.
type conn struct {
	srv *Server
	nc  net.Conn
	// ncMu orders the connection's swaps of nc (to TLS, to a blocking
	// socket) against other goroutines' use of it (Shutdown, a revoked
	// attachment): they take it; the connection's own goroutine reads nc
	// without it.
	ncMu sync.Mutex
	raw  syscall.RawConn // nc's socket, for send; nil when nc is not one
	snd  sender          // send's state (socket.go)
	// sfile is sendFile's state (sendfile.go); c.wmu guards it.
	sfile fileSender
	// tlsOut buffers replies on a TLS connection (tls.go); nil on a plain
	// one.
	tlsOut *bufio.Writer
	tlsTr  *tlsTransport // the socket under the TLS connection (tls.go)
	bigReq bool          // the last request read was a READ or WRITE above ioBatchBytes (moreBuffered); reader only
	// lateRead: a read of the socket began after Shutdown did (reader
	// only). Requests received before are served, as in flight; those
	// that may come from a later read get ESHUTDOWN (readRequest).
	lateRead bool
	r        *bufio.Reader
	log      *slog.Logger
	// peer is the key the connection is counted under (connlimit.Peer).
	peer string
	// handshakeDeadline ends negotiation (Config.HandshakeTimeout).
	handshakeDeadline time.Time

	// Set by negotiation, read-only in the transmission phase.
	disk pool.Disk
	// caps are the disk's capabilities as it declares them
	// (pool.CapabilitiesOf), never found by asserting its type: a wrapper
	// (metrics, replication, lease fencing) would defeat that.
	caps pool.Capabilities
	nb   pool.Nonblocking // caps.Nonblocking: the disk can try requests without waiting
	// bt is the disk when the reader tries its small READs and WRITEs in
	// batches (iobatch.go); nil with one worker.
	bt pool.Batcher
	// st is the disk when the reader starts READs and WRITEs on it
	// without waiting (started.go); nil with one worker.
	st          pool.Starter
	revoked     <-chan struct{} // closed when the client's attachment ends
	export      string
	description string
	size        int64
	flags       uint16
	structured  bool
	baseAlloc   bool
	bitmaps     []dirtyBitmap // the qemu:dirty-bitmap: contexts selected (metacontext.go)

	wmu  sync.Mutex // one reply at a time on the wire
	reqs chan *request
	// writes carries small WRITEs without FUA to the connection's write
	// executor (schedule.go); nil with one worker, where every request runs
	// in the order it came.
	writes chan *request
	// writeGen counts writes completed without FUA; flushedGen is the
	// writeGen a completed FLUSH covered (read before its fdatasync). A
	// connection that ends with them different is flushed by the server.
	writeGen, flushedGen atomic.Uint64
	// queued counts requests handed to workers and not yet answered.
	queued atomic.Int32
	// out holds the replies of requests run by the reader (schedule.go).
	out batch
	// iob is the reader's batch of READs and WRITEs to try (iobatch.go).
	iob ioBatch
	// ends holds the replies of started requests (started.go), started
	// counts those not answered yet. draining (guarded by ends.mu) is set
	// while drainEnds sends the ends that the client did not take at once;
	// drain counts that goroutine.
	ends     batch
	started  sync.WaitGroup
	draining bool
	drain    sync.WaitGroup
	// yielded is when the reader last yielded its P (socket.go).
	yielded time.Time

	// Bytes reserved by requests in flight (memory.go).
	inflight atomic.Int64
	memWait  atomic.Bool   // the reader waits for inflight to drop
	memWake  chan struct{} // capacity 1: wakes the reader in waitConn
	peak     int64         // the most inflight has been (reader only)
	peerMem  *peerBytes    // the bytes in flight of the connection's peer
	// broken is set once a reply failed to go out: the stream is lost, so
	// the requests already buffered are neither run nor answered.
	broken atomic.Bool
}

func (c *conn) open(ctx context.Context, name string) error {
	c.closeDisk()
	start := time.Now()
	if !c.handshakeDeadline.IsZero() {
		// The open is the negotiation's: it ends in time for its refusal
		// to reach the client before the handshake deadline (a node that
		// forwards to a primary that does not answer must not hold the
		// connection's handshake slot any longer).
		margin := min(c.srv.cfg.HandshakeTimeout/10, openReplyMargin)
		var cancel context.CancelFunc
		ctx, cancel = context.WithDeadline(ctx, c.handshakeDeadline.Add(-margin))
		defer cancel()
	}
	forwarded := false
	if f := c.srv.cfg.Forwarded; f != nil {
		if export, ok := f(name); ok {
			name, forwarded = export, true
		}
	}
	x, err := c.srv.exports.Open(c.withPeerCertificate(ctx), name, c.nc.RemoteAddr().String())
	if err != nil {
		if code := openErrorCode(err); !forwarded && (code == repErrPolicy || code == repErrUnknown) {
			// Config.RefusalTime: every such refusal takes as long.
			hold := time.Until(start.Add(c.srv.cfg.RefusalTime))
			if dl, ok := ctx.Deadline(); ok {
				hold = min(hold, time.Until(dl))
			}
			if hold > 0 {
				time.Sleep(hold)
			}
		}
		return fmt.Errorf("export %q: %w", RedactToken(name), err)
	}
	c.disk, c.revoked, c.export, c.description, c.size = x.Disk, x.Revoked, RedactToken(name), x.Description, x.Disk.Size()
	c.caps = pool.CapabilitiesOf(x.Disk)
	c.nb = c.caps.Nonblocking
	return nil
}

// openReplyMargin is how long before the handshake deadline an export's
// open is cut short (at most a tenth of the handshake timeout), so that the
// refusal is still sent.
const openReplyMargin = 500 * time.Millisecond

func (c *conn) closeDisk() {
	if c.disk != nil {
		_ = c.disk.Close()
		c.disk, c.caps, c.nb, c.bt = nil, pool.Capabilities{}, nil, nil
	}
}

// setFlags computes the transmission flags: they advertise exactly what the
// export does. Flush reaches the disk's shared file, so any connection's
// FLUSH covers writes completed on every connection: multi-conn is safe.
func (c *conn) setFlags(n *negotiation) {
	c.structured, c.baseAlloc = n.structured, n.baseAlloc
	f := uint16(tflagHasFlags | tflagSendFlush | tflagCanMultiConn | tflagSendCache)
	if c.disk.ReadOnly() {
		f |= tflagReadOnly
	} else {
		f |= tflagSendFUA | tflagSendTrim | tflagSendWriteZeroes | tflagSendFastZero
	}
	if c.structured {
		f |= tflagSendDF
	}
	c.flags = f
}

// request is one transmission-phase request with its buffers; requests are
// pooled so that the hot path does not allocate.
type request struct {
	hdr    [requestHeaderSize]byte
	flags  uint16
	typ    uint16
	cookie uint64
	off    uint64
	length uint32
	buf    *[]byte // WRITE payload, or READ data after room bytes
	room   int     // bytes free in front of READ data for the reply header

	reply [64]byte // reply header space
	iov   [2][]byte

	// validate's verdict, set once by the reader: when errno is not zero the
	// request is refused with errno and msg, and nothing of it runs.
	errno uint32
	msg   string

	cost int64 // bytes reserved by conn.reserve, given back on release
	conn *conn // the connection that reserved them

	// A request started on the disk (started.go): its connection, and
	// ended as a pool.Done, made once per pooled request.
	owner *conn
	endFn func(err error, more bool)
}

var requestPool = sync.Pool{New: func() any { return new(request) }}

func (r *request) release() {
	if r.cost != 0 {
		r.conn.unreserve(r.cost)
		r.cost, r.conn = 0, nil
	}
	putBuf(r.buf)
	r.buf, r.room = nil, 0
	r.errno, r.msg = 0, ""
	r.owner = nil
	requestPool.Put(r)
}

// serve runs the transmission phase: one reader (this goroutine) reads and
// validates requests, and runs each or hands it to the write executor or a
// worker (schedule.go); replies go out in any order.
func (c *conn) serve(ctx context.Context) error {
	c.reqs = make(chan *request, c.srv.cfg.Workers)
	c.memWake = make(chan struct{}, 1)
	if c.srv.cfg.Workers > 1 && c.nb != nil {
		c.bt = c.caps.Batcher
		// A local file (schedule.go). A disk that cannot try requests
		// without waiting writes over the network (a replicated or
		// forwarded disk): its writes wait for a peer, not for the
		// file's inode lock, and run on the workers side by side.
		c.writes = make(chan *request, writeQueue)
	}
	if c.srv.cfg.Workers > 1 && c.caps.Starter != nil {
		c.st = c.caps.Starter
		c.startEnds()
	}
	var wg sync.WaitGroup
	for range c.srv.cfg.Workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c.work()
		}()
	}
	if c.writes != nil {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c.writeLoop()
		}()
	}
	err := c.readLoop()
	close(c.reqs)
	if c.writes != nil {
		close(c.writes)
	}
	wg.Wait() // drain: every request read gets its reply
	c.started.Wait()
	if c.st != nil {
		c.finishEnds()
	}
	c.flushOnClose()
	return err
}

// flushOnClose flushes the writes that the client did not flush before it
// went away. Nobody is left to answer: a failure is logged at error level
// (the disk's metrics count it too), since those writes may be lost.
func (c *conn) flushOnClose() {
	if c.disk == nil || c.writeGen.Load() == c.flushedGen.Load() {
		return
	}
	if err := c.disk.Flush(); err != nil {
		c.log.Error("flush on disconnect failed: writes the client did not flush may be lost",
			"export", c.export, "err", err)
	}
}

var errDisconnect = errors.New("client disconnected (NBD_CMD_DISC)")

// errBroken ends the reader once a reply could not be sent.
var errBroken = errors.New("a reply could not be sent: connection broken")

func (c *conn) readLoop() error {
	defer c.readerFlush()
	for {
		if c.broken.Load() {
			return errBroken
		}
		// Send the replies of requests run here before waiting for input:
		// a reply is never held back while the reader blocks.
		if !c.moreBuffered() {
			c.readerFlush()
		}
		req, err := c.readRequest()
		if err != nil {
			return err
		}
		c.schedule(req)
	}
}

// readRequest reads the next request, with its payload, and validates it.
// It fails, ending the connection, where the stream cannot be followed or
// the client asked to end it: a bad magic, a WRITE payload over
// maxPayload, a client gone mid-request, NBD_CMD_DISC.
func (c *conn) readRequest() (*request, error) {
	req := requestPool.Get().(*request)
	if _, err := io.ReadFull(c.r, req.hdr[:]); err != nil {
		req.release()
		return nil, err
	}
	h := req.hdr[:]
	if binary.BigEndian.Uint32(h[0:]) != magicRequest {
		req.release()
		return nil, errors.New("bad request magic")
	}
	req.flags = binary.BigEndian.Uint16(h[4:])
	req.typ = binary.BigEndian.Uint16(h[6:])
	req.cookie = binary.BigEndian.Uint64(h[8:])
	req.off = binary.BigEndian.Uint64(h[16:])
	req.length = binary.BigEndian.Uint32(h[24:])
	c.bigReq = req.length > ioBatchBytes && (req.typ == cmdRead || req.typ == cmdWrite)
	if (req.typ == cmdRead || req.typ == cmdWrite) && req.length <= maxPayload {
		c.reserve(req, int64(req.length)) // may wait for replies to drain
	}
	if req.typ == cmdWrite {
		if req.length > maxPayload {
			req.release()
			return nil, fmt.Errorf("write of %d bytes exceeds the maximum payload %d", req.length, maxPayload)
		}
		if c.r.Buffered() < int(req.length) {
			c.readerFlush()
		}
		req.buf = getBuf(int(req.length))
		if _, err := io.ReadFull(c.r, *req.buf); err != nil {
			req.release()
			return nil, fmt.Errorf("client vanished mid-payload: %w", err)
		}
	}
	if req.typ == cmdDisc {
		req.release()
		return nil, errDisconnect
	}
	if c.srv.closing.Load() && c.lateRead {
		req.errno, req.msg = errShutdown, errShuttingDown.Error()
	} else {
		req.errno, req.msg = c.validate(req)
	}
	return req, nil
}
