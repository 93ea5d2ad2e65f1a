package nbd

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"
)

// Transmission flags quiver must advertise ("Transmission flags"): exactly
// what each export does, no more.
const (
	wantFlagsRW = tflagHasFlags | tflagSendFlush | tflagSendFUA | tflagSendTrim | tflagSendWriteZeroes |
		tflagCanMultiConn | tflagSendCache | tflagSendFastZero
	wantFlagsRO = tflagHasFlags | tflagReadOnly | tflagSendFlush | tflagCanMultiConn | tflagSendCache
)

// negStep is one option and what the server must answer.
type negStep struct {
	opt   uint32
	data  []byte
	want  []uint32 // reply types, in order
	check func(t *testing.T, reps []optReply)
}

// infos returns the NBD_REP_INFO payloads by information type, failing on
// a type sent twice.
func infos(t *testing.T, reps []optReply) map[uint16][]byte {
	t.Helper()
	m := map[uint16][]byte{}
	for _, r := range reps {
		if r.typ != repInfo {
			continue
		}
		if len(r.data) < 2 {
			t.Fatalf("NBD_REP_INFO of %d bytes", len(r.data))
		}
		typ := binary.BigEndian.Uint16(r.data)
		if _, dup := m[typ]; dup {
			t.Errorf("information type %d sent twice", typ)
		}
		m[typ] = r.data[2:]
	}
	return m
}

func checkExportInfo(size uint64, flags uint16) func(*testing.T, []optReply) {
	return func(t *testing.T, reps []optReply) {
		t.Helper()
		gotSize, gotFlags := exportInfo(t, reps)
		if gotSize != size || gotFlags != flags {
			t.Errorf("NBD_INFO_EXPORT: size %d flags %#x, want %d %#x", gotSize, gotFlags, size, flags)
		}
		bs := infos(t, reps)[infoBlockSize]
		if len(bs) != 12 {
			t.Fatalf("NBD_INFO_BLOCK_SIZE of %d bytes, want 12", len(bs)+2)
		}
		lo, pref, hi := binary.BigEndian.Uint32(bs), binary.BigEndian.Uint32(bs[4:]), binary.BigEndian.Uint32(bs[8:])
		// "Block size constraints".
		pow2 := func(v uint32) bool { return v != 0 && v&(v-1) == 0 }
		if !pow2(lo) || lo > 1<<16 || !pow2(pref) || pref < max(lo, 512) || hi%lo != 0 || uint64(hi) < min(uint64(pref), size) {
			t.Errorf("block sizes %d/%d/%d break the spec's rules", lo, pref, hi)
		}
		if lo != 1 || pref != 4096 || hi != 32<<20 {
			t.Errorf("block sizes %d/%d/%d, want 1/4096/32 MiB", lo, pref, hi)
		}
	}
}

func checkInfoText(typ uint16, want string) func(*testing.T, []optReply) {
	return func(t *testing.T, reps []optReply) {
		t.Helper()
		got, ok := infos(t, reps)[typ]
		if want == "" {
			if ok {
				t.Errorf("information type %d sent unasked: %q", typ, got)
			}
			return
		}
		if string(got) != want {
			t.Errorf("information type %d: %q, want %q", typ, got, want)
		}
	}
}

func checkAll(fs ...func(*testing.T, []optReply)) func(*testing.T, []optReply) {
	return func(t *testing.T, reps []optReply) {
		t.Helper()
		for _, f := range fs {
			f(t, reps)
		}
	}
}

// checkContexts checks the NBD_REP_META_CONTEXT replies: their names, and
// the id rule of the option (zero for LIST, non-zero and unique for SET).
func checkContexts(opt uint32, names ...string) func(*testing.T, []optReply) {
	return func(t *testing.T, reps []optReply) {
		t.Helper()
		var got []string
		for _, r := range reps {
			if r.typ != repMetaContext {
				continue
			}
			if len(r.data) < 4 {
				t.Fatalf("NBD_REP_META_CONTEXT of %d bytes", len(r.data))
			}
			id := binary.BigEndian.Uint32(r.data)
			if opt == optListMetaContext && id != 0 {
				t.Errorf("LIST_META_CONTEXT: context id %d, the spec says it SHOULD be zero", id)
			}
			if opt == optSetMetaContext && id == 0 {
				t.Errorf("SET_META_CONTEXT: context id 0")
			}
			got = append(got, string(r.data[4:]))
		}
		if !slices.Equal(got, names) {
			t.Errorf("contexts %q, want %q", got, names)
		}
	}
}

