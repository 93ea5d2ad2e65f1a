package nbd

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"slices"
	"strings"
	"testing"
	"time"
)

// The fuzz targets replay a whole client byte stream into one server
// connection (a streamConn: reads end with EOF, so the server can neither
// stall nor be stalled) over in-memory disks that report any access the
// server should have refused (memExports). Each checks the server's output
// against the spec, read by testClient.

// serveStream runs one server connection on input and returns what the
// server wrote. It fails if the server is still busy after a generous
// bound: a liveness check, not a performance threshold.
func serveStream(t *testing.T, exports Exports, workers int, input []byte, limit int) []byte {
	t.Helper()
	s := NewServer(exports, Config{Workers: workers, Logger: discardLogger()})
	sc := newStreamConn(input, limit)
	s.start(sc)
	done := make(chan struct{})
	go func() { s.wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(20 * time.Second):
		t.Fatalf("connection still being served 20 s after its input ended")
	}
	return sc.output()
}

// checkExports fails on every violation the disks saw, and on handles the
// server left open.
func checkExports(t *testing.T, e *memExports) {
	t.Helper()
	e.mu.Lock()
	defer e.mu.Unlock()
	for _, v := range e.violations {
		t.Errorf("server misused a disk: %s", v)
	}
	if e.open != 0 {
		t.Errorf("%d disk handles left open after the connection ended", e.open)
	}
}

// outputClient reads a recorded server stream.
func outputClient(t *testing.T, out []byte) *testClient {
	c := newTestClient(t, nil)
	c.r = bufio.NewReader(bytes.NewReader(out))
	return c
}

// parseRequests decodes a transmission-phase client stream the way the
// spec lays it out ("Request message"), up to where the server must stop
// reading: a bad magic, NBD_CMD_DISC, a WRITE payload over the 32 MiB
// quiver advertises (a denial of service it may hang up on), or the end.
func parseRequests(b []byte) []testReq {
	var out []testReq
	for len(b) >= 28 {
		if binary.BigEndian.Uint32(b) != 0x25609513 {
			break
		}
		r := testReq{flags: binary.BigEndian.Uint16(b[4:]), typ: binary.BigEndian.Uint16(b[6:]),
			cookie: binary.BigEndian.Uint64(b[8:]), off: binary.BigEndian.Uint64(b[16:]), length: binary.BigEndian.Uint32(b[24:])}
		b = b[28:]
		if r.typ == cmdDisc {
			break
		}
		if r.typ == cmdWrite {
			if r.length > maxPayload || uint64(len(b)) < uint64(r.length) {
				break
			}
			r.payload, b = b[:r.length], b[r.length:]
		}
		out = append(out, r)
	}
	return out
}

// fuzzMode is the handshake FuzzRequests performs before its input: bit 0
// structured replies, bit 1 base:allocation, bit 2 the read-only export,
// bit 3 NBD_OPT_EXPORT_NAME instead of NBD_OPT_GO, bit 4 NO_ZEROES, bit 5
// several workers (replies in any order), bit 6 the read-write export of an
// odd size.
type fuzzMode byte

func (m fuzzMode) structured() bool { return m&1 != 0 }
func (m fuzzMode) meta() bool       { return m&3 == 3 }
func (m fuzzMode) readOnly() bool   { return m&4 != 0 }
func (m fuzzMode) exportName() bool { return m&8 != 0 }
func (m fuzzMode) noZeroes() bool   { return m&16 != 0 }

// nonblocking serves handles that can try requests without waiting, so
// that requests run on the reader and replies go out in batches.
func (m fuzzMode) nonblocking() bool { return m&128 != 0 }
func (m fuzzMode) workers() int {
	if m&32 != 0 {
		return 4
	}
	return 1
}
func (m fuzzMode) export() string {
	switch {
	case m.readOnly():
		return exportSnap
	case m&64 != 0:
		return exportData
	}
	return exportRoot
}

