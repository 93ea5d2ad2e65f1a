package nbd

import (
	"bytes"
	"fmt"
	"math"
	"testing"
	"time"
)

// txCase is one request and the error the spec asks for, without and with
// structured replies.
type txCase struct {
	name string
	req  testReq
	want [2]uint32 // errno [simple, structured]; 0 is success
}

func same(errno uint32) [2]uint32 { return [2]uint32{errno, errno} }

// withPayload gives a WRITE its payload (length bytes of a pattern).
func withPayload(r testReq, seed byte) testReq {
	r.payload = pattern(seed, int64(r.off%(1<<40)), int(r.length))
	return r
}

// runTxCases sends each case on one connection and checks the reply; after
// every case the connection must still be in sync (the next reply parses).
// Successful writes, trims and zeroes update the model of disk.
func runTxCases(t *testing.T, e *testEnv, c *testClient, disk string, cases []txCase) {
	t.Helper()
	sr := 0
	if c.structured {
		sr = 1
	}
	for _, tc := range cases {
		rep := c.do(tc.req)
		want := tc.want[sr]
		if rep.errno != want {
			t.Errorf("%s (%s): errno %d, want %d (%s)", tc.name, reqString(tc.req), rep.errno, want, rep.msg)
		}
		if c.structured && rep.errno != 0 {
			// An error is one NBD_REPLY_TYPE_ERROR chunk with DONE and a
			// message, never content followed by an error.
			if len(rep.chunks) != 1 || rep.chunks[0].typ != replyTypeError || rep.chunks[0].flags != replyFlagDone {
				t.Errorf("%s: error reply is not a single ERROR chunk with DONE: %+v", tc.name, rep.chunks)
			}
			if rep.msg == "" {
				t.Errorf("%s: error chunk without a message", tc.name)
			}
		}
		if rep.errno != 0 || want != 0 {
			// Refused: the disk must be as before, byte for byte.
			if tc.req.typ == cmdWrite || tc.req.typ == cmdTrim || tc.req.typ == cmdWriteZeroes {
				e.checkDisk(t, disk, tc.name+": ")
			}
			continue
		}
		switch tc.req.typ {
		case cmdWrite:
			e.wrote(disk, tc.req.off, tc.req.payload)
		case cmdTrim, cmdWriteZeroes:
			e.zeroed(disk, tc.req.off, tc.req.length)
		case cmdRead:
			if got, want := rep.data, e.model[disk][tc.req.off:tc.req.off+uint64(tc.req.length)]; !bytes.Equal(got, want) {
				t.Errorf("%s: READ data differs from the model at byte %d", tc.name, firstDiff(got, want))
			}
		}
	}
}

const (
	overflowOff = math.MaxUint64 - 100
	big         = maxPayload + 1
)