var (
	ack       = []uint32{repAck}
	info2     = []uint32{repInfo, repInfo, repAck}
	info3     = []uint32{repInfo, repInfo, repInfo, repAck}
	info4     = []uint32{repInfo, repInfo, repInfo, repInfo, repAck}
	oneCtx    = []uint32{repMetaContext, repAck}
	twoCtx    = []uint32{repMetaContext, repMetaContext, repAck}
	errInv    = []uint32{repErrInvalid}
	errUnk    = []uint32{repErrUnknown}
	structOpt = negStep{opt: optStructuredReply, want: ack}
)

func TestNegotiationOptions(t *testing.T) {
	e := newEnv(t, Config{}, nil)
	listAll := []string{"vm/root", "vm/data", "vm@snap/root", "vm@snap/data"}
	cases := []struct {
		name  string
		steps []negStep
	}{
		{"list", []negStep{{opt: optList, want: []uint32{repServer, repServer, repServer, repServer, repAck},
			check: func(t *testing.T, reps []optReply) {
				var names []string
				for _, r := range reps[:len(reps)-1] {
					n := binary.BigEndian.Uint32(r.data)
					if uint64(n) > uint64(len(r.data)-4) {
						t.Fatalf("NBD_REP_SERVER name length %d in %d bytes", n, len(r.data))
					}
					names = append(names, string(r.data[4:4+n]))
					if desc := string(r.data[4+n:]); !strings.Contains(desc, "disk") {
						t.Errorf("export %q: description %q", names[len(names)-1], desc)
					}
				}
				if !slices.Equal(names, listAll) {
					t.Errorf("exports %q, want %q", names, listAll)
				}
			}}}},
		{"list with data", []negStep{{opt: optList, data: []byte{0}, want: errInv}}},

		{"info, no requests", []negStep{{opt: optInfo, data: goData(exportRoot), want: info2,
			check: checkAll(checkExportInfo(rootSize, wantFlagsRW), checkInfoText(infoName, ""), checkInfoText(infoDescription, ""))}}},
		{"info, block size", []negStep{{opt: optInfo, data: goData(exportRoot, infoBlockSize), want: info2,
			check: checkExportInfo(rootSize, wantFlagsRW)}}},
		{"info, name", []negStep{{opt: optInfo, data: goData(exportRoot, infoName), want: info3,
			check: checkInfoText(infoName, exportRoot)}}},
		{"info, description", []negStep{{opt: optInfo, data: goData(exportData, infoDescription), want: info3,
			check: checkInfoText(infoDescription, "disk data of volume vm")}}},
		{"info, everything and an unknown request", []negStep{{opt: optInfo,
			data: goData(exportSnap, infoName, infoDescription, infoBlockSize, 0x7777), want: info4,
			check: checkAll(checkExportInfo(rootSize, wantFlagsRO), checkInfoText(infoName, exportSnap),
				checkInfoText(infoDescription, "disk root of snapshot snap of volume vm, read-only"))}}},
		{"info twice", []negStep{
			{opt: optInfo, data: goData(exportRoot), want: info2},
			{opt: optInfo, data: goData(exportSnap), want: info2, check: checkExportInfo(rootSize, wantFlagsRO)}}},
		{"info with structured replies", []negStep{structOpt,
			{opt: optInfo, data: goData(exportData), want: info2, check: checkExportInfo(dataSize, wantFlagsRW|tflagSendDF)}}},

		{"unknown volume", []negStep{{opt: optGo, data: goData("nosuch/root"), want: errUnk}}},
		{"unknown disk", []negStep{{opt: optInfo, data: goData("vm/nosuch"), want: errUnk}}},
		{"unknown snapshot", []negStep{{opt: optGo, data: goData("vm@nosuch/root"), want: errUnk}}},
		{"unknown disk of snapshot", []negStep{{opt: optGo, data: goData("vm@snap/nosuch"), want: errUnk}}},
		{"empty export name", []negStep{{opt: optGo, data: goData(""), want: errInv}}},
		{"export name without disk", []negStep{{opt: optGo, data: goData("vm"), want: errInv}}},
		{"export name not a DNS label", []negStep{{opt: optGo, data: goData("vm/Root!"), want: errInv}}},
		{"export name with NUL", []negStep{{opt: optGo, data: goData("vm/ro\x00ot"), want: errInv}}},
		{"export name too long", []negStep{{opt: optGo, data: goData(strings.Repeat("a", 5000)), want: errInv}}},
		{"export name of 4096 bytes", []negStep{{opt: optGo, data: goData(strings.Repeat("a", 4096)), want: errInv}}},
		{"export name of 2048 two-byte runes", []negStep{{opt: optGo, data: goData("vm/" + strings.Repeat("é", 2046)), want: errInv}}},
		{"missing export of 4096 bytes", []negStep{{opt: optGo, data: goData("vm@" + strings.Repeat("s", 4000) + "/root"), want: errInv}}},
		{"go data too short", []negStep{{opt: optGo, data: []byte{0, 0, 0, 0, 0}, want: errInv}}},
		{"go name beyond data", []negStep{{opt: optGo, data: append(be32(100), "vm/root\x00\x00"...), want: errInv}}},
		{"go request count beyond data", []negStep{{opt: optGo, data: goData(exportRoot, 1)[:4+7+2], want: errInv}}},
		{"go trailing bytes", []negStep{{opt: optInfo, data: append(goData(exportRoot), 0), want: errInv}}},

		{"structured reply with data", []negStep{{opt: optStructuredReply, data: []byte{1}, want: errInv}}},
		{"set meta context before structured replies", []negStep{
			{opt: optSetMetaContext, data: metaData(exportRoot, metaContextBaseAllocation), want: errInv}}},
		{"list meta context, no query", []negStep{structOpt,
			{opt: optListMetaContext, data: metaData(exportRoot), want: twoCtx,
				check: checkContexts(optListMetaContext, "base:allocation", "qemu:dirty-bitmap:snap")}}},
		{"list meta context, base:", []negStep{structOpt,
			{opt: optListMetaContext, data: metaData(exportRoot, "base:"), want: oneCtx, check: checkContexts(optListMetaContext, "base:allocation")}}},
		{"list meta context, base:allocation", []negStep{structOpt,
			{opt: optListMetaContext, data: metaData(exportRoot, "base:allocation"), want: oneCtx}}},
		{"list meta context, unknown contexts", []negStep{structOpt,
			{opt: optListMetaContext, data: metaData(exportRoot, "base:nosuch", "qemu:dirty-bitmap:b", "x-foo:"), want: ack}}},
		{"set meta context, base:allocation", []negStep{structOpt,
			{opt: optSetMetaContext, data: metaData(exportRoot, "qemu:allocation-depth", "base:allocation"), want: oneCtx,
				check: checkContexts(optSetMetaContext, "base:allocation")}}},
		{"set meta context, base: selects nothing", []negStep{structOpt,
			{opt: optSetMetaContext, data: metaData(exportRoot, "base:"), want: ack}}},
		{"set meta context, no query selects nothing", []negStep{structOpt,
			{opt: optSetMetaContext, data: metaData(exportRoot), want: ack}}},
		{"set meta context, unknown", []negStep{structOpt,
			{opt: optSetMetaContext, data: metaData(exportRoot, "base:nosuch", "x-foo:bar"), want: ack}}},
		{"meta context truncated", []negStep{structOpt,
			{opt: optSetMetaContext, data: metaData(exportRoot, "base:allocation")[:20], want: errInv}}},
		{"meta context count beyond data", []negStep{structOpt,
			{opt: optListMetaContext, data: append(be32(0), be32(1000)...), want: errInv}}},
		{"meta context trailing bytes", []negStep{structOpt,
			{opt: optListMetaContext, data: append(metaData(exportRoot, "base:"), 0), want: errInv}}},
		{"meta context query too long is skipped", []negStep{structOpt,
			{opt: optListMetaContext, data: metaData(exportRoot, "base:"+strings.Repeat("a", 5000)), want: ack}}},

		{"starttls refused", []negStep{{opt: optStartTLS, want: []uint32{repErrPolicy}}}},
		{"unknown option", []negStep{{opt: 99, want: []uint32{repErrUnsup}}}},
		{"withdrawn NBD_OPT_PEEK_EXPORT", []negStep{{opt: 4, data: []byte("x"), want: []uint32{repErrUnsup}}}},
		{"extended headers not offered", []negStep{{opt: 11, want: []uint32{repErrUnsup}}}},
		{"option too big, then more options", []negStep{
			{opt: optList, data: make([]byte, maxOptionLength+1), want: []uint32{repErrTooBig}},
			{opt: optInfo, data: goData(exportRoot), want: info2}}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c := dial(t, e.addr)
			c.mustGreet(clientFlagFixedNewstyle)
			for i, s := range tc.steps {
				reps := c.option(s.opt, s.data)
				var got []uint32
				for _, r := range reps {
					got = append(got, r.typ)
					if r.opt != s.opt {
						t.Errorf("step %d: reply names option %d, want %d", i, r.opt, s.opt)
					}
				}
				if !slices.Equal(got, s.want) {
					t.Fatalf("step %d (option %d): replies %#x, want %#x: %s", i, s.opt, got, s.want, describe(reps))
				}
				if s.check != nil {
					s.check(t, reps)
				}
			}
			// The negotiation goes on after every error: the connection is
			// still in sync and answers ABORT.
			if reps := c.option(optAbort, nil); final(reps) != repAck || len(reps) != 1 {
				t.Errorf("ABORT: %s", describe(reps))
			}
			c.expectClosed(5 * time.Second)
		})
	}
}

