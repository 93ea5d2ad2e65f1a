package nbd

import (
	"encoding/binary"
)

// Reply writers. Each takes c.wmu (or expects it held, for the chunk
// writers) so that replies never interleave on the wire.

// replyOK sends a successful reply without payload. A simple reply is
// allowed for any command but READ even with structured replies.
func (c *conn) replyOK(req *request) {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	c.writeSimple(req, 0, nil)
}

// replyError sends an error: an NBD_REPLY_TYPE_ERROR chunk with a message
// when structured replies are on (READ must not get a simple reply), a
// simple reply otherwise.
func (c *conn) replyError(req *request, errno uint32, msg string) {
	if len(msg) > maxStringLength {
		msg = msg[:maxStringLength]
	}
	c.wmu.Lock()
	defer c.wmu.Unlock()
	if !c.structured {
		c.writeSimple(req, errno, nil)
		return
	}
	var p [6]byte
	binary.BigEndian.PutUint32(p[0:], errno)
	binary.BigEndian.PutUint16(p[4:], uint16(len(msg)))
	_ = c.writeChunkString(req, replyFlagDone, replyTypeError, p[:], msg)
}

// replyData sends READ data: one OFFSET_DATA chunk, or a simple reply.
func (c *conn) replyData(req *request, off int64, data []byte) {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	if req.room >= replyRoom {
		_ = c.writev(req, c.dataHeader(req, off, len(data)), nil)
		return
	}
	if !c.structured {
		c.writeSimple(req, 0, data)
		return
	}
	var p [8]byte
	binary.BigEndian.PutUint64(p[:], uint64(off))
	_ = c.writeChunk(req, replyFlagDone, replyTypeOffsetData, p[:], data)
}

// Reads up to inlineMax bytes are read replyRoom bytes into their buffer,
// leaving space for the reply header: one buffer sent whole.
const replyRoom = 32 // >= structuredHeaderSize + 8 and >= simpleReplySize

// dataHeader writes the reply header of a READ into the replyRoom bytes in
// front of its data and returns header and data as one slice.
func (c *conn) dataHeader(req *request, off int64, n int) []byte {
	full := *req.buf
	var h []byte
	if c.structured {
		h = full[replyRoom-structuredHeaderSize-8 : replyRoom]
		binary.BigEndian.PutUint32(h[0:], magicStructuredReply)
		binary.BigEndian.PutUint16(h[4:], replyFlagDone)
		binary.BigEndian.PutUint16(h[6:], replyTypeOffsetData)
		binary.BigEndian.PutUint64(h[8:], req.cookie)
		binary.BigEndian.PutUint32(h[16:], uint32(8+n))
		binary.BigEndian.PutUint64(h[20:], uint64(off))
	} else {
		h = full[replyRoom-simpleReplySize : replyRoom]
		binary.BigEndian.PutUint32(h[0:], magicSimpleReply)
		binary.BigEndian.PutUint32(h[4:], 0)
		binary.BigEndian.PutUint64(h[8:], req.cookie)
	}
	return full[replyRoom-len(h) : replyRoom+n]
}

func (c *conn) writeSimple(req *request, errno uint32, data []byte) {
	h := req.reply[:simpleReplySize]
	binary.BigEndian.PutUint32(h[0:], magicSimpleReply)
	binary.BigEndian.PutUint32(h[4:], errno)
	binary.BigEndian.PutUint64(h[8:], req.cookie)
	_ = c.writev(req, h, data)
}

// writeChunk sends one structured reply chunk: header, a small fixed part
// (copied after the header), and an optional data part. c.wmu is held.
func (c *conn) writeChunk(req *request, flags, typ uint16, fixed, data []byte) error {
	return c.writev(req, chunkHeader(req, flags, typ, fixed, len(data)), data)
}

// chunkHeader writes the header of a structured reply chunk, with its
// fixed part, into req.reply; n bytes of data follow it.
func chunkHeader(req *request, flags, typ uint16, fixed []byte, n int) []byte {
	h := req.reply[:structuredHeaderSize+len(fixed)]
	binary.BigEndian.PutUint32(h[0:], magicStructuredReply)
	binary.BigEndian.PutUint16(h[4:], flags)
	binary.BigEndian.PutUint16(h[6:], typ)
	binary.BigEndian.PutUint64(h[8:], req.cookie)
	binary.BigEndian.PutUint32(h[16:], uint32(len(fixed)+n))
	copy(h[structuredHeaderSize:], fixed)
	return h
}

func (c *conn) writeChunkString(req *request, flags, typ uint16, fixed []byte, s string) error {
	return c.writeChunk(req, flags, typ, fixed, []byte(s))
}

// writev sends header and data with one system call, without allocating.
// c.wmu is held.
func (c *conn) writev(req *request, h, data []byte) error {
	req.iov[0], req.iov[1] = h, data
	err := c.sendReply(req.iov[:])
	req.iov[0], req.iov[1] = nil, nil
	return err
}

// sendReply sends bufs; a failure breaks the stream, so it closes the
// connection (the reader notices). c.wmu is held.
func (c *conn) sendReply(bufs [][]byte) error {
	err := c.send(bufs)
	if err != nil {
		c.breakStream(err)
	}
	return err
}

// breakStream marks the reply stream lost after a failed send and closes
// the connection (the reader notices). c.wmu is held.
func (c *conn) breakStream(err error) {
	if !c.broken.Swap(true) {
		c.log.Debug("reply failed", "err", err)
	}
	_ = c.nc.Close()
}