// rwCases are requests on the read-write export root (4 MiB); each bad one
// is framed by good writes, so that a write landing at a wrong offset shows.
func rwCases() []txCase {
	end := uint64(rootSize)
	w := func(name string, off uint64, n uint32, seed byte) txCase {
		return txCase{name, withPayload(testReq{typ: cmdWrite, off: off, length: n}, seed), same(0)}
	}
	return []txCase{
		w("write", 8192, 4096, 10),
		w("unaligned write", 20001, 777, 11),
		w("write the last byte", end-1, 1, 12),
		{"read the last bytes", testReq{typ: cmdRead, off: end - 4096, length: 4096}, same(0)},
		{"read across the end", testReq{typ: cmdRead, off: end - 100, length: 4096}, same(errInval)},
		{"read at the end", testReq{typ: cmdRead, off: end, length: 1}, same(errInval)},
		{"read far beyond the end", testReq{typ: cmdRead, off: 1 << 62, length: 512}, same(errInval)},
		{"read where offset+length overflows", testReq{typ: cmdRead, off: overflowOff, length: 4096}, same(errInval)},
		{"read at offset 2^63", testReq{typ: cmdRead, off: 1 << 63, length: 1}, same(errInval)},
		{"read of zero bytes", testReq{typ: cmdRead, off: 0, length: 0}, same(errInval)},
		{"read of 32 MiB + 1", testReq{typ: cmdRead, off: 0, length: big}, [2]uint32{errInval, errOverflow}},
		{"read of 4 GiB - 1", testReq{typ: cmdRead, off: 0, length: math.MaxUint32}, [2]uint32{errInval, errOverflow}},
		w("write", 1<<20+4096, 8192, 13),
		{"write across the end", withPayload(testReq{typ: cmdWrite, off: end - 10, length: 4096}, 14), same(errNoSpc)},
		{"write at the end", withPayload(testReq{typ: cmdWrite, off: end, length: 1}, 15), same(errNoSpc)},
		{"write where offset+length overflows", withPayload(testReq{typ: cmdWrite, off: overflowOff, length: 4096}, 16), same(errNoSpc)},
		{"write at offset 2^64-1", withPayload(testReq{typ: cmdWrite, off: math.MaxUint64, length: 1}, 17), same(errNoSpc)},
		{"write of zero bytes", testReq{typ: cmdWrite, off: 4096, length: 0}, same(errInval)},
		{"write zeroes across the end", testReq{typ: cmdWriteZeroes, off: end - 512, length: 1024}, same(errNoSpc)},
		{"write zeroes overflowing", testReq{typ: cmdWriteZeroes, off: overflowOff, length: 1 << 20}, same(errNoSpc)},
		{"write zeroes of zero bytes", testReq{typ: cmdWriteZeroes, off: 0, length: 0}, same(errInval)},
		{"trim across the end", testReq{typ: cmdTrim, off: end - 512, length: 1024}, same(errInval)},
		{"trim overflowing", testReq{typ: cmdTrim, off: overflowOff, length: 4096}, same(errInval)},
		{"trim of zero bytes", testReq{typ: cmdTrim, off: 0, length: 0}, same(errInval)},
		{"cache across the end", testReq{typ: cmdCache, off: end - 512, length: 1024}, same(errInval)},
		{"cache of zero bytes", testReq{typ: cmdCache, off: 0, length: 0}, same(errInval)},
		{"cache", testReq{typ: cmdCache, off: 0, length: 1 << 20}, same(0)},
		w("write", 1536<<10, 65536, 19),
		{"flush with an offset", testReq{typ: cmdFlush, off: 512}, same(errInval)},
		{"flush with a length", testReq{typ: cmdFlush, length: 512}, same(errInval)},
		{"flush", testReq{typ: cmdFlush}, same(0)},
		{"unknown command 8", testReq{typ: 8, off: 0, length: 512}, same(errInval)},
		{"unknown command 0xffff", testReq{typ: 0xffff, off: 0, length: 512}, same(errInval)},
		{"unknown command with a write's flags", testReq{typ: 9, flags: cmdFlagFUA, off: 1 << 30}, same(errInval)},
		{"unknown flag on read", testReq{typ: cmdRead, flags: 1 << 15, length: 512}, same(errInval)},
		{"unknown flag on write", withPayload(testReq{typ: cmdWrite, flags: 1 << 5, off: 4096, length: 512}, 20), same(errInval)},
		{"REQ_ONE on read", testReq{typ: cmdRead, flags: cmdFlagReqOne, length: 512}, same(errInval)},
		{"DF on read", testReq{typ: cmdRead, flags: cmdFlagDF, length: 512}, [2]uint32{errInval, 0}},
		{"DF on write", withPayload(testReq{typ: cmdWrite, flags: cmdFlagDF, off: 4096, length: 512}, 21), same(errInval)},
		{"NO_HOLE on write", withPayload(testReq{typ: cmdWrite, flags: cmdFlagNoHole, off: 4096, length: 512}, 22), same(errInval)},
		{"FAST_ZERO on trim", testReq{typ: cmdTrim, flags: cmdFlagFastZero, off: 4096, length: 512}, same(errInval)},
		{"NO_HOLE on flush", testReq{typ: cmdFlush, flags: cmdFlagNoHole}, same(errInval)},
		{"REQ_ONE on cache", testReq{typ: cmdCache, flags: cmdFlagReqOne, length: 512}, same(errInval)},
		// "NBD_CMD_FLAG_FUA: valid for all commands, provided
		// NBD_FLAG_SEND_FUA has been negotiated, in which case the server
		// MUST accept all commands with this bit set".
		{"FUA on read", testReq{typ: cmdRead, flags: cmdFlagFUA, off: 8192, length: 4096}, same(0)},
		{"FUA on flush", testReq{typ: cmdFlush, flags: cmdFlagFUA}, same(0)},
		{"FUA on cache", testReq{typ: cmdCache, flags: cmdFlagFUA, length: 4096}, same(0)},
		{"block status without a meta context", testReq{typ: cmdBlockStatus, length: 4096}, same(errInval)},
		{"block status with FUA without a meta context", testReq{typ: cmdBlockStatus, flags: cmdFlagFUA, length: 4096}, same(errInval)},
		w("FUA write", 1792<<10, 4096, 23),
		{"FUA write zeroes", testReq{typ: cmdWriteZeroes, flags: cmdFlagFUA | cmdFlagNoHole, off: 1792<<10 + 1024, length: 1024}, same(0)},
		{"trim", testReq{typ: cmdTrim, flags: cmdFlagFUA, off: 1536 << 10, length: 65536}, same(0)},
		{"read back", testReq{typ: cmdRead, off: 0, length: rootSize}, same(0)},
	}
}

