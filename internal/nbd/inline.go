package nbd

import (
	"encoding/binary"
)

// Requests run by the reader. A READ or WRITE that the disk can do without
// waiting (pool.Nonblocking: the data is in the page cache, the blocks are
// allocated, no lock or QoS wait stands in the way) runs on the goroutine
// that decoded it, and its reply joins a batch that goes out with one
// sendmsg when no further complete request is buffered. At queue depth 32 a
// single read(2) brings in many requests and a single sendmsg answers them:
// no hand-off to a worker, no wake-up, one system call per batch instead
// of one per reply. Anything that would wait goes elsewhere, so a request
// that needs the device never holds up reading.
//
// Small WRITEs without FUA that the reader cannot do (the filesystem takes
// no RWF_NOWAIT for writes, as ext4; blocks to allocate; a chunk to copy up)
// go to the connection's write executor, one goroutine that runs them in
// order and answers them in batches the same way. Buffered writes to one
// file are serialized by the kernel (the inode lock) whatever we do, so
// running them from sixteen workers buys no parallelism: it only blocks
// sixteen threads on that lock and sends sixteen replies one by one. The
// reader keeps reading while the executor writes. Everything else (READs
// that would wait, FUA, FLUSH, TRIM, large requests) goes to the workers.

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

// batch is replies not yet sent; each belongs to one goroutine (the
// reader's is conn.out, the write executor has its own).
type batch struct {
	reqs  []*request
	iov   [][]byte
	bytes int
}

// writeQueue is the capacity of the write executor's queue.
const writeQueue = 64

// serialWrite reports whether req is a small WRITE without FUA: one the
// write executor runs, or the reader when it comes alone.
func serialWrite(req *request) bool {
	return req.typ == cmdWrite && req.flags == 0 && req.length <= inlineMax
}

// writeLoop is the write executor: it runs the queued WRITEs in order and
// sends their replies when the queue runs empty (or the batch is full).
func (c *conn) writeLoop() {
	var b batch
	defer c.flushOut(&b)
	for req := range c.writes {
		c.serialWrite(req, &b)
		c.queued.Add(-1)
		if len(c.writes) == 0 {
			c.flushOut(&b)
		}
	}
}

func (c *conn) serialWrite(req *request, b *batch) {
	if c.broken.Load() {
		req.release()
		return
	}
	if errno, msg := c.validate(req); errno != 0 {
		c.replyError(req, errno, msg)
		req.release()
		return
	}
	if err := c.disk.WriteAt(*req.buf, int64(req.off), false); err != nil {
		c.failed(req, err)
		req.release()
		return
	}
	c.writeGen.Add(1)
	c.queueReply(b, req, c.okHeader(req))
}

// inline runs req on the reader if the disk can do it without waiting. It
// reports false, having changed nothing the client can see, when req must
// go to a worker.
func (c *conn) inline(req *request) bool {
	if c.nb == nil || req.length > inlineMax {
		return false
	}
	if c.srv.cfg.Workers == 1 && c.queued.Load() != 0 {
		return false // one worker: requests run in the order they came
	}
	off, n := int64(req.off), int(req.length)
	switch req.typ {
	case cmdRead:
		if errno, _ := c.validate(req); errno != 0 {
			return false
		}
		if c.structured && n >= holeThreshold && req.flags&cmdFlagDF == 0 {
			// Holes go out as holes: the lookup is two lseek calls on
			// cached metadata, the sparse reply is the workers' job.
			if ext, err := c.disk.Extents(off, int64(n), 0); err != nil || hasHole(ext) {
				return false
			}
		}
		req.buf, req.room = getBuf(replyRoom+n), replyRoom
		if err := c.nb.TryReadAt((*req.buf)[replyRoom:], off); err != nil {
			putBuf(req.buf)
			req.buf, req.room = nil, 0
			return false
		}
		c.queueReply(&c.out, req, c.dataHeader(req, off, n))
		return true
	case cmdWrite:
		if req.flags != 0 { // FUA waits for the device
			return false
		}
		if errno, _ := c.validate(req); errno != 0 {
			return false
		}
		if err := c.nb.TryWriteAt(*req.buf, off); err != nil {
			return false
		}
		c.writeGen.Add(1)
		c.queueReply(&c.out, req, c.okHeader(req))
		return true
	}
	return false
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
	b.reqs = append(b.reqs, req)
	b.iov = append(b.iov, p)
	b.bytes += len(p)
	if len(b.reqs) >= batchMaxReplies || b.bytes >= batchMaxBytes {
		c.flushOut(b)
	}
}

// flushOut sends b with one sendmsg and releases its requests.
func (c *conn) flushOut(b *batch) {
	if len(b.reqs) == 0 {
		return
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
