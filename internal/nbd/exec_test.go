package nbd

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"math"
	"testing"
	"time"
)

// A request is validated once, by the reader, and executed by exec whatever
// goroutine runs it (schedule.go). The tests here hold every scheduling path
// to the same verdict: each malformed request gets the same NBD error, and
// leaves the disk alone, on the reader, the write executor and a worker.

// refusalCase is one request, the error the spec asks for (without and with
// structured replies; 0 is success), or a hang-up.
type refusalCase struct {
	name    string
	export  string // exportRoot (read-write, memRootSize) or exportSnap (read-only)
	req     testReq
	want    [2]uint32
	hangup  bool // the server must end the connection without a reply
	closing bool // the server is shutting down when the request is read
}

func refusalCases() []refusalCase {
	end := uint64(memRootSize)
	wr := func(off uint64, n uint32, flags uint16) testReq {
		return withPayload(testReq{typ: cmdWrite, flags: flags, off: off, length: n}, 9)
	}
	rw, ro := exportRoot, exportSnap
	return []refusalCase{
		// Ranges.
		{name: "read at the end", export: rw, req: testReq{typ: cmdRead, off: end, length: 1}, want: same(errInval)},
		{name: "read across the end", export: rw, req: testReq{typ: cmdRead, off: end - 100, length: 4096}, want: same(errInval)},
		{name: "read where offset+length overflows", export: rw, req: testReq{typ: cmdRead, off: overflowOff, length: 4096}, want: same(errInval)},
		{name: "read of zero bytes", export: rw, req: testReq{typ: cmdRead, length: 0}, want: same(errInval)},
		{name: "write across the end", export: rw, req: wr(end-10, 4096, 0), want: same(errNoSpc)},
		{name: "write where offset+length overflows", export: rw, req: wr(math.MaxUint64, 1, 0), want: same(errNoSpc)},
		{name: "FUA write across the end", export: rw, req: wr(end, 512, cmdFlagFUA), want: same(errNoSpc)},
		{name: "write of zero bytes", export: rw, req: testReq{typ: cmdWrite, off: 4096}, want: same(errInval)},
		{name: "write zeroes across the end", export: rw, req: testReq{typ: cmdWriteZeroes, off: end - 512, length: 1024}, want: same(errNoSpc)},
		{name: "trim across the end", export: rw, req: testReq{typ: cmdTrim, off: end - 512, length: 1024}, want: same(errInval)},
		{name: "cache across the end", export: rw, req: testReq{typ: cmdCache, off: end - 512, length: 1024}, want: same(errInval)},
		{name: "flush with an offset", export: rw, req: testReq{typ: cmdFlush, off: 512}, want: same(errInval)},
		{name: "flush with a length", export: rw, req: testReq{typ: cmdFlush, length: 512}, want: same(errInval)},
		// Sizes.
		{name: "read of 32 MiB + 1", export: rw, req: testReq{typ: cmdRead, length: big}, want: [2]uint32{errInval, errOverflow}},
		{name: "read of 4 GiB - 1", export: rw, req: testReq{typ: cmdRead, length: math.MaxUint32}, want: [2]uint32{errInval, errOverflow}},
		{name: "write of 32 MiB + 1", export: rw, req: testReq{typ: cmdWrite, length: big}, hangup: true},
		// Commands and flags.
		{name: "unknown command 8", export: rw, req: testReq{typ: 8, length: 512}, want: same(errInval)},
		{name: "unknown command 0xffff", export: rw, req: testReq{typ: 0xffff, length: 512}, want: same(errInval)},
		{name: "unknown flag on write", export: rw, req: wr(4096, 512, 1<<5), want: same(errInval)},
		{name: "NO_HOLE on write", export: rw, req: wr(4096, 512, cmdFlagNoHole), want: same(errInval)},
		{name: "DF on write", export: rw, req: wr(4096, 512, cmdFlagDF), want: same(errInval)},
		{name: "DF on read", export: rw, req: testReq{typ: cmdRead, flags: cmdFlagDF, off: 4096, length: 512}, want: [2]uint32{errInval, 0}},
		{name: "REQ_ONE on read", export: rw, req: testReq{typ: cmdRead, flags: cmdFlagReqOne, length: 512}, want: same(errInval)},
		{name: "FAST_ZERO on trim", export: rw, req: testReq{typ: cmdTrim, flags: cmdFlagFastZero, off: 4096, length: 512}, want: same(errInval)},
		{name: "NO_HOLE on flush", export: rw, req: testReq{typ: cmdFlush, flags: cmdFlagNoHole}, want: same(errInval)},
		{name: "block status without a meta context", export: rw, req: testReq{typ: cmdBlockStatus, length: 4096}, want: same(errInval)},
		// A read-only export: no writes, and no FUA, which it does not advertise.
		{name: "write to a read-only export", export: ro, req: wr(0, 4096, 0), want: same(errPerm)},
		{name: "FUA write to a read-only export", export: ro, req: wr(0, 4096, cmdFlagFUA), want: same(errPerm)},
		{name: "write beyond the end of a read-only export", export: ro, req: wr(end, 4096, 0), want: same(errPerm)},
		{name: "trim of a read-only export", export: ro, req: testReq{typ: cmdTrim, length: 4096}, want: same(errPerm)},
		{name: "write zeroes to a read-only export", export: ro, req: testReq{typ: cmdWriteZeroes, length: 4096}, want: same(errPerm)},
		{name: "FUA on read without SEND_FUA", export: ro, req: testReq{typ: cmdRead, flags: cmdFlagFUA, length: 4096}, want: same(errInval)},
		{name: "FUA on flush without SEND_FUA", export: ro, req: testReq{typ: cmdFlush, flags: cmdFlagFUA}, want: same(errInval)},
		// The server is going away: nothing read now runs.
		{name: "read while shutting down", export: rw, req: testReq{typ: cmdRead, length: 4096}, want: same(errShutdown), closing: true},
		{name: "write while shutting down", export: rw, req: wr(0, 4096, 0), want: same(errShutdown), closing: true},
		// The framing itself: the server hangs up, having run nothing.
		{name: "bad magic", export: rw, req: testReq{typ: cmdRead, length: 512, cookie: 0xbad}, hangup: true},
		{name: "client gone mid-payload", export: rw, req: testReq{typ: cmdWrite, length: 4096, payload: make([]byte, 100)}, hangup: true},
		// Valid requests, for contrast: the same paths run them.
		{name: "read", export: rw, req: testReq{typ: cmdRead, off: 4096, length: 8192}, want: same(0)},
		{name: "FUA read", export: rw, req: testReq{typ: cmdRead, flags: cmdFlagFUA, off: 4096, length: 8192}, want: same(0)},
		{name: "write", export: rw, req: wr(end-4096, 4096, 0), want: same(0)},
		{name: "flush", export: rw, req: testReq{typ: cmdFlush}, want: same(0)},
		{name: "read of a read-only export", export: ro, req: testReq{typ: cmdRead, length: 4096}, want: same(0)},
	}
}