// roCases are requests on the read-only snapshot export.
func roCases() []txCase {
	end := uint64(rootSize)
	return []txCase{
		{"read", testReq{typ: cmdRead, off: 0, length: 65536}, same(0)},
		{"write", withPayload(testReq{typ: cmdWrite, off: 0, length: 4096}, 30), same(errPerm)},
		{"FUA write", withPayload(testReq{typ: cmdWrite, flags: cmdFlagFUA, off: 4096, length: 4096}, 31), same(errPerm)},
		{"write beyond the end", withPayload(testReq{typ: cmdWrite, off: end, length: 4096}, 32), same(errPerm)},
		{"trim", testReq{typ: cmdTrim, off: 0, length: 65536}, same(errPerm)},
		{"write zeroes", testReq{typ: cmdWriteZeroes, off: 0, length: 65536}, same(errPerm)},
		{"write zeroes, no hole", testReq{typ: cmdWriteZeroes, flags: cmdFlagNoHole, off: 0, length: 65536}, same(errPerm)},
		{"FUA on read without SEND_FUA", testReq{typ: cmdRead, flags: cmdFlagFUA, length: 4096}, same(errInval)},
		{"read across the end", testReq{typ: cmdRead, off: end - 1, length: 2}, same(errInval)},
		{"read of 32 MiB + 1", testReq{typ: cmdRead, length: big}, [2]uint32{errInval, errOverflow}},
		{"flush", testReq{typ: cmdFlush}, same(0)},
		{"cache", testReq{typ: cmdCache, length: 65536}, same(0)},
		{"block status without a meta context", testReq{typ: cmdBlockStatus, length: 4096}, same(errInval)},
		{"unknown command", testReq{typ: 100, length: 4096}, same(errInval)},
		{"read back", testReq{typ: cmdRead, off: 0, length: rootSize}, same(0)},
	}
}

// TestBadRequests: malformed and hostile requests get the spec's errors,
// the connection stays usable, and the disks hold exactly the legitimate
// writes.
func TestBadRequests(t *testing.T) {
	e := newEnv(t, Config{}, nil)
	for _, structured := range []bool{false, true} {
		t.Run(fmt.Sprintf("read-write structured=%v", structured), func(t *testing.T) {
			c := e.connect(t, hsOpts{export: exportRoot, structured: structured})
			runTxCases(t, e, c, "root", rwCases())
		})
		t.Run(fmt.Sprintf("read-only structured=%v", structured), func(t *testing.T) {
			c := e.connect(t, hsOpts{export: exportSnap, structured: structured})
			runTxCases(t, e, c, "snap", roCases())
		})
	}
	e.waitIdle()
	e.checkDisks()
}

// TestLargestWrite: a WRITE of the largest payload quiver advertises is
// read in full and refused with ENOSPC on a smaller disk; the connection
// stays in sync. (One byte more is a disconnect: TestDisconnects.)
func TestLargestWrite(t *testing.T) {
	e := newEnv(t, Config{}, nil)
	c := e.connect(t, hsOpts{export: exportRoot})
	runTxCases(t, e, c, "root", []txCase{
		{"write of 32 MiB", testReq{typ: cmdWrite, off: 0, length: maxPayload, payload: bytes.Repeat([]byte{0xa5}, maxPayload)}, same(errNoSpc)},
		{"read after", testReq{typ: cmdRead, off: 0, length: 65536}, same(0)},
	})
}

