package nbd

import (
	"encoding/binary"
	"io"
	"testing"
	"time"

	"github.com/quiverstorage/quiver/internal/metrics"
	"github.com/quiverstorage/quiver/internal/testserver"
)

// TestHotPathAllocations: 4k READs and WRITEs, one at a time and in bursts
// of 32, allocate nothing per request through the whole stack the server
// runs (NBD, metrics, pool disk). testing.AllocsPerRun counts the process's
// mallocs, so the server's goroutines count too. Under the race detector
// sync.Pool drops items at random: `make test` runs this test a second
// time without it.
func TestHotPathAllocations(t *testing.T) {
	if testserver.RaceEnabled {
		t.Skip("the race detector makes sync.Pool drop items; make test runs this test without -race")
	}
	e := newEnv(t, Config{}, func(x Exports) Exports {
		pe := x.(PoolExports)
		pe.Metrics = metrics.New(pe.Pool)
		return pe
	})
	c := dial(t, e.addr)
	c.handshake(hsOpts{export: exportRoot, structured: true})
	_ = c.nc.SetDeadline(time.Now().Add(time.Minute))

	const bs, burst = 4096, 32
	var wire, replies []byte
	add := func(typ uint16, i int) {
		var h [requestHeaderSize]byte
		binary.BigEndian.PutUint32(h[0:], magicRequest)
		binary.BigEndian.PutUint16(h[6:], typ)
		binary.BigEndian.PutUint64(h[8:], uint64(i+1))
		binary.BigEndian.PutUint64(h[16:], uint64(i*bs))
		binary.BigEndian.PutUint32(h[24:], bs)
		wire = append(wire, h[:]...)
		if typ == cmdWrite {
			wire = append(wire, pattern(byte(i), int64(i*bs), bs)...)
		}
	}
	readReply := structuredHeaderSize + 8 + bs
	// run sends n requests of typ at once and reads their n replies.
	run := func(typ uint16, n int) func() {
		wire = wire[:0]
		for i := range n {
			add(typ, i)
		}
		req := append([]byte(nil), wire...)
		size := simpleReplySize
		if typ == cmdRead {
			size = readReply
		}
		replies = make([]byte, n*size)
		return func() {
			if _, err := c.nc.Write(req); err != nil {
				t.Fatal(err)
			}
			if _, err := io.ReadFull(c.r, replies); err != nil {
				t.Fatal(err)
			}
			for i := 0; i < len(replies); i += size {
				r := replies[i:]
				if typ == cmdRead && (binary.BigEndian.Uint32(r) != magicStructuredReply || binary.BigEndian.Uint16(r[6:]) != replyTypeOffsetData) {
					t.Fatalf("reply %d: not one OFFSET_DATA chunk: % x", i/size, r[:structuredHeaderSize])
				}
				if typ == cmdWrite && (binary.BigEndian.Uint32(r) != magicSimpleReply || binary.BigEndian.Uint32(r[4:]) != 0) {
					t.Fatalf("reply %d: not a simple reply without error: % x", i/size, r[:simpleReplySize])
				}
			}
		}
	}
	for _, tc := range []struct {
		name string
		typ  uint16
		n    int
	}{
		{"write QD1", cmdWrite, 1},
		{"read QD1", cmdRead, 1},
		{"write burst", cmdWrite, burst},
		{"read burst", cmdRead, burst},
	} {
		f := run(tc.typ, tc.n)
		for range 100 { // warm the pools
			f()
		}
		perRun := testing.AllocsPerRun(500, f)
		if perReq := perRun / float64(tc.n); perReq >= 0.5 {
			t.Errorf("%s: %.2f allocations per request, want none", tc.name, perReq)
		} else {
			t.Logf("%s: %.2f allocations per run of %d", tc.name, perRun, tc.n)
		}
	}
}