// handshake returns the client's side of the negotiation.
func (m fuzzMode) handshake() []byte {
	flags := uint32(clientFlagFixedNewstyle)
	if m.noZeroes() {
		flags |= clientFlagNoZeroes
	}
	b := be32(flags)
	if m.structured() {
		b = append(b, optBytes(optStructuredReply, nil)...)
	}
	if m.meta() {
		b = append(b, optBytes(optSetMetaContext, metaData(m.export(), metaContextBaseAllocation))...)
	}
	if m.exportName() {
		return append(b, optBytes(optExportName, []byte(m.export()))...)
	}
	return append(b, optBytes(optGo, goData(m.export()))...)
}

// readHandshake reads the server's side of m.handshake.
func (m fuzzMode) readHandshake(c *testClient) error {
	if _, err := c.greeting(); err != nil {
		return err
	}
	want := map[uint32]uint32{}
	if m.structured() {
		want[optStructuredReply] = repAck
	}
	if m.meta() {
		want[optSetMetaContext] = repAck
	}
	for _, opt := range []uint32{optStructuredReply, optSetMetaContext} {
		if _, ok := want[opt]; !ok {
			continue
		}
		reps, err := c.optReplies(opt)
		if err != nil {
			return err
		}
		if final(reps) != repAck {
			return errors.New("option refused: " + describe(reps))
		}
	}
	c.structured = m.structured()
	if m.exportName() {
		n := 10
		if !m.noZeroes() {
			n += 124
		}
		return c.readFull(make([]byte, n))
	}
	reps, err := c.optReplies(optGo)
	if err != nil {
		return err
	}
	if final(reps) != repAck {
		return errors.New("GO refused: " + describe(reps))
	}
	return nil
}

// specErrnos are the error values a server may send ("Error values").
var specErrnos = []uint32{errPerm, errIO, errNoMem, errInval, errNoSpc, errOverflow, errNotSup, errShutdown}

// mayHaveSucceeded says whether the spec lets r succeed on the export of
// mode m (disk of size bytes). A success the spec forbids means the server
// executed a request it should have refused.
func (m fuzzMode) mayHaveSucceeded(r testReq, size uint64) bool {
	allowed := map[uint16]uint16{cmdRead: cmdFlagDF, cmdWrite: cmdFlagFUA, cmdFlush: 0, cmdTrim: cmdFlagFUA,
		cmdCache: 0, cmdWriteZeroes: cmdFlagFUA | cmdFlagNoHole | cmdFlagFastZero, cmdBlockStatus: cmdFlagReqOne}
	flags, known := allowed[r.typ]
	if !known {
		return false
	}
	if !m.readOnly() {
		flags |= cmdFlagFUA
	}
	if !m.structured() {
		flags &^= cmdFlagDF
	}
	switch {
	case r.flags&^flags != 0:
		return false
	case m.readOnly() && (r.typ == cmdWrite || r.typ == cmdTrim || r.typ == cmdWriteZeroes):
		return false
	case r.typ == cmdBlockStatus && !m.meta():
		return false
	case r.typ == cmdRead && r.length > maxPayload:
		return false
	case r.typ == cmdFlush:
		return r.off == 0 && r.length == 0
	}
	return r.length > 0 && r.off <= size && uint64(r.length) <= size-r.off
}

