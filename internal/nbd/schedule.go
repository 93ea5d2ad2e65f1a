package nbd

import (
	"encoding/binary"
	"sync"
	"time"
)

// Where requests run. The reader validates every request once as it reads
// it (validate) and exec runs it; what is decided here is only which
// goroutine calls exec, whether it may wait for the device, and how the
// replies of successful READs and WRITEs go out. There are three places:
//
//   - The reader. A READ or WRITE that the disk can do without waiting
//     (pool.Nonblocking: the data is in the page cache, the blocks are
//     allocated, no lock or QoS wait stands in the way) runs on the goroutine
//     that decoded it, and its reply joins a batch that goes out with one
//     sendmsg when no further complete request is buffered. At queue depth
//     32 a single read(2) brings in many requests and a single sendmsg
//     answers them: no hand-off, no wake-up, one system call per batch
//     instead of one per reply. A refused request is answered here too. A
//     lone READ or WRITE (nothing queued, nothing more in the socket buffer)
//     also runs here even if it must wait: handing it on would add two
//     scheduler wake-ups to its latency and some 25 us of CPU (measured at
//     queue depth 1), and at queue depth 1 nothing else arrives meanwhile.
//   - The write executor. Small WRITEs without FUA that the reader cannot do
//     (the filesystem takes no RWF_NOWAIT for writes, as ext4; blocks to
//     allocate; a chunk to copy up; QoS tokens to wait for) go to one
//     goroutine per connection that runs them in order and answers them in
//     batches the same way. Buffered writes to one file are serialized by
//     the kernel (the inode lock) whatever we do, so running them from
//     sixteen workers buys no parallelism: it only blocks sixteen threads on
//     that lock and sends sixteen replies one by one. The reader keeps
//     reading meanwhile. A reply waits in the executor's batch at most
//     replyHold, so a WRITE that waits long never holds up the replies of
//     those before it. Only a local file has an executor (its handle is
//     pool.Nonblocking): the writes of a replicated or forwarded disk wait
//     for a peer, not for an inode lock, and go to the workers.
//   - The workers. Everything else (READs that would wait, FUA, FLUSH, TRIM,
//     WRITE_ZEROES, BLOCK_STATUS, CACHE, large requests) so that a request
//     that waits never holds up reading.
//
// A disk served elsewhere that can start requests without waiting
// (pool.Starter: a forwarded disk) has its READs and WRITEs started by the
// reader itself, and answered by whoever learns their end (started.go):
// none of the three places above runs them.
//
// With one worker (Config.Workers 1) there is no write executor, nothing is
// started, and the reader runs a request only when nothing is queued: every
// request runs in the order it came and replies keep that order.
//
// Ordering: replies never interleave (c.wmu). A FLUSH covers every write
// completed before it, wherever it ran: a write is answered only after it
// returned from the disk, and all connections to a disk share its file.

// inlineMax is the largest READ or WRITE run by the reader (and the
// largest WRITE for the write executor). Copies from and to the page cache
// are cheap next to what a worker costs on a small machine: 1 MiB READs over
// TCP took 480 us of CPU each through the workers and 280 us on the reader,
// with 2 cores.
const inlineMax = 2 << 20

// Bounds on a batch of replies, so that a long run of buffered requests
// still gets answered as it goes.
const (
	batchMaxReplies = 64
	batchMaxBytes   = 1 << 20
)

// writeQueue is the capacity of the write executor's queue.
const writeQueue = 64

// runner is what exec is told about where it runs.
type runner struct {
	// nowait: run only what the disk can do without waiting; exec reports
	// false for anything else.
	nowait bool
	// out, if not nil, is the batch of the goroutine that runs exec (the
	// reader's c.out, the write executor's own): successful READ and WRITE
	// replies join it. Every other reply goes out at once, after it.
	out *batch
}

// The runners: the reader tries a request without waiting, and runs a lone
// one even if it waits; the write executor runs its queue; the workers run
// the rest.
func (c *conn) readerTry() runner { return runner{nowait: true, out: &c.out} }
func (c *conn) readerRun() runner { return runner{out: &c.out} }

var workerRun = runner{}

// schedule decides where req, read and validated, runs: on the reader (now),
// the write executor or a worker.
// Small READs and WRITEs with more requests buffered join the reader's I/O
// batch (iobatch.go), which is tried as a whole.
func (c *conn) schedule(req *request) {
	if c.startable(req) {
		c.start(req)
		return
	}
	if c.batchable(req) {
		c.addIO(req)
		return
	}
	c.runIOs()
	inOrder := c.srv.cfg.Workers == 1 && c.queued.Load() != 0 // one worker: requests run in the order they came
	if !inOrder && c.exec(req, c.readerTry()) {
		return
	}
	c.handOn(req, c.lone(req))
}

// handOn runs req, which the reader could not do without waiting: on the
// reader if here, else on the write executor or a worker.
func (c *conn) handOn(req *request, here bool) {
	// Replies already made go first: what follows may wait, and with one
	// worker replies keep the order of their requests.
	c.flushOut(&c.out)
	if c.st != nil {
		c.st.Unplug()
	}
	if here {
		c.exec(req, c.readerRun())
		return
	}
	q := c.reqs
	if c.writes != nil && serialWrite(req) {
		q = c.writes
	}
	c.queued.Add(1)
	q <- req
}

