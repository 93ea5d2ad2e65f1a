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

// handle validates a request in full, executes it, and replies.
func (c *conn) handle(req *request) {
	if c.broken.Load() {
		return // no reply can reach the client: do not read 32 MiB for nothing
	}
	if errno, msg := c.validate(req); errno != 0 {
		c.replyError(req, errno, msg)
		return
	}
	var err error
	off, n := int64(req.off), int64(req.length)
	fua := req.flags&cmdFlagFUA != 0
	switch req.typ {
	case cmdRead:
		c.read(req)
		return
	case cmdWrite:
		err = c.disk.WriteAt(*req.buf, off, fua)
	case cmdFlush:
		gen := c.writeGen.Load()
		if err = c.disk.Flush(); err == nil {
			// Raise flushedGen to gen (never lower it: flushes overlap).
			for cur := c.flushedGen.Load(); cur < gen && !c.flushedGen.CompareAndSwap(cur, gen); cur = c.flushedGen.Load() {
			}
		}
	case cmdTrim:
		err = c.disk.Trim(off, n, fua)
	case cmdCache:
		err = c.disk.Cache(off, n)
	case cmdWriteZeroes:
		err = c.disk.Zero(off, n, zeroFlags(req.flags))
	case cmdBlockStatus:
		c.blockStatus(req)
		return
	}
	if err != nil {
		c.failed(req, err)
		return
	}
	if req.typ != cmdFlush && req.typ != cmdCache && !fua {
		c.writeGen.Add(1)
	}
	c.replyOK(req)
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

// validate checks command, flags and range before anything is executed.
func (c *conn) validate(req *request) (uint32, string) {
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
		if !c.baseAlloc {
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

// read answers NBD_CMD_READ. All data is read before anything is sent, so a
// failure is always a single error reply, never a success header followed
// by an error.
func (c *conn) read(req *request) {
	off, n := int64(req.off), int(req.length)
	// Small reads leave room for the reply header in front of the data so
	// that header and data go out in one write from one buffer.
	room := 0
	if n <= inlineReplyMax {
		room = replyRoom
	}
	req.buf = getBuf(room + n)
	req.room = room
	buf := (*req.buf)[room:]
	if c.structured && n >= holeThreshold && req.flags&cmdFlagDF == 0 {
		ext, err := c.disk.Extents(off, int64(n), 0)
		if err == nil && hasHole(ext) {
			c.readSparse(req, ext)
			return
		}
	}
	if err := c.disk.ReadAt(buf, off); err != nil {
		c.failed(req, err)
		return
	}
	c.replyData(req, off, buf)
}

// dataReader is implemented by disks that account a sparse read as one
// request (metrics.Disk): QoS and metrics must see what the client asked.
type dataReader interface {
	ReadData(p []byte, off int64, ext []pool.Extent) error
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
	if dr, ok := c.disk.(dataReader); ok {
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

// blockStatus answers NBD_CMD_BLOCK_STATUS for base:allocation.
func (c *conn) blockStatus(req *request) {
	limit := maxExtents
	if req.flags&cmdFlagReqOne != 0 {
		limit = 1
	}
	ext, err := c.disk.Extents(int64(req.off), int64(req.length), limit)
	if err != nil {
		c.failed(req, err)
		return
	}
	if req.flags&cmdFlagReqOne != 0 && len(ext) > 1 {
		ext = ext[:1]
	}
	if len(ext) > maxExtents {
		ext = ext[:maxExtents]
	}
	req.buf = getBuf(4 + 8*len(ext))
	p := *req.buf
	binary.BigEndian.PutUint32(p, baseAllocationID)
	for i, e := range ext {
		state := uint32(0)
		if e.Hole {
			state = stateHole | stateZero
		}
		binary.BigEndian.PutUint32(p[4+8*i:], uint32(e.Length))
		binary.BigEndian.PutUint32(p[8+8*i:], state)
	}
	c.wmu.Lock()
	defer c.wmu.Unlock()
	_ = c.writeChunk(req, replyFlagDone, replyTypeBlockStatus, nil, p)
}
