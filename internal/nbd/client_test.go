package nbd

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"testing"
	"time"
	"unicode/utf8"
)

// testClient is a hand-rolled NBD client for tests: every byte it sends is
// laid out here from the spec (doc/proto.md), and every byte it receives is
// checked against the spec, so that the tests can also send what a polite
// client never would. It is not safe for concurrent use.
type testClient struct {
	t  testing.TB
	nc net.Conn // nil when reading a recorded server stream
	r  *bufio.Reader

	structured bool
	size       uint64
	flags      uint16
	// contexts is how many metadata contexts the client selected:
	// BLOCK_STATUS answers one chunk for each (0 counts as 1).
	contexts int

	pending map[uint64]testReq // requests awaiting their reply, by cookie
	partial map[uint64]*tReply // structured replies awaiting their DONE chunk
	timeout time.Duration      // bound on every read: a hang fails the test
	strict  bool               // t.Errorf on spec violations in replies
	errs    []string           // spec violations seen (also when !strict)
	nextCk  uint64             // next cookie for send
}

// testReq is one transmission request.
type testReq struct {
	flags   uint16
	typ     uint16
	cookie  uint64
	off     uint64
	length  uint32
	payload []byte // WRITE data, sent after the header
}

// optReply is one option reply of the fixed newstyle negotiation.
type optReply struct {
	opt  uint32
	typ  uint32
	data []byte
}

// tReply is the complete reply to one request.
type tReply struct {
	cookie uint64
	simple bool
	errno  uint32 // from the simple reply or the error chunk; 0 on success
	msg    string // error message of an error chunk
	chunks []tChunk
	data   []byte // READ: the data, holes reassembled as zeros
}

type tChunk struct {
	flags   uint16
	typ     uint16
	payload []byte
}

func newTestClient(t testing.TB, nc net.Conn) *testClient {
	return &testClient{t: t, nc: nc, r: bufio.NewReader(nc), pending: map[uint64]testReq{},
		partial: map[uint64]*tReply{}, timeout: 10 * time.Second, strict: true, nextCk: 1}
}

// dial connects to addr without reading anything.
func dial(t testing.TB, addr string) *testClient {
	t.Helper()
	nc, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		t.Fatalf("dial %s: %v", addr, err)
	}
	t.Cleanup(func() { _ = nc.Close() })
	return newTestClient(t, nc)
}

func (c *testClient) violation(format string, args ...any) {
	msg := fmt.Sprintf(format, args...)
	c.errs = append(c.errs, msg)
	if c.strict {
		c.t.Helper()
		c.t.Errorf("spec violation: %s", msg)
	}
}

func (c *testClient) deadline() {
	if c.nc != nil {
		_ = c.nc.SetReadDeadline(time.Now().Add(c.timeout))
	}
}

func (c *testClient) readFull(b []byte) error {
	c.deadline()
	_, err := io.ReadFull(c.r, b)
	return err
}

func (c *testClient) write(b []byte) error {
	_ = c.nc.SetWriteDeadline(time.Now().Add(c.timeout))
	_, err := c.nc.Write(b)
	return err
}

func (c *testClient) mustWrite(b []byte) {
	c.t.Helper()
	if err := c.write(b); err != nil {
		c.t.Fatalf("write to server: %v", err)
	}
}

// greeting reads the server's first 18 bytes and returns its handshake flags.
func (c *testClient) greeting() (uint16, error) {
	var b [18]byte
	if err := c.readFull(b[:]); err != nil {
		return 0, err
	}
	if m := binary.BigEndian.Uint64(b[0:]); m != 0x4e42444d41474943 {
		return 0, fmt.Errorf("greeting magic %#x, want NBDMAGIC", m)
	}
	if m := binary.BigEndian.Uint64(b[8:]); m != 0x49484156454f5054 {
		return 0, fmt.Errorf("greeting magic %#x, want IHAVEOPT (newstyle)", m)
	}
	return binary.BigEndian.Uint16(b[16:]), nil
}

func (c *testClient) mustGreet(clientFlags uint32) {
	c.t.Helper()
	hf, err := c.greeting()
	if err != nil {
		c.t.Fatalf("greeting: %v", err)
	}
	if hf != flagFixedNewstyle|flagNoZeroes {
		c.t.Errorf("handshake flags %#x, want FIXED_NEWSTYLE|NO_ZEROES", hf)
	}
	c.mustWrite(be32(clientFlags))
}