// lone reports whether req runs on the reader although it may wait: a READ
// or a small WRITE without FUA, with nothing queued and nothing more
// buffered. Writes with FUA wait for the device and go to a worker.
func (c *conn) lone(req *request) bool {
	if c.queued.Load() != 0 || c.r.Buffered() != 0 || c.tlsPending() {
		return false
	}
	return req.typ == cmdRead || serialWrite(req)
}

// serialWrite reports whether req is a small WRITE without FUA: one the
// write executor runs, or the reader when it comes alone.
func serialWrite(req *request) bool {
	return req.typ == cmdWrite && req.flags == 0 && req.length <= inlineMax
}

// work is a worker: it runs the requests handed to it.
func (c *conn) work() {
	for req := range c.reqs {
		c.exec(req, workerRun)
		c.queued.Add(-1)
	}
}

// replyHold bounds how long a reply waits in the write executor's batch.
// The executor sends its batch when its queue runs empty, but a WRITE can
// wait long with replies of earlier ones in the batch: for QoS tokens, for
// the volume's I/O gate during a snapshot, for dirty-page writeback. Those
// earlier replies then go out after at most replyHold, from a timer; at
// full speed the queue runs empty (or the batch fills) long before that,
// and the timer never fires.
const replyHold = 500 * time.Microsecond

// writeLoop is the write executor: it runs the queued WRITEs in order and
// sends their replies when the queue runs empty, the batch is full, or the
// oldest reply has waited replyHold.
func (c *conn) writeLoop() {
	b := &batch{}
	b.hold = time.AfterFunc(time.Hour, func() { c.flushOut(b) })
	b.hold.Stop()
	defer func() {
		b.hold.Stop()
		c.flushOut(b)
	}()
	r := runner{out: b}
	for req := range c.writes {
		c.exec(req, r)
		c.queued.Add(-1)
		if len(c.writes) == 0 {
			c.flushOut(b)
		}
	}
}

// batch is replies not yet sent; each belongs to one goroutine (the
// reader's is conn.out, the write executor has its own), and the write
// executor's also to its timer (hold), which sends it when its oldest reply
// has waited replyHold. mu orders the two; a batch without a timer (the
// reader's) has one owner and takes no lock.
type batch struct {
	mu    sync.Mutex
	hold  *time.Timer
	reqs  []*request
	iov   [][]byte
	bytes int
}

func (b *batch) lock() {
	if b.hold != nil {
		b.mu.Lock()
	}
}

func (b *batch) unlock() {
	if b.hold != nil {
		b.mu.Unlock()
	}
}

// answer replies to req, which ran with r, and releases it once the reply
// is sent: the refusal validate wrote into req, else err (mapped to an NBD
// error), else success, in r's batch if it has one.
func (c *conn) answer(req *request, r runner, err error) {
	switch {
	case req.errno != 0:
		c.flushOut(r.out)
		c.replyError(req, req.errno, req.msg)
	case err != nil:
		c.flushOut(r.out)
		c.failed(req, err)
	case r.out != nil:
		c.queueReply(r.out, req, c.okHeader(req))
		return
	default:
		c.replyOK(req)
	}
	req.release()
}

// answerData sends the data of a READ that succeeded, from buf (in req.buf,
// after req.room bytes), in r's batch if it has one and the buffer has room
// for the header; it releases req once the reply is sent.
func (c *conn) answerData(req *request, r runner, off int64, buf []byte) {
	if r.out != nil && req.room >= replyRoom {
		c.queueReply(r.out, req, c.dataHeader(req, off, len(buf)))
		return
	}
	c.flushOut(r.out)
	c.replyData(req, off, buf)
	req.release()
}

// okHeader fills in a simple reply without error for req.
func (c *conn) okHeader(req *request) []byte {
	h := req.reply[:simpleReplySize]
	binary.BigEndian.PutUint32(h[0:], magicSimpleReply)
	binary.BigEndian.PutUint32(h[4:], 0)
	binary.BigEndian.PutUint64(h[8:], req.cookie)
	return h
}

// queueReply adds a reply (the bytes to send, which live in req) to b; req
// is released once b is sent.
func (c *conn) queueReply(b *batch, req *request, p []byte) {
	b.lock()
	defer b.unlock()
	b.reqs = append(b.reqs, req)
	b.iov = append(b.iov, p)
	b.bytes += len(p)
	switch {
	case len(b.reqs) >= batchMaxReplies || b.bytes >= batchMaxBytes:
		c.sendBatch(b)
	case len(b.reqs) == 1 && b.hold != nil:
		b.hold.Reset(replyHold)
	}
}

// flushOut sends b (if any) with one sendmsg and releases its requests.
func (c *conn) flushOut(b *batch) {
	if b == nil {
		return
	}
	b.lock()
	c.sendBatch(b)
	b.unlock()
}

// sendBatch sends b with one sendmsg and releases its requests; b is locked.
func (c *conn) sendBatch(b *batch) {
	if len(b.reqs) == 0 {
		return
	}
	if b.hold != nil {
		b.hold.Stop()
	}
	c.wmu.Lock()
	_ = c.sendReply(b.iov)
	c.wmu.Unlock()
	for i, r := range b.reqs {
		r.release()
		b.reqs[i], b.iov[i] = nil, nil
	}
	b.reqs, b.iov, b.bytes = b.reqs[:0], b.iov[:0], 0
}
