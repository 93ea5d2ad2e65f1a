package nbd

import (
	"encoding/binary"
	"fmt"

	"github.com/quiverstorage/quiver/internal/pool"
)

// allowedFlags lists the command flags each command accepts ("Request
// types"); anything else is EINVAL.
var allowedFlags = map[uint16]uint16{
	cmdRead:        cmdFlagDF,
	cmdWrite:       cmdFlagFUA,
	cmdFlush:       0,
	cmdTrim:        cmdFlagFUA,
	cmdCache:       0,
	cmdWriteZeroes: cmdFlagFUA | cmdFlagNoHole | cmdFlagFastZero,
	cmdBlockStatus: cmdFlagReqOne,
}

// holeThreshold is the smallest READ for which holes are looked up and sent
// as NBD_REPLY_TYPE_OFFSET_HOLE chunks: below it the two lseek calls cost
// more than sending the zeros.
const holeThreshold = 256 << 10

// exec runs a request that validate has accepted, or answers the refusal
// validate wrote into it. It is the one place where requests are executed:
// the reader, the write executor and the workers all call it, and differ
// only in r, which says whether it may wait and where successful replies go
// (schedule.go). With r.nowait it runs only what the disk can do without
// waiting and reports false, having changed nothing the client can see,
// for anything else: the caller then hands req on. Otherwise, and whenever
// it reports true, req is exec's: it is released once its reply has gone
// out, or dropped when the connection is broken.
func (c *conn) exec(req *request, r runner) bool {
	switch {
	case c.broken.Load():
		// No reply can reach the client: do not read 32 MiB for nothing.
		req.release()
		return true
	case req.errno != 0:
		c.answer(req, r, nil)
		return true
	}
	switch req.typ {
	case cmdRead:
		return c.read(req, r)
	case cmdWrite:
		return c.write(req, r)
	}
	if r.nowait {
		return false // every other command may wait for the device
	}
	switch req.typ {
	case cmdFlush:
		c.answer(req, r, c.flush())
	case cmdTrim:
		c.answer(req, r, c.trim(req))
	case cmdWriteZeroes:
		c.answer(req, r, c.zero(req))
	case cmdCache:
		c.answer(req, r, c.disk.Cache(int64(req.off), int64(req.length)))
	case cmdBlockStatus:
		c.blockStatus(req, r)
	}
	return true
}

// write runs NBD_CMD_WRITE. Without FUA the data is in the page cache when
// it is acknowledged, with FUA durable (pool.Disk).
func (c *conn) write(req *request, r runner) bool {
	off, fua := int64(req.off), req.flags&cmdFlagFUA != 0
	var err error
	if r.nowait {
		if fua || c.nb == nil || req.length > inlineMax { // FUA waits for the device
			return false
		}
		if c.nb.TryWriteAt(*req.buf, off) != nil {
			return false
		}
	} else {
		err = c.disk.WriteAt(*req.buf, off, fua)
	}
	if err == nil && !fua {
		c.writeGen.Add(1)
	}
	c.answer(req, r, err)
	return true
}

// flush runs NBD_CMD_FLUSH: it covers every write completed before it, on
// any connection to the disk (they share one file).
func (c *conn) flush() error {
	gen := c.writeGen.Load()
	err := c.disk.Flush()
	if err == nil {
		// Raise flushedGen to gen (never lower it: flushes overlap).
		for cur := c.flushedGen.Load(); cur < gen && !c.flushedGen.CompareAndSwap(cur, gen); cur = c.flushedGen.Load() {
		}
	}
	return err
}

// trim runs NBD_CMD_TRIM.
func (c *conn) trim(req *request) error {
	fua := req.flags&cmdFlagFUA != 0
	err := c.disk.Trim(int64(req.off), int64(req.length), fua)
	if err == nil && !fua {
		c.writeGen.Add(1)
	}
	return err
}

// zero runs NBD_CMD_WRITE_ZEROES.
func (c *conn) zero(req *request) error {
	f := zeroFlags(req.flags)
	err := c.disk.Zero(int64(req.off), int64(req.length), f)
	if err == nil && f&pool.ZeroFUA == 0 {
		c.writeGen.Add(1)
	}
	return err
}

// zeroFlags translates the flags of NBD_CMD_WRITE_ZEROES: without NO_HOLE
// the range may be punched ("NBD_CMD_WRITE_ZEROES").
func zeroFlags(f uint16) pool.ZeroFlags {
	var z pool.ZeroFlags
	if f&cmdFlagNoHole == 0 {
		z |= pool.ZeroMayTrim
	}
	if f&cmdFlagFastZero != 0 {
		z |= pool.ZeroFast
	}
	if f&cmdFlagFUA != 0 {
		z |= pool.ZeroFUA
	}
	return z
}

