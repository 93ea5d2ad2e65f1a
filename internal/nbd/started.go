package nbd

import "time"

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
// instead of four hand-offs.
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
// at once. req is released once its reply is sent.
func (req *request) ended(err error, more bool) {
	c := req.owner
	r := runner{out: &c.ends}
	switch {
	case err != nil:
		c.answer(req, r, err)
	case req.typ == cmdRead:
		c.answerData(req, r, int64(req.off), (*req.buf)[req.room:])
	default:
		if req.flags&cmdFlagFUA == 0 {
			c.writeGen.Add(1)
		}
		c.answer(req, r, nil)
	}
	if !more {
		c.flushOut(&c.ends)
	}
	c.started.Done()
}

// startEnds readies the batch of ends (serve).
func (c *conn) startEnds() {
	c.ends.hold = time.AfterFunc(time.Hour, func() { c.flushOut(&c.ends) })
	c.ends.hold.Stop()
}
