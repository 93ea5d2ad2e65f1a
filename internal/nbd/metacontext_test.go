package nbd

import (
	"context"
	"encoding/binary"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/quiverstorage/quiver/internal/pool"
)

// changeExports serves memExports' disks; those named in deltas offer a
// change report (pool.Capabilities.Changes) with the deltas given per
// base snapshot, an error for the bases in fail. It counts the deltas
// computed per base.
type changeExports struct {
	*memExports
	deltas map[string]map[string][]pool.ChangedRange // export -> base -> ranges
	fail   map[string]error                          // base -> ChangesSince's error
	mu     sync.Mutex
	calls  map[string]int // base -> ChangesSince calls
}

func (e *changeExports) Open(ctx context.Context, name, peer string) (Export, error) {
	x, err := e.memExports.Open(ctx, name, peer)
	if err != nil {
		return x, err
	}
	if d, ok := e.deltas[name]; ok {
		x.Disk = &changeHandle{Disk: x.Disk, e: e, deltas: d}
	}
	return x, nil
}

func (e *changeExports) computed(base string) int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.calls[base]
}

// changeHandle is a memHandle that reports its disk's changes.
type changeHandle struct {
	pool.Disk
	e      *changeExports
	deltas map[string][]pool.ChangedRange
}

func (h *changeHandle) Capabilities() pool.Capabilities { return pool.Capabilities{Changes: h} }

func (h *changeHandle) Checkpoints() []string {
	var out []string
	for b := range h.deltas {
		out = append(out, b)
	}
	slices.Sort(out)
	return out
}

func (h *changeHandle) ChangesSince(ctx context.Context, base string) ([]pool.ChangedRange, error) {
	h.e.mu.Lock()
	h.e.calls[base]++
	h.e.mu.Unlock()
	if err := h.e.fail[base]; err != nil {
		return nil, err
	}
	r, ok := h.deltas[base]
	if !ok {
		return nil, fmt.Errorf("%w: %s", pool.ErrSnapshotNotFound, base)
	}
	return r, nil
}

// The deltas of the snapshot's export (memRootSize is 1 MiB): since mon,
// two runs, one up to the end; since tue, nothing; since old, the delta
// fails (its change record is missing).
var (
	sinceMon = []pool.ChangedRange{{Offset: 64 << 10, Length: 128 << 10}, {Offset: 512 << 10, Length: 512 << 10}}
	sinceTue = []pool.ChangedRange{}
)

func newChangeExports() *changeExports {
	return &changeExports{memExports: newMemExports(),
		deltas: map[string]map[string][]pool.ChangedRange{
			exportSnap: {"mon": sinceMon, "tue": sinceTue, "old": nil},
			exportRoot: {"mon": sinceMon},
		},
		fail:  map[string]error{"old": pool.ErrNoCheckpoint},
		calls: map[string]int{}}
}

// contextIDs returns the contexts of META_CONTEXT replies by name.
func contextIDs(t *testing.T, reps []optReply) map[string]uint32 {
	t.Helper()
	ids := map[string]uint32{}
	for _, r := range reps {
		if r.typ == repMetaContext {
			if len(r.data) < 4 {
				t.Fatalf("NBD_REP_META_CONTEXT of %d bytes", len(r.data))
			}
			ids[string(r.data[4:])] = binary.BigEndian.Uint32(r.data)
		}
	}
	return ids
}

func contextNames(ids map[string]uint32) []string {
	var out []string
	for n := range ids {
		out = append(out, n)
	}
	slices.Sort(out)
	return out
}