// TestNegotiationEnds covers the ways a negotiation ends without entering
// transmission: the server closes the connection, sending nothing more
// than the replies listed.
func TestNegotiationEnds(t *testing.T) {
	e := newEnv(t, Config{}, nil)
	cases := []struct {
		name        string
		clientFlags uint32
		send        []byte
		replies     []uint32 // option replies before the close
	}{
		{"abort", clientFlagFixedNewstyle, optBytes(optAbort, nil), ack},
		{"abort with data", clientFlagFixedNewstyle, optBytes(optAbort, []byte("bye")), ack},
		{"export name of a missing export", clientFlagFixedNewstyle, optBytes(optExportName, []byte("vm/nosuch")), nil},
		{"export name of a bad export name", clientFlagFixedNewstyle, optBytes(optExportName, []byte("nonsense")), nil},
		{"export name too long", clientFlagFixedNewstyle, optBytes(optExportName, make([]byte, maxOptionLength+1)), nil},
		{"bad option magic", clientFlagFixedNewstyle, bytes.Repeat([]byte{0x55}, 16), nil},
		{"unknown client flag", clientFlagFixedNewstyle | 1<<7, optBytes(optList, nil), nil},
		{"client without fixed newstyle", 0, optBytes(optList, nil), nil},
		{"option far too big", clientFlagFixedNewstyle, optBytes(optList, nil)[:12], nil},
		{"too many options", clientFlagFixedNewstyle, bytes.Repeat(optBytes(99, nil), maxOptions+1),
			slices.Repeat([]uint32{repErrUnsup}, maxOptions)},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c := dial(t, e.addr)
			c.mustGreet(tc.clientFlags)
			send := tc.send
			if tc.name == "option far too big" {
				send = append(send, be32(1<<30)...) // 1 GiB of option data announced
			}
			c.mustWrite(send)
			for i, want := range tc.replies {
				rep, err := c.readOptReply()
				if err != nil {
					t.Fatalf("reply %d: %v", i, err)
				}
				if rep.typ != want {
					t.Fatalf("reply %d: type %#x, want %#x", i, rep.typ, want)
				}
			}
			c.expectClosed(5 * time.Second)
		})
	}
}