// checkTransmission checks the server's replies to reqs: one reply per
// request, each well-formed, no success the spec forbids, and, with one
// worker (replies in request order), READ data equal to a model of the
// disk that applies every acknowledged change in order.
func checkTransmission(t *testing.T, m fuzzMode, c *testClient, reqs []testReq, initial []byte) (model []byte) {
	t.Helper()
	model = bytes.Clone(initial)
	size := uint64(len(model))
	ordered := m.workers() == 1
	byCookie := map[uint64]testReq{}
	if !ordered {
		for _, r := range reqs {
			if _, dup := byCookie[r.cookie]; dup {
				return nil // replies cannot be matched to requests
			}
			byCookie[r.cookie] = r
			c.pending[r.cookie] = r
		}
	}
	for i, want := range reqs {
		if ordered {
			c.pending = map[uint64]testReq{want.cookie: want}
		}
		rep, err := c.readReply()
		if err != nil {
			t.Fatalf("reply %d of %d: %v", i+1, len(reqs), err)
		}
		r := byCookie[rep.cookie]
		if ordered {
			r = want
			if rep.cookie != want.cookie {
				t.Fatalf("reply %d for cookie %d, want %d (one worker answers in order)", i+1, rep.cookie, want.cookie)
			}
		}
		if rep.errno != 0 {
			if !slices.Contains(specErrnos, rep.errno) {
				t.Errorf("%s: error value %d is not one of the spec's", reqString(r), rep.errno)
			}
			continue
		}
		if !m.mayHaveSucceeded(r, size) {
			t.Fatalf("%s succeeded; the spec says it must fail", reqString(r))
		}
		if !ordered {
			continue
		}
		switch r.typ {
		case cmdWrite:
			copy(model[r.off:], r.payload)
		case cmdTrim, cmdWriteZeroes:
			clear(model[r.off : r.off+uint64(r.length)])
		case cmdRead:
			if want := model[r.off : r.off+uint64(r.length)]; !bytes.Equal(rep.data, want) {
				t.Fatalf("%s: data differs from the model at byte %d", reqString(r), firstDiff(rep.data, want))
			}
		case cmdBlockStatus:
			off := r.off
			_, ext := rep.extents()
			for _, d := range ext {
				if off+uint64(d[0]) > r.off+uint64(r.length) {
					t.Fatalf("%s: descriptors beyond the request", reqString(r))
				}
				if d[1]&stateZero != 0 && slices.ContainsFunc(model[off:off+uint64(d[0])], func(b byte) bool { return b != 0 }) {
					t.Fatalf("%s: [%d,+%d) reported zero, is not", reqString(r), off, d[0])
				}
				off += uint64(d[0])
			}
			if r.flags&cmdFlagReqOne != 0 && len(ext) != 1 {
				t.Fatalf("%s: %d descriptors with REQ_ONE", reqString(r), len(ext))
			}
		}
	}
	if len(c.partial) != 0 {
		t.Errorf("%d replies without their final chunk", len(c.partial))
	}
	if _, err := c.r.ReadByte(); err != io.EOF {
		t.Errorf("bytes after the last reply")
	}
	if !ordered {
		return nil
	}
	return model
}