// optBytes lays out an option request.
func optBytes(opt uint32, data []byte) []byte {
	b := make([]byte, 16, 16+len(data))
	binary.BigEndian.PutUint64(b[0:], 0x49484156454f5054)
	binary.BigEndian.PutUint32(b[8:], opt)
	binary.BigEndian.PutUint32(b[12:], uint32(len(data)))
	return append(b, data...)
}

func (c *testClient) sendOpt(opt uint32, data []byte) {
	c.t.Helper()
	c.mustWrite(optBytes(opt, data))
}

func (c *testClient) readOptReply() (optReply, error) {
	var h [20]byte
	if err := c.readFull(h[:]); err != nil {
		return optReply{}, err
	}
	if m := binary.BigEndian.Uint64(h[0:]); m != magicOptionReply {
		return optReply{}, fmt.Errorf("option reply magic %#x", m)
	}
	rep := optReply{opt: binary.BigEndian.Uint32(h[8:]), typ: binary.BigEndian.Uint32(h[12:])}
	n := binary.BigEndian.Uint32(h[16:])
	if n > 1<<20 {
		return optReply{}, fmt.Errorf("option reply of %d bytes", n)
	}
	rep.data = make([]byte, n)
	if err := c.readFull(rep.data); err != nil {
		return optReply{}, err
	}
	if rep.typ&repFlagError != 0 && (len(rep.data) > 4096 || !utf8.Valid(rep.data)) {
		// "Where this document refers to a string ... MUST be no longer
		// than 4096 bytes. This applies to export names and error messages".
		c.violation("option %d: error message of %d bytes, valid UTF-8 %v", rep.opt, len(rep.data), utf8.Valid(rep.data))
	}
	return rep, nil
}

// optReplies reads the replies to opt up to the final one (ACK or an error).
func (c *testClient) optReplies(opt uint32) ([]optReply, error) {
	var out []optReply
	for {
		rep, err := c.readOptReply()
		if err != nil {
			return out, err
		}
		if rep.opt != opt {
			return out, fmt.Errorf("reply for option %d while waiting for option %d", rep.opt, opt)
		}
		out = append(out, rep)
		if rep.typ == repAck || rep.typ&repFlagError != 0 {
			return out, nil
		}
		if len(out) > 10000 {
			return out, errors.New("endless option replies")
		}
	}
}

// option sends an option and returns every reply to it.
func (c *testClient) option(opt uint32, data []byte) []optReply {
	c.t.Helper()
	c.sendOpt(opt, data)
	reps, err := c.optReplies(opt)
	if err != nil {
		c.t.Fatalf("option %d: %v", opt, err)
	}
	return reps
}

// final returns the type of the last reply.
func final(reps []optReply) uint32 {
	if len(reps) == 0 {
		return 0
	}
	return reps[len(reps)-1].typ
}

// goData lays out the data of NBD_OPT_INFO and NBD_OPT_GO.
func goData(name string, infos ...uint16) []byte {
	b := be32(uint32(len(name)))
	b = append(b, name...)
	b = append(b, be16(uint16(len(infos)))...)
	for _, i := range infos {
		b = append(b, be16(i)...)
	}
	return b
}

// metaData lays out the data of NBD_OPT_LIST_META_CONTEXT and
// NBD_OPT_SET_META_CONTEXT.
func metaData(name string, queries ...string) []byte {
	b := be32(uint32(len(name)))
	b = append(b, name...)
	b = append(b, be32(uint32(len(queries)))...)
	for _, q := range queries {
		b = append(b, be32(uint32(len(q)))...)
		b = append(b, q...)
	}
	return b
}

// exportInfo decodes the NBD_INFO_EXPORT reply among reps.
func exportInfo(t testing.TB, reps []optReply) (size uint64, flags uint16) {
	t.Helper()
	for _, r := range reps {
		if r.typ == repInfo && len(r.data) >= 2 && binary.BigEndian.Uint16(r.data) == infoExport {
			if len(r.data) != 12 {
				t.Fatalf("NBD_INFO_EXPORT of %d bytes, want 12", len(r.data))
			}
			return binary.BigEndian.Uint64(r.data[2:]), binary.BigEndian.Uint16(r.data[10:])
		}
	}
	t.Fatalf("no NBD_INFO_EXPORT in %v", reps)
	return 0, 0
}