// TestDisconnects: requests after which the server must hang up, without
// writing anything it did not acknowledge. Requests read before the bad
// one are answered first.
func TestDisconnects(t *testing.T) {
	e := newEnv(t, Config{}, nil)
	good := withPayload(testReq{typ: cmdWrite, cookie: 1, off: 40960, length: 4096}, 40)
	hdr := func(r testReq) []byte { return reqBytes(r)[:28] }
	for _, tc := range []struct {
		name    string
		send    []byte
		answers int // replies due before the close: to good
		vanish  bool
	}{
		{"bad request magic", append(reqBytes(good), bytes.Repeat([]byte{0xee}, 28)...), 1, false},
		{"simple reply magic as a request", append(reqBytes(good), append(be32(magicSimpleReply), make([]byte, 24)...)...), 1, false},
		{"write of 32 MiB + 1", append(reqBytes(good), append(hdr(testReq{typ: cmdWrite, cookie: 2, off: 0, length: big}), pattern(41, 0, 65536)...)...), 1, false},
		{"write of 4 GiB - 1", append(reqBytes(good), hdr(testReq{typ: cmdWrite, cookie: 2, off: 0, length: math.MaxUint32})...), 1, false},
		{"client vanishes mid-payload", append(reqBytes(good), append(hdr(testReq{typ: cmdWrite, cookie: 2, off: 8192, length: 65536}), pattern(42, 8192, 30000)...)...), 1, true},
		{"client vanishes mid-header", append(reqBytes(good), hdr(testReq{typ: cmdWrite, cookie: 2, off: 8192, length: 512})[:17]...), 1, true},
		{"client vanishes after a header", hdr(testReq{typ: cmdWrite, cookie: 2, off: 8192, length: 512}), 0, true},
		{"disconnect request", append(reqBytes(good), hdr(testReq{typ: cmdDisc, cookie: 2})...), 1, false},
		{"disconnect request, then more", append(reqBytes(good), append(hdr(testReq{typ: cmdDisc, cookie: 2}),
			reqBytes(withPayload(testReq{typ: cmdWrite, cookie: 3, off: 0, length: 4096}, 43))...)...), 1, false},
	} {
		for _, structured := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s structured=%v", tc.name, structured), func(t *testing.T) {
				c := e.connect(t, hsOpts{export: exportData, structured: structured})
				if tc.answers > 0 {
					c.expect(good)
				}
				c.mustWrite(tc.send)
				if tc.answers > 0 {
					// Read in full before the bad request, so executed
					// (and answered, unless the client is gone).
					e.wrote("data", good.off, good.payload)
				}
				if tc.vanish {
					_ = c.nc.Close()
				} else {
					for range tc.answers {
						rep, err := c.readReply()
						if err != nil {
							t.Fatalf("reply to the request before: %v", err)
						}
						if rep.errno != 0 {
							t.Fatalf("reply to the request before: errno %d", rep.errno)
						}
					}
					c.expectClosed(5 * time.Second)
				}
				e.waitIdle()
				e.checkDisk(t, "data", "")
			})
		}
	}
	e.checkDisks()
}

