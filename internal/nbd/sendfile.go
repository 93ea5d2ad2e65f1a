package nbd

import (
	"encoding/binary"
	"net"

	"github.com/quiverstorage/quiver/internal/pool"
)

// Large READs over a unix socket go from the page cache to the socket with
// sendfile(2) (pool.Sender): the kernel hands the cached pages to the
// socket, and the server neither copies the data into a buffer (pread) nor
// out of it (sendmsg). Those two copies were most of the server's CPU for
// 1 MiB reads (perf: copy_to_iter 28%, copy_from_iter 15%); with sendfile
// the server's CPU per MiB fell from 304 to 135 us. Over TCP it cost more
// than it saved (564 against 453 us per MiB, same run): the socket then
// carries the data as page-sized fragments, and the loopback TCP stack's
// work per segment, not the copies, is most of the cost there.
//
// It is tried only where it cannot change what the client sees: a READ of
// at least sendfileMin bytes, on a blocking unix socket (socket.go), of a range
// that holds no hole when replies are structured (holes go out as holes),
// whose pages are all in the page cache (else the data would be read from
// the device after the header went out, and a read error could no longer
// be answered as an error). Anything else, or a disk that cannot, is read
// the ordinary way. The reply header goes out with MSG_MORE right before
// the data, with c.wmu held throughout, so replies never interleave.
//
// Once part of the reply is out, a failure (the peer went away, the send
// timeout expired, the file shorter than the range) leaves the stream
// broken, like a failed send: the connection is closed.

// sendfileMin is the smallest READ sent with sendfile: below it the extra
// system calls (cachestat and a separate header) cost more than the copies.
const sendfileMin = holeThreshold

// fileSender is sendFile's state for the function handed to RawConn.Write,
// kept in the connection so that a send allocates nothing. c.wmu guards it.
type fileSender struct {
	disk pool.Sender
	head []byte
	off  int64
	n    int
	sent int
	err  error
	fn   func(fd uintptr) bool // s.send
}

func (s *fileSender) send(fd uintptr) bool {
	s.sent, s.err = s.disk.TrySendTo(int(fd), s.head, s.off, s.n)
	return true
}

// sendFile tries to answer a READ of [off, off+n) with sendfile. It reports
// false, having sent nothing, when the request must be read the ordinary
// way; otherwise req is answered (or the stream broken) and released.
func (c *conn) sendFile(req *request, r runner, off int64, n int) bool {
	sd := c.caps.Sender
	if _, unixSock := c.nc.LocalAddr().(*net.UnixAddr); sd == nil || !unixSock || !c.snd.blocking || c.raw == nil {
		return false
	}
	c.flushOut(r.out) // replies made so far go first
	h := c.fileHeader(req, off, n)
	c.wmu.Lock()
	s := &c.sfile
	if s.fn == nil {
		s.fn = s.send
	}
	s.disk, s.head, s.off, s.n = sd, h, off, n
	err := c.raw.Write(s.fn)
	sent := s.sent
	if err == nil {
		err = s.err
	}
	s.disk, s.head, s.err = nil, nil, nil
	c.wmu.Unlock()
	switch {
	case err == nil:
	case sent == 0:
		return false // nothing went out: the ordinary path reads (and answers any error)
	default:
		if !c.broken.Swap(true) {
			c.log.Debug("reply failed", "err", err)
		}
		_ = c.nc.Close()
	}
	req.release()
	return true
}

// fileHeader fills in, in req.reply, the header of a READ reply whose n
// bytes of data follow it on the wire: one OFFSET_DATA chunk, or a simple
// reply.
func (c *conn) fileHeader(req *request, off int64, n int) []byte {
	if !c.structured {
		h := req.reply[:simpleReplySize]
		binary.BigEndian.PutUint32(h[0:], magicSimpleReply)
		binary.BigEndian.PutUint32(h[4:], 0)
		binary.BigEndian.PutUint64(h[8:], req.cookie)
		return h
	}
	h := req.reply[:structuredHeaderSize+8]
	binary.BigEndian.PutUint32(h[0:], magicStructuredReply)
	binary.BigEndian.PutUint16(h[4:], replyFlagDone)
	binary.BigEndian.PutUint16(h[6:], replyTypeOffsetData)
	binary.BigEndian.PutUint64(h[8:], req.cookie)
	binary.BigEndian.PutUint32(h[16:], uint32(8+n))
	binary.BigEndian.PutUint64(h[20:], uint64(off))
	return h
}