// hsOpts says how testClient.handshake negotiates.
type hsOpts struct {
	export     string
	structured bool
	meta       []string // SET_META_CONTEXT queries (nil: not sent)
	exportName bool     // end with NBD_OPT_EXPORT_NAME instead of NBD_OPT_GO
	noZeroes   bool     // client flag NO_ZEROES (only matters with exportName)
	greeted    bool     // the greeting was exchanged already (mustGreet)
}

// handshake negotiates per o and leaves the client in the transmission phase.
func (c *testClient) handshake(o hsOpts) {
	c.t.Helper()
	flags := uint32(clientFlagFixedNewstyle)
	if o.noZeroes {
		flags |= clientFlagNoZeroes
	}
	if !o.greeted {
		c.mustGreet(flags)
	}
	if o.structured {
		if reps := c.option(optStructuredReply, nil); final(reps) != repAck {
			c.t.Fatalf("STRUCTURED_REPLY: %v", reps)
		}
		c.structured = true
	}
	if o.meta != nil {
		if reps := c.option(optSetMetaContext, metaData(o.export, o.meta...)); final(reps) != repAck {
			c.t.Fatalf("SET_META_CONTEXT: %v", reps)
		}
	}
	if o.exportName {
		c.sendOpt(optExportName, []byte(o.export))
		n := 10
		if !o.noZeroes {
			n += 124
		}
		b := make([]byte, n)
		if err := c.readFull(b); err != nil {
			c.t.Fatalf("EXPORT_NAME %q: %v", o.export, err)
		}
		c.size, c.flags = binary.BigEndian.Uint64(b), binary.BigEndian.Uint16(b[8:])
		for _, z := range b[10:] {
			if z != 0 {
				c.t.Fatalf("EXPORT_NAME reply: non-zero padding")
			}
		}
		return
	}
	reps := c.option(optGo, goData(o.export, infoBlockSize))
	if final(reps) != repAck {
		c.t.Fatalf("GO %q: %s", o.export, describe(reps))
	}
	c.size, c.flags = exportInfo(c.t, reps)
}

func describe(reps []optReply) string {
	s := ""
	for _, r := range reps {
		s += fmt.Sprintf("[type %#x %q] ", r.typ, r.data)
	}
	return s
}

// reqBytes lays out a request header and its payload.
func reqBytes(r testReq) []byte {
	b := make([]byte, 28, 28+len(r.payload))
	binary.BigEndian.PutUint32(b[0:], 0x25609513)
	binary.BigEndian.PutUint16(b[4:], r.flags)
	binary.BigEndian.PutUint16(b[6:], r.typ)
	binary.BigEndian.PutUint64(b[8:], r.cookie)
	binary.BigEndian.PutUint64(b[16:], r.off)
	binary.BigEndian.PutUint32(b[24:], r.length)
	return append(b, r.payload...)
}

// send sends a request, giving it a fresh cookie unless it has one, and
// returns the cookie.
func (c *testClient) send(r testReq) uint64 {
	c.t.Helper()
	if r.cookie == 0 {
		r.cookie = c.nextCk
		c.nextCk++
	}
	c.expect(r)
	c.mustWrite(reqBytes(r))
	return r.cookie
}

// expect records that a reply to r is due.
func (c *testClient) expect(r testReq) {
	if _, dup := c.pending[r.cookie]; dup {
		c.t.Fatalf("test bug: cookie %d already in flight", r.cookie)
	}
	c.pending[r.cookie] = r
}

// do sends one request and waits for its reply.
func (c *testClient) do(r testReq) *tReply {
	c.t.Helper()
	ck := c.send(r)
	rep, err := c.readReply()
	if err != nil {
		c.t.Fatalf("reply to %s: %v", reqString(r), err)
	}
	if rep.cookie != ck {
		c.t.Fatalf("reply for cookie %d, want %d", rep.cookie, ck)
	}
	return rep
}

func reqString(r testReq) string {
	return fmt.Sprintf("cmd %d flags %#x off %d len %d", r.typ, r.flags, r.off, r.length)
}

// readReply reads messages until one request's reply is complete: a simple
// reply, or the structured chunk with NBD_REPLY_FLAG_DONE.
func (c *testClient) readReply() (*tReply, error) {
	for {
		rep, err := c.readMessage()
		if err != nil {
			return nil, err
		}
		if rep != nil {
			return rep, nil
		}
	}
}