// TestStructuredRead: sparse reads come as OFFSET_DATA and OFFSET_HOLE
// chunks that reassemble to the data; DF asks for a single chunk.
func TestStructuredRead(t *testing.T) {
	e := newEnv(t, Config{}, nil)
	c := e.connect(t, hsOpts{export: exportData, structured: true})
	for _, w := range []testReq{
		withPayload(testReq{typ: cmdWrite, off: 0, length: 4096}, 50),
		withPayload(testReq{typ: cmdWrite, off: 300 << 10, length: 8192}, 51),
		withPayload(testReq{typ: cmdWrite, off: 768<<10 - 100, length: 200}, 52),
	} {
		if rep := c.do(w); rep.errno != 0 {
			t.Fatalf("write: errno %d", rep.errno)
		}
		e.wrote("data", w.off, w.payload)
	}
	for _, tc := range []struct {
		name      string
		req       testReq
		wantHoles bool
		chunks    int // exact number of chunks, or 0 for any
	}{
		{"sparse 512 KiB", testReq{typ: cmdRead, off: 0, length: 512 << 10}, true, 0},
		{"sparse, unaligned", testReq{typ: cmdRead, off: 1000, length: dataSize - 1001}, true, 0},
		{"all hole", testReq{typ: cmdRead, off: 400 << 10, length: 300 << 10}, true, 1},
		{"whole disk", testReq{typ: cmdRead, off: 0, length: dataSize}, true, 0},
		{"sparse with DF", testReq{typ: cmdRead, flags: cmdFlagDF, off: 0, length: 512 << 10}, false, 1},
		{"whole disk with DF", testReq{typ: cmdRead, flags: cmdFlagDF, off: 0, length: dataSize}, false, 1},
		{"small", testReq{typ: cmdRead, off: 4000, length: 200}, false, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c.t = t
			rep := c.do(tc.req)
			if rep.errno != 0 {
				t.Fatalf("errno %d", rep.errno)
			}
			want := e.model["data"][tc.req.off : tc.req.off+uint64(tc.req.length)]
			if !bytes.Equal(rep.data, want) {
				t.Errorf("reassembled data differs at byte %d", firstDiff(rep.data, want))
			}
			holes := 0
			for _, ch := range rep.chunks {
				if ch.typ == replyTypeOffsetHole {
					holes++
				}
			}
			if tc.wantHoles && holes == 0 {
				t.Errorf("no OFFSET_HOLE chunk in a sparse read of %d bytes", tc.req.length)
			}
			if tc.chunks > 0 && len(rep.chunks) != tc.chunks {
				t.Errorf("%d chunks, want %d", len(rep.chunks), tc.chunks)
			}
		})
	}
}

// TestBlockStatus: descriptors are consecutive from the offset, non-zero,
// sum to no more than the request, agree with the data, and REQ_ONE gives
// exactly one.
func TestBlockStatus(t *testing.T) {
	e := newEnv(t, Config{}, nil)
	c := e.connect(t, hsOpts{export: exportData, structured: true, meta: []string{metaContextBaseAllocation}})
	w := withPayload(testReq{typ: cmdWrite, off: 64 << 10, length: 64 << 10}, 60)
	if rep := c.do(w); rep.errno != 0 {
		t.Fatalf("write: errno %d", rep.errno)
	}
	e.wrote("data", w.off, w.payload)
	for _, tc := range []struct {
		name  string
		req   testReq
		errno uint32
		min   int // fewest descriptors
	}{
		{"hole, data, hole", testReq{typ: cmdBlockStatus, off: 0, length: 1 << 20}, 0, 3},
		{"unaligned", testReq{typ: cmdBlockStatus, off: 100, length: 100000}, 0, 2},
		{"whole disk", testReq{typ: cmdBlockStatus, off: 0, length: dataSize}, 0, 3},
		{"REQ_ONE", testReq{typ: cmdBlockStatus, flags: cmdFlagReqOne, off: 0, length: 1 << 20}, 0, 1},
		{"REQ_ONE in data", testReq{typ: cmdBlockStatus, flags: cmdFlagReqOne, off: 70 << 10, length: 512 << 10}, 0, 1},
		{"FUA is accepted", testReq{typ: cmdBlockStatus, flags: cmdFlagFUA, off: 0, length: 4096}, 0, 1},
		{"last byte", testReq{typ: cmdBlockStatus, off: dataSize - 1, length: 1}, 0, 1},
		{"across the end", testReq{typ: cmdBlockStatus, off: dataSize - 1, length: 2}, errInval, 0},
		{"overflowing", testReq{typ: cmdBlockStatus, off: overflowOff, length: 4096}, errInval, 0},
		{"zero length", testReq{typ: cmdBlockStatus, off: 0, length: 0}, errInval, 0},
		{"DF", testReq{typ: cmdBlockStatus, flags: cmdFlagDF, length: 4096}, errInval, 0},
		{"4 GiB - 1 on a 2 MiB disk", testReq{typ: cmdBlockStatus, length: math.MaxUint32}, errInval, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c.t = t
			rep := c.do(tc.req)
			if rep.errno != tc.errno {
				t.Fatalf("errno %d, want %d", rep.errno, tc.errno)
			}
			if tc.errno != 0 {
				return
			}
			id, ext := rep.extents()
			if id != baseAllocationID {
				t.Errorf("context id %d, want the one SET_META_CONTEXT returned (%d)", id, baseAllocationID)
			}
			if len(ext) < tc.min {
				t.Errorf("%d descriptors, want at least %d", len(ext), tc.min)
			}
			if tc.req.flags&cmdFlagReqOne != 0 && len(ext) != 1 {
				t.Errorf("REQ_ONE: %d descriptors", len(ext))
			}
			off, end := tc.req.off, tc.req.off+uint64(tc.req.length)
			for i, d := range ext {
				if d[0] == 0 {
					t.Errorf("descriptor %d of length 0", i)
				}
				if off+uint64(d[0]) > end {
					t.Fatalf("descriptors reach %d, beyond the request's end %d", off+uint64(d[0]), end)
				}
				if d[1]&^uint32(stateHole|stateZero) != 0 {
					t.Errorf("descriptor %d: reserved status bits %#x", i, d[1])
				}
				if d[1]&stateZero != 0 {
					if b := e.model["data"][off : off+uint64(d[0])]; firstDiff(b, make([]byte, len(b))) >= 0 {
						t.Errorf("descriptor %d [%d,+%d) says zero; the data is not", i, off, d[0])
					}
				}
				off += uint64(d[0])
			}
		})
	}
}