// TestDirtyBitmapContexts: LIST and SET of qemu:dirty-bitmap: follow QEMU's
// queries (docs/interop/nbd.rst: qemu: and qemu:dirty-bitmap: list every
// bitmap); each selected context has its own non-zero id; a name that is
// not offered (unknown, whose delta fails, a path, too long, an empty
// leaf, on an export without a change report or that does not exist)
// selects nothing and leaves the negotiation going.
func TestDirtyBitmapContexts(t *testing.T) {
	e := newChangeExports()
	addr := serveExports(t, "tcp", e, Config{})
	bm := func(s string) string { return metaContextDirtyBitmap + s }
	long := bm(strings.Repeat("m", maxStringLength)) // a query of more than 4096 bytes
	for _, tc := range []struct {
		name    string
		opt     uint32
		export  string
		queries []string
		want    []string // contexts, sorted
	}{
		{"list everything", optListMetaContext, exportSnap, nil, []string{"base:allocation", bm("mon"), bm("old"), bm("tue")}},
		{"list qemu:", optListMetaContext, exportSnap, []string{"qemu:"}, []string{bm("mon"), bm("old"), bm("tue")}},
		{"list qemu:dirty-bitmap:", optListMetaContext, exportSnap, []string{"qemu:dirty-bitmap:"}, []string{bm("mon"), bm("old"), bm("tue")}},
		{"list one", optListMetaContext, exportSnap, []string{bm("tue"), bm("nosuch")}, []string{bm("tue")}},
		{"list on an export without change report", optListMetaContext, exportData, nil, []string{"base:allocation"}},
		{"list on an unknown export", optListMetaContext, "vm@nosuch/root", []string{"qemu:"}, nil},
		{"set both", optSetMetaContext, exportSnap, []string{bm("mon"), "base:allocation"}, []string{"base:allocation", bm("mon")}},
		{"set two bitmaps", optSetMetaContext, exportSnap, []string{bm("mon"), bm("tue"), bm("mon")}, []string{bm("mon"), bm("tue")}},
		{"set on a live export", optSetMetaContext, exportRoot, []string{bm("mon")}, []string{bm("mon")}},
		{"set, delta fails", optSetMetaContext, exportSnap, []string{bm("old")}, nil},
		{"set, unknown and bad names", optSetMetaContext, exportSnap,
			[]string{bm("nosuch"), bm("../mon"), bm("mon/"), bm(""), bm("mon\x00"), "qemu:", "qemu:dirty-bitmap", long}, nil},
		{"set, too long a name among good ones", optSetMetaContext, exportSnap, []string{long, bm("tue")}, []string{bm("tue")}},
		{"set on an export without change report", optSetMetaContext, exportData, []string{bm("mon")}, nil},
		{"set on an unknown export", optSetMetaContext, "vm@nosuch/root", []string{bm("mon"), "base:allocation"}, []string{"base:allocation"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := dial(t, addr)
			c.mustGreet(clientFlagFixedNewstyle)
			if reps := c.option(optStructuredReply, nil); final(reps) != repAck {
				t.Fatalf("STRUCTURED_REPLY: %s", describe(reps))
			}
			c.structured = true
			reps := c.option(tc.opt, metaData(tc.export, tc.queries...))
			if final(reps) != repAck {
				t.Fatalf("option %d: %s", tc.opt, describe(reps))
			}
			ids := contextIDs(t, reps)
			if got := contextNames(ids); !slices.Equal(got, tc.want) {
				t.Errorf("contexts %q, want %q", got, tc.want)
			}
			seen := map[uint32]bool{}
			for name, id := range ids {
				switch {
				case tc.opt == optListMetaContext && id != 0:
					t.Errorf("LIST: %s has id %d, want 0", name, id)
				case tc.opt == optSetMetaContext && (id == 0 || seen[id]):
					t.Errorf("SET: %s has id %d, not a fresh non-zero id", name, id)
				}
				seen[id] = true
			}
			// The negotiation goes on.
			c.handshake2Go(exportSnap)
		})
	}
	// Every handle opened to look for bitmaps is closed: once the clients
	// are gone, none is left.
	deadline := time.Now().Add(5 * time.Second)
	for {
		e.memExports.mu.Lock()
		open := e.memExports.open
		e.memExports.mu.Unlock()
		if open == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d disk handles left open after every client left", open)
		}
		time.Sleep(5 * time.Millisecond)
	}
	checkExports(t, e.memExports)
}

// TestDirtyBitmapTooMany: a SET that selects more bitmaps than maxBitmaps
// is refused with NBD_REP_ERR_TOO_BIG, and the negotiation goes on.
func TestDirtyBitmapTooMany(t *testing.T) {
	e := newChangeExports()
	many := map[string][]pool.ChangedRange{}
	var queries []string
	for i := range maxBitmaps + 1 {
		many[fmt.Sprint("s", i)] = nil
		queries = append(queries, fmt.Sprint(metaContextDirtyBitmap, "s", i))
	}
	e.deltas[exportSnap] = many
	c := dial(t, serveExports(t, "tcp", e, Config{}))
	c.mustGreet(clientFlagFixedNewstyle)
	c.option(optStructuredReply, nil)
	if reps := c.option(optSetMetaContext, metaData(exportSnap, queries...)); final(reps) != repErrTooBig {
		t.Fatalf("SET of %d bitmaps: %s, want NBD_REP_ERR_TOO_BIG", len(queries), describe(reps))
	}
	if reps := c.option(optSetMetaContext, metaData(exportSnap, queries[:maxBitmaps]...)); len(contextIDs(t, reps)) != maxBitmaps {
		t.Fatalf("SET of %d bitmaps: %s", maxBitmaps, describe(reps))
	}
}

