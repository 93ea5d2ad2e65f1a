package nbd

import (
	"encoding/binary"
	"net"
)

// Requests run by the reader. A READ or WRITE that the disk can do without
// waiting (pool.Nonblocking: the data is in the page cache, the blocks are
// allocated, no lock or QoS wait stands in the way) runs on the goroutine
// that decoded it, and its reply joins a batch that goes out with one
// writev when no further complete request is buffered. At queue depth 32 a
// single read(2) brings in many requests and a single writev answers them:
// no hand-off to a worker, no wake-up, one system call per batch instead
// of one per reply. Anything that would wait goes to the workers as before,
// so a request that needs the device never holds up the others.

// inlineMax is the largest READ or WRITE run by the reader: beyond it the
// copy costs more than the hand-off, and workers copy in parallel.
const inlineMax = 256 << 10

// Bounds on a batch of replies, so that a long run of buffered requests
// still gets answered as it goes.
const (
	batchMaxReplies = 64
	batchMaxBytes   = 1 << 20
)

// batch is the reader's replies not yet sent; only the reader touches it.
type batch struct {
	reqs  []*request
	iov   [][]byte
	nb    net.Buffers
	bytes int
}

// inline runs req on the reader if the disk can do it without waiting. It
// reports false, having changed nothing the client can see, when req must
// go to a worker.
func (c *conn) inline(req *request) bool {
	if c.nb == nil || req.length > inlineMax {
		return false
	}
	off, n := int64(req.off), int(req.length)
	switch req.typ {
	case cmdRead:
		if c.structured && n >= holeThreshold && req.flags&cmdFlagDF == 0 {
			return false // may have holes to send as such
		}
		if errno, _ := c.validate(req); errno != 0 {
			return false
		}
		req.buf, req.room = getBuf(replyRoom+n), replyRoom
		if err := c.nb.TryReadAt((*req.buf)[replyRoom:], off); err != nil {
			putBuf(req.buf)
			req.buf, req.room = nil, 0
			return false
		}
		c.queueReply(req, c.dataHeader(req, off, n))
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
		h := req.reply[:simpleReplySize]
		binary.BigEndian.PutUint32(h[0:], magicSimpleReply)
		binary.BigEndian.PutUint32(h[4:], 0)
		binary.BigEndian.PutUint64(h[8:], req.cookie)
		c.queueReply(req, h)
		return true
	}
	return false
}

// queueReply adds a reply (the bytes to send, which live in req) to the
// batch; req is released once the batch is sent.
func (c *conn) queueReply(req *request, b []byte) {
	c.out.reqs = append(c.out.reqs, req)
	c.out.iov = append(c.out.iov, b)
	c.out.bytes += len(b)
	if len(c.out.reqs) >= batchMaxReplies || c.out.bytes >= batchMaxBytes {
		c.flushOut()
	}
}

// flushOut sends the batch with one writev and releases its requests.
func (c *conn) flushOut() {
	if len(c.out.reqs) == 0 {
		return
	}
	c.wmu.Lock()
	c.out.nb = c.out.iov
	_, err := c.out.nb.WriteTo(c.nc)
	c.wmu.Unlock()
	if err != nil {
		c.log.Debug("reply failed", "err", err)
		_ = c.nc.Close() // the stream is broken; the reader will notice
	}
	for i, r := range c.out.reqs {
		r.release()
		c.out.reqs[i], c.out.iov[i] = nil, nil
	}
	c.out.reqs, c.out.iov, c.out.nb, c.out.bytes = c.out.reqs[:0], c.out.iov[:0], nil, 0
}