// readMessage reads one simple reply or structured chunk and returns the
// reply if it is now complete.
func (c *testClient) readMessage() (*tReply, error) {
	var m [4]byte
	if err := c.readFull(m[:]); err != nil {
		return nil, err
	}
	switch magic := binary.BigEndian.Uint32(m[:]); magic {
	case magicSimpleReply:
		return c.readSimple()
	case magicStructuredReply:
		if !c.structured {
			c.violation("structured reply chunk without NBD_OPT_STRUCTURED_REPLY")
		}
		return c.readChunk()
	default:
		return nil, fmt.Errorf("reply magic %#x", magic)
	}
}

func (c *testClient) readSimple() (*tReply, error) {
	var h [12]byte
	if err := c.readFull(h[:]); err != nil {
		return nil, err
	}
	rep := &tReply{simple: true, errno: binary.BigEndian.Uint32(h[0:]), cookie: binary.BigEndian.Uint64(h[4:])}
	req, ok := c.pending[rep.cookie]
	if !ok {
		return nil, fmt.Errorf("simple reply for unknown cookie %d", rep.cookie)
	}
	delete(c.pending, rep.cookie)
	if _, part := c.partial[rep.cookie]; part {
		c.violation("simple reply for cookie %d after structured chunks", rep.cookie)
	}
	if req.typ == cmdRead {
		if c.structured {
			c.violation("simple reply to READ with structured replies negotiated")
		}
		if rep.errno == 0 {
			if req.length > maxPayload {
				return nil, fmt.Errorf("successful simple reply to a READ of %d bytes", req.length)
			}
			rep.data = make([]byte, req.length)
			if err := c.readFull(rep.data); err != nil {
				return nil, err
			}
		}
	}
	return rep, nil
}

func (c *testClient) readChunk() (*tReply, error) {
	var h [16]byte
	if err := c.readFull(h[:]); err != nil {
		return nil, err
	}
	ch := tChunk{flags: binary.BigEndian.Uint16(h[0:]), typ: binary.BigEndian.Uint16(h[2:])}
	cookie := binary.BigEndian.Uint64(h[4:])
	n := binary.BigEndian.Uint32(h[12:])
	if n > 33<<20 {
		return nil, fmt.Errorf("chunk of %d bytes", n)
	}
	ch.payload = make([]byte, n)
	if err := c.readFull(ch.payload); err != nil {
		return nil, err
	}
	req, ok := c.pending[cookie]
	if !ok {
		return nil, fmt.Errorf("chunk for unknown cookie %d", cookie)
	}
	rep := c.partial[cookie]
	if rep == nil {
		rep = &tReply{cookie: cookie}
		c.partial[cookie] = rep
	}
	rep.chunks = append(rep.chunks, ch)
	if ch.flags&^uint16(replyFlagDone) != 0 {
		c.violation("chunk flags %#x", ch.flags)
	}
	if ch.flags&replyFlagDone == 0 {
		return nil, nil
	}
	delete(c.partial, cookie)
	delete(c.pending, cookie)
	c.assemble(req, rep)
	return rep, nil
}