// FuzzRequests feeds arbitrary bytes to the transmission phase, after a
// handshake chosen by the first byte (fuzzMode). The server must not panic
// or hang, must answer every request it read exactly once and per the
// spec, must not touch the disk outside the export or change a read-only
// one, and the disk must end up holding exactly the acknowledged writes.
func FuzzRequests(f *testing.F) {
	seed := func(mode fuzzMode, reqs ...testReq) {
		b := []byte{byte(mode)}
		for _, r := range reqs {
			b = append(b, reqBytes(r)...)
		}
		f.Add(b)
	}
	w := withPayload(testReq{typ: cmdWrite, cookie: 1, off: 4000, length: 300}, 3)
	rd := testReq{typ: cmdRead, cookie: 2, off: 0, length: 300 << 10}
	bs := testReq{typ: cmdBlockStatus, cookie: 3, off: 100, length: 20000}
	fl := testReq{typ: cmdFlush, cookie: 4}
	tr := testReq{typ: cmdTrim, cookie: 5, off: 4096, length: 4096}
	wz := testReq{typ: cmdWriteZeroes, flags: cmdFlagNoHole, cookie: 6, off: 8190, length: 10}
	for _, mode := range []fuzzMode{0, 1, 3, 4, 7, 8 | 16, 32 | 3, 128, 128 | 3, 128 | 32 | 3, 128 | 64 | 32 | 1} {
		seed(mode, w, rd, bs, fl, tr, wz, rd)
	}
	seed(3, testReq{typ: cmdRead, cookie: 9, off: memRootSize - 1, length: 2}, testReq{typ: cmdDisc})

	f.Fuzz(func(t *testing.T, data []byte) {
		if len(data) == 0 {
			return
		}
		m := fuzzMode(data[0])
		reqs := parseRequests(data[1:])
		if replyVolume(reqs) > 8<<20 {
			return // slow to check, and no more telling than a smaller input
		}
		e := newMemExports()
		e.nonblocking = m.nonblocking()
		disk := e.disks[m.export()]
		initial := disk.snapshot()
		out := serveStream(t, e, m.workers(), append(m.handshake(), data[1:]...), 0)
		checkExports(t, e)

		c := outputClient(t, out)
		if err := m.readHandshake(c); err != nil {
			t.Fatalf("valid handshake (mode %#x): %v", byte(m), err)
		}
		model := checkTransmission(t, m, c, reqs, initial)
		final := disk.snapshot()
		if len(final) != len(initial) {
			t.Fatalf("disk size changed from %d to %d", len(initial), len(final))
		}
		if model != nil && !bytes.Equal(final, model) {
			t.Fatalf("disk differs from the acknowledged writes at byte %d", firstDiff(final, model))
		}
		// Every change to the disk came from a request, at its offset.
		for _, op := range disk.log {
			if !slices.ContainsFunc(reqs, func(r testReq) bool { return matchesOp(r, op) }) {
				t.Fatalf("disk %s [%d,+%d) matches no request", op.op, op.off, op.n)
			}
		}
	})
}

// replyVolume bounds the bytes the server may send in reply to reqs.
func replyVolume(reqs []testReq) int {
	n := 0
	for _, r := range reqs {
		n += 64
		if r.typ == cmdRead && r.length <= maxPayload {
			n += int(min(r.length, memRootSize))
		}
	}
	return n
}

func matchesOp(r testReq, op diskOp) bool {
	if r.off != uint64(op.off) || uint64(r.length) != uint64(op.n) {
		return false
	}
	switch op.op {
	case "write":
		return r.typ == cmdWrite && bytes.Equal(r.payload, op.data)
	case "trim":
		return r.typ == cmdTrim
	default:
		return r.typ == cmdWriteZeroes
	}
}

// FuzzNegotiation feeds an arbitrary client stream, from the first byte.
// The server must not panic or hang, must close every disk handle, must
// not misuse a disk, and its option replies must follow the client's
// options one for one as the spec frames them.
func FuzzNegotiation(f *testing.F) {
	for _, m := range []fuzzMode{0, 3, 4, 8, 8 | 16} {
		f.Add(append(m.handshake(), reqBytes(testReq{typ: cmdRead, cookie: 1, length: 512})...))
	}
	opts := be32(clientFlagFixedNewstyle)
	for _, o := range []struct {
		opt  uint32
		data []byte
	}{
		{optList, nil}, {optInfo, goData(exportData, infoName, infoDescription, infoBlockSize)},
		{optStructuredReply, nil}, {optListMetaContext, metaData(exportRoot)},
		{optSetMetaContext, metaData(exportRoot, "base:")}, {optStartTLS, nil}, {42, []byte("x")},
		{optGo, goData("nosuch/x")}, {optAbort, nil},
	} {
		opts = append(opts, optBytes(o.opt, o.data)...)
	}
	f.Add(opts)

	f.Fuzz(func(t *testing.T, data []byte) {
		e := newMemExports()
		out := serveStream(t, e, 2, data, 1<<20) // enough for any negotiation
		checkExports(t, e)
		checkOptionFraming(t, data, out)
	})
}