// wire is the bytes a client sends for tc.
func (tc refusalCase) wire() []byte {
	b := reqBytes(tc.req)
	if tc.name == "bad magic" {
		b[0] ^= 0xff
	}
	return b
}

// execPath is one way exec is called (schedule.go): the runner it passes.
type execPath struct {
	name   string
	runner func(c *conn, b *batch) runner
}

var execPaths = []execPath{
	{"reader, without waiting", func(c *conn, _ *batch) runner { return c.readerTry() }},
	{"reader, lone", func(c *conn, _ *batch) runner { return c.readerRun() }},
	{"write executor", func(_ *conn, b *batch) runner { return runner{out: b} }},
	{"worker", func(*conn, *batch) runner { return workerRun }},
}

// execConn returns a connection of srv in the transmission phase on export,
// as negotiation leaves it, that reads in and writes its replies to out.
func execConn(t *testing.T, srv *Server, export string, structured bool, in []byte) (*conn, *streamConn) {
	t.Helper()
	out := newStreamConn(in, 0)
	c := &conn{srv: srv, nc: out, peer: "stream", peerMem: &peerBytes{}, log: srv.log}
	c.r = bufio.NewReader(connReader{c})
	if err := c.open(context.Background(), export); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.closeDisk)
	c.setFlags(&negotiation{structured: structured})
	return c, out
}

// TestValidatedOnceOnEveryPath: the reader reads and validates a request
// once (readRequest), and exec gives it the same answer whichever path runs
// it: the spec's error for a malformed request, with the disk untouched and
// the request never handed on; a hang-up, with nothing run, for a broken
// frame.
func TestValidatedOnceOnEveryPath(t *testing.T) {
	for _, tc := range refusalCases() {
		for _, structured := range []bool{false, true} {
			for _, p := range execPaths {
				for _, nonblocking := range []bool{false, true} {
					name := fmt.Sprintf("%s/structured=%v/%s/nonblocking=%v", tc.name, structured, p.name, nonblocking)
					t.Run(name, func(t *testing.T) {
						checkOnePath(t, tc, structured, p, nonblocking)
					})
				}
			}
		}
	}
}