// assemble checks the chunks of a complete structured reply against the
// spec ("Structured reply types") and decodes them.
func (c *testClient) assemble(req testReq, rep *tReply) {
	var covered []bool
	if req.typ == cmdRead && req.length <= maxPayload { // larger READs must fail
		rep.data = make([]byte, req.length)
		covered = make([]bool, req.length)
	}
	content := func(off uint64, n uint64) (uint64, bool) {
		if off < req.off || n > uint64(req.length) || off-req.off > uint64(req.length)-n {
			c.violation("content chunk [%d,+%d) outside the request [%d,+%d)", off, n, req.off, req.length)
			return 0, false
		}
		rel := off - req.off
		if covered == nil {
			c.violation("content chunk for a READ of %d bytes, beyond the maximum", req.length)
			return 0, false
		}
		for i := rel; i < rel+n; i++ {
			if covered[i] {
				c.violation("content chunk [%d,+%d) overlaps an earlier one", off, n)
				return 0, false
			}
			covered[i] = true
		}
		return rel, true
	}
	nContent, nError, nStatus := 0, 0, 0
	for i, ch := range rep.chunks {
		p := ch.payload
		switch ch.typ {
		case replyTypeNone:
			if len(p) != 0 || i != len(rep.chunks)-1 {
				c.violation("NBD_REPLY_TYPE_NONE with payload or not last")
			}
		case replyTypeOffsetData, replyTypeOffsetHole:
			nContent++
			if req.typ != cmdRead {
				c.violation("content chunk in reply to command %d", req.typ)
				continue
			}
			if ch.typ == replyTypeOffsetData {
				if len(p) < 9 {
					c.violation("OFFSET_DATA of %d bytes", len(p))
					continue
				}
				off := binary.BigEndian.Uint64(p)
				if rel, ok := content(off, uint64(len(p)-8)); ok {
					copy(rep.data[rel:], p[8:])
				}
				continue
			}
			if len(p) != 12 {
				c.violation("OFFSET_HOLE of %d bytes", len(p))
				continue
			}
			off, n := binary.BigEndian.Uint64(p), binary.BigEndian.Uint32(p[8:])
			if n == 0 {
				c.violation("OFFSET_HOLE of size 0")
			}
			content(off, uint64(n)) // reads as zeros, as rep.data already does
		case replyTypeBlockStatus:
			nStatus++
			if req.typ != cmdBlockStatus || len(p) < 12 || (len(p)-4)%8 != 0 {
				c.violation("BLOCK_STATUS chunk of %d bytes for command %d", len(p), req.typ)
			}
		case replyTypeError:
			nError++
			if len(p) < 6 {
				c.violation("ERROR chunk of %d bytes", len(p))
				continue
			}
			rep.errno = binary.BigEndian.Uint32(p)
			ml := int(binary.BigEndian.Uint16(p[4:]))
			if rep.errno == 0 {
				c.violation("ERROR chunk with error 0")
			}
			if ml > len(p)-6 || ml > 4096 {
				c.violation("ERROR chunk message length %d in %d bytes", ml, len(p))
				continue
			}
			rep.msg = string(p[6 : 6+ml])
			if !utf8.ValidString(rep.msg) {
				c.violation("ERROR chunk message is not UTF-8")
			}
		default:
			c.violation("chunk type %d", ch.typ)
		}
	}
	switch {
	case nError > 1:
		c.violation("%d error chunks in one reply", nError)
	case nError == 1 && req.typ == cmdRead && nContent > 0:
		c.violation("READ reply with content chunks and an error chunk")
	case nError == 0 && req.typ == cmdRead:
		if covered == nil {
			c.violation("successful READ of %d bytes, beyond the maximum", req.length)
		}
		for i, ok := range covered {
			if !ok {
				c.violation("successful READ [%d,+%d) does not cover byte %d", req.off, req.length, req.off+uint64(i))
				break
			}
		}
		if req.flags&cmdFlagDF != 0 && nContent != 1 {
			c.violation("READ with DF answered with %d content chunks", nContent)
		}
	case nError == 0 && req.typ == cmdBlockStatus && nStatus != max(c.contexts, 1):
		c.violation("BLOCK_STATUS answered with %d status chunks, not one per context (%d)", nStatus, max(c.contexts, 1))
	}
}

// extents decodes the descriptors of a BLOCK_STATUS reply.
func (r *tReply) extents() (id uint32, ext [][2]uint32) {
	for _, ch := range r.chunks {
		if ch.typ != replyTypeBlockStatus || len(ch.payload) < 4 {
			continue
		}
		id = binary.BigEndian.Uint32(ch.payload)
		for p := ch.payload[4:]; len(p) >= 8; p = p[8:] {
			ext = append(ext, [2]uint32{binary.BigEndian.Uint32(p), binary.BigEndian.Uint32(p[4:])})
		}
	}
	return id, ext
}

// expectClosed reads until the server closes the connection. Anything the
// server sends first is an error; so is the connection staying open longer
// than the bound (a liveness check, not a performance threshold).
func (c *testClient) expectClosed(bound time.Duration) {
	c.t.Helper()
	_ = c.nc.SetReadDeadline(time.Now().Add(bound))
	b := make([]byte, 1)
	n, err := c.r.Read(b)
	for err == nil && n == 0 {
		n, err = c.r.Read(b)
	}
	var ne net.Error
	switch {
	case n > 0:
		c.t.Fatalf("server sent %#x, want the connection closed", b[0])
	case errors.As(err, &ne) && ne.Timeout():
		c.t.Fatalf("connection still open after %v", bound)
	case err == io.EOF || errors.Is(err, net.ErrClosed) || isReset(err):
	default:
		c.t.Fatalf("read: %v, want EOF", err)
	}
}

func isReset(err error) bool {
	var oe *net.OpError
	return errors.As(err, &oe) && !oe.Timeout()
}

func be16(v uint16) []byte { return binary.BigEndian.AppendUint16(nil, v) }
func be32(v uint32) []byte { return binary.BigEndian.AppendUint32(nil, v) }