// statusChunks decodes the BLOCK_STATUS chunks of a reply by context id,
// checking that each context answers once.
func statusChunks(t *testing.T, rep *tReply) map[uint32][]statusExtent {
	t.Helper()
	if rep.errno != 0 {
		t.Fatalf("BLOCK_STATUS: errno %d (%s)", rep.errno, rep.msg)
	}
	out := map[uint32][]statusExtent{}
	for _, ch := range rep.chunks {
		if ch.typ != replyTypeBlockStatus {
			t.Fatalf("chunk type %d in a BLOCK_STATUS reply", ch.typ)
		}
		id := binary.BigEndian.Uint32(ch.payload)
		if _, dup := out[id]; dup {
			t.Fatalf("two chunks for context %d", id)
		}
		var ext []statusExtent
		for p := ch.payload[4:]; len(p) >= 8; p = p[8:] {
			ext = append(ext, statusExtent{binary.BigEndian.Uint32(p), binary.BigEndian.Uint32(p[4:])})
		}
		out[id] = ext
	}
	return out
}

// dirtyAt is the expected flags of the byte at off by ranges.
func dirtyAt(ranges []pool.ChangedRange, off int64) uint32 {
	for _, r := range ranges {
		if off >= r.Offset && off < r.Offset+r.Length {
			return stateDirty
		}
	}
	return 0
}

// TestDirtyBitmapBlockStatus: with base:allocation and two bitmaps
// selected, every BLOCK_STATUS gets one chunk per context, each with
// consecutive non-empty extents within the request (REQ_ONE: exactly one)
// whose flags are NBD_STATE_DIRTY exactly on the changed ranges; the delta
// is computed once per connection and context, not per request. A bitmap
// selected for another export than the one opened is dropped.
func TestDirtyBitmapBlockStatus(t *testing.T) {
	e := newChangeExports()
	addr := serveExports(t, "tcp", e, Config{})
	c := dial(t, addr)
	c.mustGreet(clientFlagFixedNewstyle)
	c.option(optStructuredReply, nil)
	c.structured = true
	reps := c.option(optSetMetaContext, metaData(exportSnap, "base:allocation",
		metaContextDirtyBitmap+"mon", metaContextDirtyBitmap+"tue"))
	ids := contextIDs(t, reps)
	if len(ids) != 3 {
		t.Fatalf("SET: %s", describe(reps))
	}
	c.contexts = 3
	c.handshake2Go(exportSnap)
	deltas := map[uint32][]pool.ChangedRange{ids[metaContextDirtyBitmap+"mon"]: sinceMon, ids[metaContextDirtyBitmap+"tue"]: sinceTue}
	for _, tc := range []struct {
		name    string
		off     int64
		length  uint32
		flags   uint16
		minDesc int // fewest extents of the mon bitmap
	}{
		{"whole disk", 0, memRootSize, 0, 4},
		{"inside a dirty run", 80 << 10, 4096, 0, 1},
		{"clean then dirty", 0, 100 << 10, 0, 2},
		{"dirty then clean", 100 << 10, 200 << 10, 0, 2},
		{"unaligned across runs", 12345, 600 << 10, 0, 4},
		{"to the end", 1000 << 10, memRootSize - 1000<<10, 0, 1},
		{"REQ_ONE clean", 0, memRootSize, cmdFlagReqOne, 1},
		{"REQ_ONE dirty", 70 << 10, 4096, cmdFlagReqOne, 1},
		{"REQ_ONE dirty, short", 190 << 10, 100 << 10, cmdFlagReqOne, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c.t = t
			rep := c.do(testReq{typ: cmdBlockStatus, flags: tc.flags, off: uint64(tc.off), length: tc.length})
			chunks := statusChunks(t, rep)
			if len(chunks) != 3 {
				t.Fatalf("%d chunks, want one per context (3)", len(chunks))
			}
			for id, ext := range chunks {
				if id != ids["base:allocation"] && deltas[id] == nil && id != ids[metaContextDirtyBitmap+"tue"] {
					t.Fatalf("chunk for context %d, not selected (%v)", id, ids)
				}
				if len(ext) == 0 || (tc.flags&cmdFlagReqOne != 0 && len(ext) != 1) {
					t.Fatalf("context %d: %d extents", id, len(ext))
				}
				off, sum := tc.off, int64(0)
				for _, x := range ext {
					if x.length == 0 {
						t.Fatalf("context %d: empty extent", id)
					}
					if id != ids["base:allocation"] {
						for _, o := range []int64{off, off + int64(x.length) - 1} {
							if want := dirtyAt(deltas[id], o); x.flags != want {
								t.Errorf("context %d: extent [%d,+%d) flags %d; byte %d has %d", id, off, x.length, x.flags, o, want)
							}
						}
					}
					off += int64(x.length)
					sum += int64(x.length)
				}
				if sum > int64(tc.length) {
					t.Errorf("context %d: extents cover %d bytes, beyond the request's %d", id, sum, tc.length)
				}
				if id == ids[metaContextDirtyBitmap+"mon"] && len(ext) < tc.minDesc {
					t.Errorf("mon: %d extents %v, want at least %d", len(ext), ext, tc.minDesc)
				}
				// Without REQ_ONE a bitmap covers the whole request, and
				// flags alternate: its extents are as few as can be.
				if id != ids["base:allocation"] && tc.flags&cmdFlagReqOne == 0 {
					if sum != int64(tc.length) {
						t.Errorf("context %d: extents cover %d bytes of %d", id, sum, tc.length)
					}
					for i := 1; i < len(ext); i++ {
						if ext[i].flags == ext[i-1].flags {
							t.Errorf("context %d: adjacent extents with the same flags: %v", id, ext)
						}
					}
				}
			}
		})
	}
	c.t = t
	if n, m := e.computed("mon"), e.computed("tue"); n != 1 || m != 1 {
		t.Errorf("deltas computed: mon %d times, tue %d; want once each for the connection", n, m)
	}

	// A bitmap alone; then a GO on another export than the SET's drops it.
	for _, tc := range []struct {
		name, set, goTo string
		errno           uint32
	}{
		{"bitmap alone", exportSnap, exportSnap, 0},
		{"GO on another export", exportRoot, exportSnap, errInval},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := dial(t, addr)
			c.mustGreet(clientFlagFixedNewstyle)
			c.option(optStructuredReply, nil)
			c.structured = true
			if ids := contextIDs(t, c.option(optSetMetaContext, metaData(tc.set, metaContextDirtyBitmap+"mon"))); len(ids) != 1 {
				t.Fatalf("SET: %v", ids)
			}
			c.handshake2Go(tc.goTo)
			rep := c.do(testReq{typ: cmdBlockStatus, off: 0, length: memRootSize})
			if rep.errno != tc.errno {
				t.Fatalf("BLOCK_STATUS: errno %d, want %d", rep.errno, tc.errno)
			}
			if tc.errno == 0 {
				if chunks := statusChunks(t, rep); len(chunks) != 1 {
					t.Fatalf("%d chunks, want 1", len(chunks))
				}
			}
		})
	}
}