// TestOutOfOrderReplies sends many requests before reading any reply:
// every request gets exactly one reply, matched by cookie, with the right
// data, whatever the order.
func TestOutOfOrderReplies(t *testing.T) {
	for _, structured := range []bool{false, true} {
		t.Run(fmt.Sprintf("structured=%v", structured), func(t *testing.T) {
			e := newEnv(t, Config{Workers: 8}, nil)
			c := e.connect(t, hsOpts{export: exportRoot, structured: structured})
			var reqs []testReq
			var buf []byte
			for i := range 300 {
				var r testReq
				switch i % 5 {
				case 0, 1, 2: // reads of the first 1 MiB, which nothing writes
					off := uint64(i*7919) % (1 << 20)
					n := uint32(1 + (i*104729)%(96<<10))
					n = min(n, uint32(1<<20-off))
					r = testReq{typ: cmdRead, off: off, length: n}
				case 3: // writes to distinct slots of the last 1 MiB
					r = withPayload(testReq{typ: cmdWrite, off: 1<<20 + uint64(i/5)*4096, length: 4096}, byte(i))
				case 4:
					r = testReq{typ: cmdFlush}
					if i%10 == 9 {
						r = testReq{typ: cmdRead, off: 512 << 10, length: 300 << 10} // sparse
					}
				}
				r.cookie = uint64(1000 + i*3) // distinct, not consecutive
				c.expect(r)
				reqs = append(reqs, r)
				buf = append(buf, reqBytes(r)...)
			}
			werr := make(chan error, 1)
			go func() { werr <- c.write(buf) }() // replies flow while we send
			byCookie := map[uint64]testReq{}
			for _, r := range reqs {
				byCookie[r.cookie] = r
			}
			seen := map[uint64]bool{}
			for range reqs {
				rep, err := c.readReply()
				if err != nil {
					t.Fatalf("after %d replies: %v", len(seen), err)
				}
				r := byCookie[rep.cookie]
				if seen[rep.cookie] {
					t.Fatalf("second reply for cookie %d", rep.cookie)
				}
				seen[rep.cookie] = true
				if rep.errno != 0 {
					t.Errorf("%s: errno %d", reqString(r), rep.errno)
					continue
				}
				switch r.typ {
				case cmdRead:
					if want := e.model["root"][r.off : r.off+uint64(r.length)]; !bytes.Equal(rep.data, want) {
						t.Errorf("%s: data differs at byte %d", reqString(r), firstDiff(rep.data, want))
					}
				case cmdWrite:
					e.wrote("root", r.off, r.payload)
				}
			}
			if err := <-werr; err != nil {
				t.Fatal(err)
			}
			if len(c.pending) != 0 {
				t.Errorf("%d requests without a reply", len(c.pending))
			}
			_ = c.nc.Close()
			e.waitIdle()
			e.checkDisks()
		})
	}
}