// checkOptionFraming walks the client's options and the server's replies
// together ("Fixed newstyle negotiation"): every complete option but
// NBD_OPT_EXPORT_NAME gets replies naming it, ending with an ACK or an
// error, until the client aborts, goes to transmission, or the server
// hangs up on a protocol violation.
func checkOptionFraming(t *testing.T, in, out []byte) {
	c := outputClient(t, out)
	if len(out) == 0 {
		t.Fatal("no greeting")
	}
	if _, err := c.greeting(); err != nil {
		t.Fatalf("greeting: %v", err)
	}
	end := func() {
		if _, err := c.r.ReadByte(); err != io.EOF {
			t.Fatalf("server sent more after the client's input stopped making sense")
		}
	}
	if len(in) < 4 {
		end()
		return
	}
	flags := binary.BigEndian.Uint32(in)
	if flags&clientFlagFixedNewstyle == 0 || flags&^uint32(clientFlagFixedNewstyle|clientFlagNoZeroes) != 0 {
		end()
		return
	}
	in = in[4:]
	budget, listed := maxOptions, 0 // handshake.go's option bound
	for n := 0; ; n++ {
		if n == budget || len(in) < 16 || binary.BigEndian.Uint64(in) != 0x49484156454f5054 {
			end()
			return
		}
		opt, length := binary.BigEndian.Uint32(in[8:]), binary.BigEndian.Uint32(in[12:])
		in = in[16:]
		if opt == optExportName && length <= maxOptionLength {
			return // transmission or a hang-up; not framed by option replies
		}
		if uint64(len(in)) < uint64(length) || (length > maxOptionLength && (opt == optExportName || length > 16*maxOptionLength)) {
			end()
			return
		}
		in = in[length:]
		reps, err := c.optReplies(opt)
		if err != nil {
			t.Fatalf("option %d (#%d): %v", opt, n+1, err)
		}
		if length > maxOptionLength && (len(reps) != 1 || reps[0].typ != repErrTooBig) {
			t.Fatalf("option %d of %d bytes: %s, want NBD_REP_ERR_TOO_BIG", opt, length, describe(reps))
		}
		if opt == optAbort {
			end()
			return
		}
		if opt == optList && length == 0 && final(reps) == repAck && len(reps)-1 > listed {
			listed = len(reps) - 1
			budget = maxOptions + optionsPerExport*listed
		}
		if opt == optGo && final(reps) == repAck {
			return // transmission
		}
	}
}

// FuzzParseMetaQueries: the meta context decoder accepts exactly the
// well-formed requests; those whose queries are all strings (at most
// maxStringLength bytes) re-encode to the same bytes, and a longer query
// is skipped, never returned.
func FuzzParseMetaQueries(f *testing.F) {
	f.Add(metaData(exportRoot))
	f.Add(metaData(exportRoot, "base:allocation", "qemu:dirty-bitmap:x"))
	f.Add(metaData(exportRoot, "qemu:dirty-bitmap:"+strings.Repeat("s", maxStringLength), "base:allocation"))
	f.Add(metaData("", ""))
	f.Add([]byte{0, 0, 0, 1, 'x', 0xff, 0xff, 0xff, 0xff})
	f.Fuzz(func(t *testing.T, data []byte) {
		m, err := parseMetaQueries(data)
		if err != nil {
			return
		}
		nameLen := binary.BigEndian.Uint32(data)
		if name := string(data[4 : 4+nameLen]); name != m.export {
			t.Fatalf("export %q parsed as %q", name, m.export)
		}
		if count := binary.BigEndian.Uint32(data[4+nameLen:]); int(count) != m.sent || m.sent < len(m.queries) {
			t.Fatalf("%d queries sent, parsed as %d sent, %d kept", count, m.sent, len(m.queries))
		}
		for _, q := range m.queries {
			if len(q) > maxStringLength {
				t.Fatalf("query of %d bytes accepted", len(q))
			}
		}
		if m.sent != len(m.queries) {
			return // some were skipped: they cannot re-encode
		}
		if again := metaData(m.export, m.queries...); !bytes.Equal(again, data) {
			t.Fatalf("parsed %q, %q; re-encodes to %x, not %x", m.export, m.queries, again, data)
		}
	})
}
