package nbd

import "github.com/quiverstorage/quiver/internal/pool"

// The reader's batch of file I/O. At queue depth 32 one read(2) of the
// socket brings in many small READs and WRITEs; rather than try each
// without waiting on its own (one preadv2 or pwritev2 each), the reader
// collects them while further complete requests are buffered and tries
// them together (pool.Batcher: one io_uring_enter for the batch where the
// storage layer has io_uring, storage.IOUring). Those done join the
// reader's batch of replies; the rest go on as any request the reader
// could not do without waiting (schedule). Nothing else changes: a request
// is still validated once, answered once, and a request that is not a
// small READ or WRITE first runs the batch collected before it, so that a
// FLUSH read after a WRITE is never handed on before that WRITE.

// Bounds on the reader's I/O batch: one io_uring's worth of requests, each
// small enough that no hole lookup or sendfile would apply to it.
const (
	ioBatchMax   = 64
	ioBatchBytes = 128 << 10
)

// ioBatch is the reader's batch: the requests and their IOs, index by
// index. It belongs to the reader and lives in the connection, so that
// the hot path allocates nothing.
type ioBatch struct {
	reqs [ioBatchMax]*request
	ios  [ioBatchMax]pool.IO
	n    int
}

// batchable reports whether req joins the reader's I/O batch: a valid READ
// or WRITE without FUA of at most ioBatchBytes, on a disk that can try a
// batch, with more requests behind it (buffered) or before it (batched).
// A lone request takes the ordinary path, which also runs it if it waits.
func (c *conn) batchable(req *request) bool {
	if c.bt == nil || req.errno != 0 || req.length > ioBatchBytes {
		return false
	}
	if req.typ != cmdRead && !(req.typ == cmdWrite && req.flags == 0) {
		return false
	}
	return c.iob.n > 0 || c.moreBuffered()
}

// addIO adds req, batchable, to the reader's batch and runs the batch when
// it is full or nothing further is buffered.
func (c *conn) addIO(req *request) {
	b := &c.iob
	io := &b.ios[b.n]
	io.Write, io.Off = req.typ == cmdWrite, int64(req.off)
	if io.Write {
		io.P = *req.buf
	} else {
		req.buf, req.room = getBuf(replyRoom+int(req.length)), replyRoom
		io.P = (*req.buf)[replyRoom:]
	}
	b.reqs[b.n] = req
	b.n++
	if b.n == ioBatchMax || !c.moreBuffered() {
		c.runIOs()
	}
}

// runIOs tries the reader's batch and answers what was done; the rest is
// handed on (schedule), after the replies of what was done have gone out.
func (c *conn) runIOs() {
	b := &c.iob
	if b.n == 0 {
		return
	}
	n := b.n
	b.n = 0
	if c.broken.Load() {
		for i, req := range b.reqs[:n] {
			req.release()
			b.reqs[i], b.ios[i] = nil, pool.IO{}
		}
		return
	}
	c.bt.TryBatch(b.ios[:n])
	r := c.readerTry()
	for i, req := range b.reqs[:n] {
		io := &b.ios[i]
		switch {
		case io.Err != nil:
			continue
		case io.Write:
			c.writeGen.Add(1)
			c.answer(req, r, nil)
		default:
			c.answerData(req, r, io.Off, io.P)
		}
		b.reqs[i], b.ios[i] = nil, pool.IO{}
	}
	last := -1
	for i, req := range b.reqs[:n] {
		if req != nil {
			last = i
		}
	}
	for i, req := range b.reqs[:last+1] {
		if req == nil {
			continue
		}
		if req.typ == cmdRead {
			putBuf(req.buf)
			req.buf, req.room = nil, 0
		}
		b.reqs[i], b.ios[i] = nil, pool.IO{}
		// Only the last may run here while it waits, as a lone request
		// does: the others are behind it.
		c.handOn(req, i == last && c.lone(req))
	}
}

// readerFlush runs the reader's I/O batch, sends its replies and the
// requests started on the disk (started.go): before the reader waits for
// anything.
func (c *conn) readerFlush() {
	c.runIOs()
	c.flushOut(&c.out)
	if c.st != nil {
		c.st.Unplug()
	}
}