// validate checks command, flags and range of a request. It is the only
// check of a request in this package: the reader calls it once for every
// request it reads, before it decides where the request runs, and exec
// obeys its verdict. A refusal is an NBD error value and a message for the
// client; nothing of a refused request is executed.
func (c *conn) validate(req *request) (errno uint32, msg string) {
	allowed, known := allowedFlags[req.typ]
	if !known {
		return errInval, fmt.Sprintf("unknown command %d", req.typ)
	}
	if req.typ == cmdRead && !c.structured {
		allowed = 0 // DF needs structured replies
	}
	if c.flags&tflagSendFUA != 0 {
		allowed |= cmdFlagFUA // once advertised, FUA is valid on every command ("Command flags")
	}
	if req.flags&^allowed != 0 {
		return errInval, fmt.Sprintf("flags %#x not valid for command %d", req.flags, req.typ)
	}
	if c.disk.ReadOnly() && (req.typ == cmdWrite || req.typ == cmdTrim || req.typ == cmdWriteZeroes) {
		return errPerm, "export is read-only"
	}
	switch req.typ {
	case cmdFlush:
		if req.off != 0 || req.length != 0 {
			return errInval, "flush offset and length must be zero"
		}
		return 0, ""
	case cmdBlockStatus:
		if !c.baseAlloc && len(c.bitmaps) == 0 {
			return errInval, "no metadata context negotiated"
		}
	case cmdRead:
		if req.length > maxPayload {
			if c.structured {
				return errOverflow, fmt.Sprintf("read of %d bytes exceeds the maximum %d", req.length, maxPayload)
			}
			return errInval, fmt.Sprintf("read of %d bytes exceeds the maximum %d", req.length, maxPayload)
		}
	}
	if req.length == 0 {
		return errInval, "zero length"
	}
	if req.off > uint64(c.size) || uint64(req.length) > uint64(c.size)-req.off {
		if req.typ == cmdWrite || req.typ == cmdWriteZeroes {
			return errNoSpc, fmt.Sprintf("range [%d, +%d) beyond the end of the %d-byte disk", req.off, req.length, c.size)
		}
		return errInval, fmt.Sprintf("range [%d, +%d) beyond the end of the %d-byte disk", req.off, req.length, c.size)
	}
	return 0, ""
}

// read runs NBD_CMD_READ. All data is read before anything is sent, so a
// failure is always a single error reply, never a success header followed
// by an error.
func (c *conn) read(req *request, r runner) bool {
	off, n := int64(req.off), int(req.length)
	if r.nowait && (c.nb == nil || n > inlineMax) {
		return false
	}
	var ext []pool.Extent
	if c.structured && n >= holeThreshold && req.flags&cmdFlagDF == 0 {
		// Holes go out as holes. The lookup is two lseek calls on cached
		// metadata; the sparse reply, a pread per data extent, may wait.
		var err error
		ext, err = c.disk.Extents(off, int64(n), 0)
		if r.nowait && (err != nil || hasHole(ext)) {
			return false
		}
		if err != nil || !hasHole(ext) {
			ext = nil
		}
	}
	// Large reads of cached data go from the page cache to the socket.
	if n >= sendfileMin && ext == nil && c.sendFile(req, r, off, n) {
		return true
	}
	// Reads that may join a batch leave room for the reply header in front
	// of the data, so that header and data go out from one buffer.
	room := 0
	if n <= inlineMax {
		room = replyRoom
	}
	req.buf, req.room = getBuf(room+n), room
	buf := (*req.buf)[room:]
	var err error
	switch {
	case ext != nil:
		c.flushOut(r.out)
		c.readSparse(req, ext)
		req.release()
		return true
	case r.nowait:
		if c.nb.TryReadAt(buf, off) != nil {
			putBuf(req.buf)
			req.buf, req.room = nil, 0
			return false
		}
	default:
		err = c.disk.ReadAt(buf, off)
	}
	if err != nil {
		c.answer(req, r, err)
		return true
	}
	c.answerData(req, r, off, buf)
	return true
}

func hasHole(ext []pool.Extent) bool {
	for _, e := range ext {
		if e.Hole {
			return true
		}
	}
	return false
}

// readSparse reads the data extents of a range and replies with one chunk
// per extent: OFFSET_DATA for data, OFFSET_HOLE for holes.
func (c *conn) readSparse(req *request, ext []pool.Extent) {
	base := int64(req.off)
	buf := (*req.buf)[req.room:]
	var err error
	if dr := c.caps.DataReader; dr != nil {
		err = dr.ReadData(buf, base, ext)
	} else {
		err = pool.ReadExtents(c.disk, buf, base, ext)
	}
	if err != nil {
		c.failed(req, err)
		return
	}
	c.wmu.Lock()
	defer c.wmu.Unlock()
	for i, e := range ext {
		flags := uint16(0)
		if i == len(ext)-1 {
			flags = replyFlagDone
		}
		var err error
		if e.Hole {
			var p [12]byte
			binary.BigEndian.PutUint64(p[0:], uint64(e.Offset))
			binary.BigEndian.PutUint32(p[8:], uint32(e.Length))
			err = c.writeChunk(req, flags, replyTypeOffsetHole, p[:], nil)
		} else {
			var p [8]byte
			binary.BigEndian.PutUint64(p[0:], uint64(e.Offset))
			err = c.writeChunk(req, flags, replyTypeOffsetData, p[:], buf[e.Offset-base:e.Offset-base+e.Length])
		}
		if err != nil {
			return
		}
	}
}