// TestBitmapExtents: the extents of a range by the dirty ranges, clipped
// to the range and to limit.
func TestBitmapExtents(t *testing.T) {
	rs := []pool.ChangedRange{{Offset: 100, Length: 50}, {Offset: 200, Length: 100}}
	clean := func(n uint32) statusExtent { return statusExtent{n, 0} }
	dirty := func(n uint32) statusExtent { return statusExtent{n, stateDirty} }
	for _, tc := range []struct {
		name        string
		ranges      []pool.ChangedRange
		off, length int64
		limit       int
		want        []statusExtent
	}{
		{"nothing changed", nil, 0, 1000, 10, []statusExtent{clean(1000)}},
		{"everything", rs, 0, 400, 10, []statusExtent{clean(100), dirty(50), clean(50), dirty(100), clean(100)}},
		{"starts inside a range", rs, 120, 100, 10, []statusExtent{dirty(30), clean(50), dirty(20)}},
		{"inside one range", rs, 210, 10, 10, []statusExtent{dirty(10)}},
		{"after every range", rs, 300, 50, 10, []statusExtent{clean(50)}},
		{"exactly a range", rs, 200, 100, 10, []statusExtent{dirty(100)}},
		{"limit 1", rs, 0, 400, 1, []statusExtent{clean(100)}},
		{"limit 1 in a range", rs, 110, 400, 1, []statusExtent{dirty(40)}},
		{"limit 2", rs, 0, 400, 2, []statusExtent{clean(100), dirty(50)}},
		{"adjacent ranges unmerged", []pool.ChangedRange{{Offset: 0, Length: 10}, {Offset: 10, Length: 10}}, 5, 10, 10,
			[]statusExtent{dirty(5), dirty(5)}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := bitmapExtents(tc.ranges, tc.off, tc.length, tc.limit); !slices.Equal(got, tc.want) {
				t.Errorf("got %v, want %v", got, tc.want)
			}
		})
	}
}