// TestTransmissionFlags checks the flags of every way into transmission,
// and that the stream is in sync right after (a READ works).
func TestTransmissionFlags(t *testing.T) {
	e := newEnv(t, Config{}, nil)
	for _, tc := range []struct {
		export     string
		structured bool
		exportName bool
		noZeroes   bool
		want       uint16
		size       uint64
	}{
		{exportRoot, false, false, false, wantFlagsRW, rootSize},
		{exportRoot, true, false, false, wantFlagsRW | tflagSendDF, rootSize},
		{exportData, false, true, false, wantFlagsRW, dataSize},
		{exportData, false, true, true, wantFlagsRW, dataSize},
		{exportData, true, true, true, wantFlagsRW | tflagSendDF, dataSize},
		{exportSnap, false, false, false, wantFlagsRO, rootSize},
		{exportSnap, true, false, false, wantFlagsRO | tflagSendDF, rootSize},
		{exportSnap, false, true, false, wantFlagsRO, rootSize},
		{exportSnap, true, true, true, wantFlagsRO | tflagSendDF, rootSize},
	} {
		name := fmt.Sprintf("%s structured=%v export_name=%v no_zeroes=%v", tc.export, tc.structured, tc.exportName, tc.noZeroes)
		t.Run(name, func(t *testing.T) {
			c := dial(t, e.addr)
			c.handshake(hsOpts{export: tc.export, structured: tc.structured, exportName: tc.exportName, noZeroes: tc.noZeroes})
			if c.flags != tc.want || c.size != tc.size {
				t.Errorf("size %d flags %#x, want %d %#x", c.size, c.flags, tc.size, tc.want)
			}
			disk := "root"
			if tc.export == exportData {
				disk = "data"
			}
			rep := c.do(testReq{typ: cmdRead, off: 0, length: 4096})
			if rep.errno != 0 || !bytes.Equal(rep.data, e.model[disk][:4096]) {
				t.Errorf("READ after the handshake: errno %d, data mismatch %v", rep.errno, !bytes.Equal(rep.data, e.model[disk][:4096]))
			}
		})
	}
}