func checkOnePath(t *testing.T, tc refusalCase, structured bool, p execPath, nonblocking bool) {
	e := newMemExports()
	e.nonblocking = nonblocking
	disk := e.disks[tc.export]
	before := disk.snapshot()
	srv := NewServer(e, Config{Logger: discardLogger()})
	c, out := execConn(t, srv, tc.export, structured, tc.wire())
	srv.closing.Store(tc.closing)

	req, err := c.readRequest()
	if tc.hangup {
		if err == nil {
			t.Fatalf("request read and accepted (errno %d); want the connection ended", req.errno)
		}
	} else {
		if err != nil {
			t.Fatalf("readRequest: %v", err)
		}
		want := tc.want[0]
		if structured {
			want = tc.want[1]
		}
		if want != 0 && req.errno != want {
			t.Errorf("validated once: errno %d (%s), want %d", req.errno, req.msg, want)
		}
		var b batch
		r := p.runner(c, &b)
		if !c.exec(req, r) {
			// Declined without waiting: handed on, as schedule does.
			if want != 0 || !r.nowait {
				t.Fatalf("exec declined the request (errno %d) with %+v", want, r)
			}
			c.flushOut(r.out)
			c.exec(req, workerRun)
		}
		c.flushOut(r.out)
		cl := outputClient(t, out.output())
		cl.structured = structured
		cl.expect(tc.req)
		rep, err := cl.readReply()
		if err != nil {
			t.Fatalf("reply: %v", err)
		}
		if rep.errno != want {
			t.Errorf("errno %d (%s), want %d", rep.errno, rep.msg, want)
		}
		if structured && rep.errno != 0 && (len(rep.chunks) != 1 || rep.chunks[0].typ != replyTypeError || rep.msg == "") {
			t.Errorf("error reply is not a single ERROR chunk with a message: %+v", rep.chunks)
		}
		if _, err := cl.r.ReadByte(); err != io.EOF {
			t.Errorf("more than one reply")
		}
		if want == 0 {
			return
		}
	}
	c.closeDisk()
	checkExports(t, e)
	if len(disk.log) != 0 || !bytes.Equal(disk.snapshot(), before) {
		t.Errorf("a refused request changed the disk: %+v", disk.log)
	}
	if got := c.inflight.Load(); got != 0 {
		t.Errorf("%d bytes still reserved after the reply", got)
	}
}

// TestRefusalsWhileQueued runs the refusals through a real server while
// other requests hold the workers or the write executor, so that the
// refusal meets each scheduling decision the reader makes: with one worker
// it must queue behind the request in flight and be answered after it
// (replies in request order); with many it is answered at once, ahead of the
// write that waits.
func TestRefusalsWhileQueued(t *testing.T) {
	for _, workers := range []int{1, 16} {
		for _, structured := range []bool{false, true} {
			t.Run(fmt.Sprintf("workers=%d/structured=%v", workers, structured), func(t *testing.T) {
				g := &gateExports{Exports: newMemExports(), entered: make(chan struct{}, 1), release: make(chan struct{})}
				addr := serveExports(t, "tcp", g, Config{Workers: workers})
				for _, tc := range refusalCases() {
					if tc.hangup || tc.closing || tc.export != exportRoot || tc.want == same(0) {
						continue
					}
					want := tc.want[0]
					if structured {
						want = tc.want[1]
					}
					if want == 0 {
						continue
					}
					c := dial(t, addr)
					c.handshake(hsOpts{export: exportRoot, structured: structured})
					// A write that waits in the disk: with one worker it
					// holds the worker (FUA), with many the write executor.
					held := withPayload(testReq{typ: cmdWrite, cookie: 1, off: 0, length: 4096}, 5)
					if workers == 1 {
						held.flags = cmdFlagFUA
					}
					// A second request makes the first not lone, so it is
					// handed on rather than run on the reader.
					read := testReq{typ: cmdRead, cookie: 2, off: 8192, length: 4096}
					bad := tc.req
					bad.cookie = 3
					for _, r := range []testReq{held, read, bad} {
						c.expect(r)
					}
					c.mustWrite(append(append(reqBytes(held), reqBytes(read)...), reqBytes(bad)...))
					select {
					case <-g.entered:
					case <-time.After(10 * time.Second):
						t.Fatal("the write never reached the disk")
					}
					if workers > 1 {
						// Answered while the write still waits.
						for range 2 {
							rep := mustReply(t, c)
							if rep.cookie == 3 {
								checkErrno(t, tc.name, rep, want)
							}
						}
						g.release <- struct{}{}
						if rep := mustReply(t, c); rep.cookie != 1 || rep.errno != 0 {
							t.Fatalf("%s: reply %d errno %d, want the held write's success", tc.name, rep.cookie, rep.errno)
						}
					} else {
						g.release <- struct{}{}
						for ck := uint64(1); ck <= 3; ck++ {
							rep := mustReply(t, c)
							if rep.cookie != ck {
								t.Fatalf("%s: reply for cookie %d, want %d (one worker answers in order)", tc.name, rep.cookie, ck)
							}
							if ck == 3 {
								checkErrno(t, tc.name, rep, want)
							} else if rep.errno != 0 {
								t.Fatalf("%s: cookie %d: errno %d", tc.name, ck, rep.errno)
							}
						}
					}
					_ = c.nc.Close()
				}
			})
		}
	}
}

func mustReply(t *testing.T, c *testClient) *tReply {
	t.Helper()
	rep, err := c.readReply()
	if err != nil {
		t.Fatal(err)
	}
	return rep
}

func checkErrno(t *testing.T, name string, rep *tReply, want uint32) {
	t.Helper()
	if rep.errno != want {
		t.Errorf("%s: errno %d (%s), want %d", name, rep.errno, rep.msg, want)
	}
}
