package nbd

import (
	"encoding/binary"
	"time"
)

// Requests started on a disk served elsewhere (pool.Starter: a forwarded
// disk, whose every request is a round trip to another node). The reader
// starts each valid READ and WRITE there itself, as it decodes it, and
// goes on reading: no worker is woken, and the requests of one burst from
// the client leave together when the reader has nothing more buffered
// (Unplug, in readerFlush). The goroutine that learns a request's end (the
// disk's reply reader) answers it: its reply joins the connection's batch
// of ends, sent with one sendmsg when no further end follows at once
// (pool.Done's more), when it is full, or when its oldest reply has waited
// replyHold (a run of ends that stops early: a request sent again to a new
// primary ends later, from elsewhere). One wake-up per request each way
// instead of four hand-offs. The reply reader never waits for the client:
// what the client's socket does not take at once goes on from a goroutine
// of its own (pushEnds).
//
// Nothing else changes: a request is validated once, answered once; the
// other commands go to the workers as on any disk (a FLUSH covers the
// writes answered before it, and a started write is answered only once the
// disk ended it); with one worker nothing is started, so that replies keep
// the order of their requests. The connection ends only once every started
// request has ended and been answered.

// startable reports whether the reader starts req on the disk: a valid
// READ or WRITE on a disk that starts requests (set only with more than
// one worker).
func (c *conn) startable(req *request) bool {
	return c.st != nil && req.errno == 0 && (req.typ == cmdRead || req.typ == cmdWrite) && !c.broken.Load()
}

// start starts req on the disk; ended answers it.
func (c *conn) start(req *request) {
	c.started.Add(1)
	req.owner = c
	if req.endFn == nil {
		req.endFn = req.ended // made once per pooled request: starting allocates nothing here
	}
	off := int64(req.off)
	if req.typ == cmdWrite {
		c.st.StartWrite(*req.buf, off, req.flags&cmdFlagFUA != 0, req.endFn)
		return
	}
	// Room for the reply header in front of the data, as the reader's
	// reads have: header and data go out from one buffer.
	n, room := int(req.length), 0
	if n <= inlineMax {
		room = replyRoom
	}
	req.buf, req.room = getBuf(room+n), room
	c.st.StartRead((*req.buf)[room:], off, req.endFn)
}

// ended answers a started request with its end (pool.Done), in the
// connection's batch of ends, and sends the batch unless more ends follow
// at once. It never waits for the client (pushEnds): the goroutine that
// calls it is the disk's reply reader, which must go on reading the ends
// of other requests, the connection's own and, were the disk's upstream
// shared, those of other connections. req is released once its reply is
// sent.
func (req *request) ended(err error, more bool) {
	c := req.owner
	if err != nil {
		// Rare, and its reply may wait (c.wmu; ErrAbandon closes the
		// connection): from a goroutine of its own.
		go func() {
			c.failed(req, err)
			req.release()
			c.started.Done()
		}()
		return
	}
	h, data := c.endReply(req)
	b := &c.ends
	b.mu.Lock()
	b.reqs = append(b.reqs, req)
	b.iov = append(b.iov, h)
	if data != nil {
		b.iov = append(b.iov, data)
	}
	b.bytes += len(h) + len(data)
	switch {
	case !more || len(b.reqs) >= batchMaxReplies || b.bytes >= batchMaxBytes:
		c.pushEnds()
	case len(b.reqs) == 1:
		b.hold.Reset(replyHold)
	}
	b.mu.Unlock()
	c.started.Done()
}

// endReply returns the reply of a started request that succeeded: a
// header, and a READ's data when it is not in the same buffer (a READ
// above inlineMax, read without room in front).
func (c *conn) endReply(req *request) (h, data []byte) {
	switch {
	case req.typ != cmdRead:
		if req.flags&cmdFlagFUA == 0 {
			c.writeGen.Add(1)
		}
		return c.okHeader(req), nil
	case req.room >= replyRoom:
		return c.dataHeader(req, int64(req.off), len(*req.buf)-req.room), nil
	case !c.structured:
		return c.okHeader(req), (*req.buf)[req.room:]
	}
	data = (*req.buf)[req.room:]
	var off [8]byte
	binary.BigEndian.PutUint64(off[:], req.off)
	return chunkHeader(req, replyFlagDone, replyTypeOffsetData, off[:], len(data)), data
}

// pushEnds sends the batch of ends as far as the client's socket takes it
// without waiting. What it does not take (a client slower than its
// replies come, or one that stopped reading), or all of it when another
// reply is being sent, goes on from a goroutine of its own (drainEnds),
// and the ends that come meanwhile wait in the batch for it: the batch is
// bounded by the requests in flight, which the connection's memory budget
// bounds (memory.go), and the client gets Config.SendTimeout as ever.
// c.ends.mu is held.
func (c *conn) pushEnds() {
	b := &c.ends
	if c.draining || len(b.reqs) == 0 {
		return
	}
	b.hold.Stop()
	left, locked := b.iov, c.wmu.TryLock()
	if locked {
		var err error
		if left, err = c.trySend(b.iov); len(left) == 0 || err != nil {
			c.wmu.Unlock()
			releaseEnds(b.reqs)
			clear(b.iov)
			b.reqs, b.iov, b.bytes = b.reqs[:0], b.iov[:0], 0
			return
		}
	}
	// A reply is partly sent: c.wmu stays held, by drainEnds now, so that
	// nothing comes between its bytes.
	reqs := b.reqs
	b.reqs, b.iov, b.bytes = nil, nil, 0
	c.draining = true
	c.drain.Add(1)
	go c.drainEnds(reqs, left, locked)
}

// drainEnds sends bufs, the replies of reqs (holding c.wmu if locked), and
// then the ends batched meanwhile, waiting for the client as long as
// Config.SendTimeout allows, until the batch is empty.
func (c *conn) drainEnds(reqs []*request, bufs [][]byte, locked bool) {
	defer c.drain.Done()
	b := &c.ends
	for {
		if !locked {
			c.wmu.Lock()
		}
		_ = c.sendReply(bufs)
		c.wmu.Unlock()
		releaseEnds(reqs)
		b.mu.Lock()
		if len(b.reqs) == 0 {
			c.draining = false
			b.mu.Unlock()
			return
		}
		b.hold.Stop()
		reqs, bufs = b.reqs, b.iov
		b.reqs, b.iov, b.bytes = nil, nil, 0
		b.mu.Unlock()
		locked = false
	}
}

func releaseEnds(reqs []*request) {
	for i, r := range reqs {
		r.release()
		reqs[i] = nil
	}
}

// startEnds readies the batch of ends (serve): its timer sends a run of
// ends that stopped early.
func (c *conn) startEnds() {
	c.ends.hold = time.AfterFunc(time.Hour, func() {
		c.ends.mu.Lock()
		c.pushEnds()
		c.ends.mu.Unlock()
	})
	c.ends.hold.Stop()
}

// finishEnds sends what is left of the ends once every started request
// ended (serve): a run that stopped early, and what drainEnds has yet to
// send.
func (c *conn) finishEnds() {
	c.ends.hold.Stop()
	c.ends.mu.Lock()
	c.pushEnds()
	c.ends.mu.Unlock()
	c.drain.Wait()
}