// TestSetMetaContextReplaces: each SET_META_CONTEXT replaces the previous
// selection, also when it fails or selects nothing ("NBD_OPT_SET_META_CONTEXT").
func TestSetMetaContextReplaces(t *testing.T) {
	e := newEnv(t, Config{}, nil)
	for _, tc := range []struct {
		name   string
		second []byte
	}{
		{"then nothing", metaData(exportRoot)},
		{"then unknown", metaData(exportRoot, "x-foo:bar")},
		{"then malformed", metaData(exportRoot, "base:allocation")[:13]},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := dial(t, e.addr)
			c.mustGreet(clientFlagFixedNewstyle)
			c.option(optStructuredReply, nil)
			c.structured = true
			if reps := c.option(optSetMetaContext, metaData(exportRoot, metaContextBaseAllocation)); final(reps) != repAck {
				t.Fatal(describe(reps))
			}
			c.option(optSetMetaContext, tc.second)
			reps := c.option(optGo, goData(exportRoot))
			if final(reps) != repAck {
				t.Fatal(describe(reps))
			}
			if rep := c.do(testReq{typ: cmdBlockStatus, length: 4096}); rep.errno != errInval {
				t.Errorf("BLOCK_STATUS with no context selected: errno %d, want EINVAL", rep.errno)
			}
		})
	}
}

// TestHandshakeTimeout: a client that stalls anywhere in the handshake is
// disconnected once Config.HandshakeTimeout has passed. The 5 s bound only
// checks liveness; the timeout is 200 ms.
func TestHandshakeTimeout(t *testing.T) {
	e := newEnv(t, Config{HandshakeTimeout: 200 * time.Millisecond}, nil)
	for _, tc := range []struct {
		name string
		send func(c *testClient)
	}{
		{"silent after the greeting", func(c *testClient) {
			if _, err := c.greeting(); err != nil {
				c.t.Fatal(err)
			}
		}},
		{"after the greeting", func(c *testClient) { c.mustGreet(clientFlagFixedNewstyle) }},
		{"half a client flags field", func(c *testClient) {
			if _, err := c.greeting(); err != nil {
				c.t.Fatal(err)
			}
			c.mustWrite([]byte{0, 0})
		}},
		{"mid option header", func(c *testClient) {
			c.mustGreet(clientFlagFixedNewstyle)
			c.mustWrite(optBytes(optList, nil)[:10])
		}},
		{"mid option data", func(c *testClient) {
			c.mustGreet(clientFlagFixedNewstyle)
			c.mustWrite(optBytes(optGo, goData(exportRoot))[:20])
		}},
		{"trickling options", func(c *testClient) {
			c.mustGreet(clientFlagFixedNewstyle)
			// Valid options, one every 50 ms: the timeout bounds the whole
			// negotiation, not each read, so the server must hang up.
			for range 100 {
				if err := c.write(optBytes(optList, nil)); err != nil {
					return
				}
				if _, err := c.optReplies(optList); err != nil {
					return
				}
				time.Sleep(50 * time.Millisecond)
			}
			c.t.Fatal("still negotiating after 100 options over 5 s")
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := dial(t, e.addr)
			tc.send(c)
			c.expectClosed(5 * time.Second)
		})
	}
	// A client that finished the handshake is not subject to the timeout.
	c := e.connect(t, hsOpts{export: exportRoot})
	time.Sleep(400 * time.Millisecond)
	if rep := c.do(testReq{typ: cmdRead, length: 512}); rep.errno != 0 {
		t.Errorf("READ after idling in transmission: errno %d", rep.errno)
	}
}
