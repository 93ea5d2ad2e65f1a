package nbd

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"

	"github.com/quiverstorage/quiver/internal/pool"
)

// Metadata contexts ("Metadata querying"). quiver offers two kinds:
//
//	base:allocation            data and holes (the specification's)
//	qemu:dirty-bitmap:<snap>   what changed since snapshot <snap>, as QEMU
//	                           defines it (docs/interop/nbd.rst in QEMU):
//	                           flag bit 0, NBD_STATE_DIRTY, set on the
//	                           extents that changed, clear elsewhere
//
// A dirty bitmap is offered on an export whose disk handle reports its
// changes (pool.Capabilities.Changes): for a snapshot's disk, <snap> names
// any other snapshot of the volume that is a checkpoint, and the bitmap is
// what changed between the two; for a live disk, what changed since <snap>
// up to the moment the context was selected (the delta is computed once,
// at NBD_OPT_SET_META_CONTEXT, and every BLOCK_STATUS of the connection
// answers from it; a later write is in it only if it came before).
//
// Queries: base:allocation and qemu:dirty-bitmap:<snap> select and list
// themselves; for NBD_OPT_LIST_META_CONTEXT, base: lists base:allocation,
// qemu: and qemu:dirty-bitmap: every bitmap, and no query lists every
// context. A query that names nothing offered (an unknown snapshot, one
// taken before change tracking, a name longer than a string may be) is
// ignored, as the specification wants of a query it cannot answer.

const (
	metaContextDirtyBitmap = "qemu:dirty-bitmap:" // followed by a snapshot's name
	metaNamespaceQEMU      = "qemu:"
	stateDirty             = 1 << 0 // qemu:dirty-bitmap: flag
	// maxBitmaps is how many dirty bitmaps one NBD_OPT_SET_META_CONTEXT
	// may select (NBD_REP_ERR_TOO_BIG beyond): each is a delta held for
	// the connection's life.
	maxBitmaps = 16
)

// dirtyBitmap is a selected qemu:dirty-bitmap: context.
type dirtyBitmap struct {
	id     uint32
	name   string              // the context's name
	ranges []pool.ChangedRange // the dirty ranges, sorted and merged
}

// metaContext handles NBD_OPT_LIST_META_CONTEXT and
// NBD_OPT_SET_META_CONTEXT.
func (n *negotiation) metaContext(ctx context.Context, opt uint32, data []byte) error {
	set := opt == optSetMetaContext
	if set && !n.structured {
		return n.replyError(opt, repErrInvalid, "negotiate structured replies first")
	}
	if set { // SET replaces the selection, even when it fails
		n.baseAlloc, n.bitmaps, n.metaExport = false, nil, ""
	}
	m, err := parseMetaQueries(data)
	if err != nil {
		return n.replyError(opt, repErrInvalid, err.Error())
	}
	export := m.export
	base, allBitmaps := !set && m.sent == 0, !set && m.sent == 0
	var want []string // snapshots named by qemu:dirty-bitmap:<snap>
	for _, q := range m.queries {
		switch {
		case q == metaContextBaseAllocation || (!set && q == "base:"):
			base = true
		case !set && (q == metaNamespaceQEMU || q == metaContextDirtyBitmap):
			allBitmaps = true
		case strings.HasPrefix(q, metaContextDirtyBitmap) && len(q) > len(metaContextDirtyBitmap):
			if leaf := q[len(metaContextDirtyBitmap):]; !slices.Contains(want, leaf) {
				want = append(want, leaf)
			}
		}
	}
	var bitmaps []dirtyBitmap
	if allBitmaps || len(want) > 0 {
		var tooMany bool
		if bitmaps, tooMany = n.findBitmaps(ctx, export, want, allBitmaps, set); tooMany {
			return n.replyError(opt, repErrTooBig, fmt.Sprintf("at most %d dirty bitmaps may be selected at once", maxBitmaps))
		}
	}
	if set {
		n.baseAlloc, n.bitmaps, n.metaExport = base, bitmaps, export
	}
	reply := func(id uint32, name string) error {
		b := make([]byte, 4+len(name))
		if set { // LIST replies carry id 0 (SHOULD)
			binary.BigEndian.PutUint32(b, id)
		}
		copy(b[4:], name)
		return n.reply(opt, repMetaContext, b)
	}
	if base {
		if err := reply(baseAllocationID, metaContextBaseAllocation); err != nil {
			return err
		}
	}
	for _, b := range bitmaps {
		if err := reply(b.id, b.name); err != nil {
			return err
		}
	}
	return n.reply(opt, repAck, nil)
}

// findBitmaps returns the dirty bitmaps of export among want (every one
// when all): for LIST their names, for SET (compute) their deltas too, or
// tooMany when a SET would select more than maxBitmaps. The export is
// opened the way NBD_OPT_GO opens it, and closed again. An export that does
// not open, or offers no change report, has none; a snapshot whose delta
// fails is left out.
func (n *negotiation) findBitmaps(ctx context.Context, export string, want []string, all, compute bool) (bitmaps []dirtyBitmap, tooMany bool) {
	c := n.c
	if err := c.open(ctx, export); err != nil {
		c.log.Debug("no dirty bitmaps: the export does not open", "err", err)
		return nil, false
	}
	defer c.closeDisk()
	cr := c.caps.Changes
	if cr == nil {
		return nil, false
	}
	var names []string
	for _, s := range cr.Checkpoints() {
		if all || slices.Contains(want, s) {
			names = append(names, s)
		}
	}
	if !compute {
		out := make([]dirtyBitmap, len(names))
		for i, s := range names {
			out[i] = dirtyBitmap{name: metaContextDirtyBitmap + s}
		}
		return out, false
	}
	if len(names) > maxBitmaps {
		return nil, true
	}
	var out []dirtyBitmap
	for _, s := range names {
		ranges, err := cr.ChangesSince(ctx, s)
		if err != nil {
			c.log.Info("dirty bitmap not offered: its changes cannot be read", "export", c.export, "since", s, "err", err)
			continue
		}
		out = append(out, dirtyBitmap{id: baseAllocationID + 1 + uint32(len(out)), name: metaContextDirtyBitmap + s, ranges: ranges})
	}
	return out, false
}

// bitmapsFor returns the dirty bitmaps selected for export: none when the
// last NBD_OPT_SET_META_CONTEXT named another (a client then must not ask
// for block status; the bitmaps of that other export would be wrong here).
func (n *negotiation) bitmapsFor(export string) []dirtyBitmap {
	if export != n.metaExport {
		return nil
	}
	return n.bitmaps
}

// metaRequest is the data of NBD_OPT_LIST_META_CONTEXT and
// NBD_OPT_SET_META_CONTEXT.
type metaRequest struct {
	export  string
	queries []string // each at most maxStringLength bytes
	sent    int      // queries sent, counting those skipped as too long
}

// parseMetaQueries decodes: export name (u32 length + bytes), query count
// (u32), then each query (u32 length + bytes). A query longer than a
// string may be (maxStringLength) is skipped: it names no context.
func parseMetaQueries(data []byte) (metaRequest, error) {
	str := func(limit uint32) (s string, ok bool, err error) {
		if len(data) < 4 {
			return "", false, errors.New("truncated meta context request")
		}
		l := binary.BigEndian.Uint32(data)
		if uint64(l) > uint64(len(data)-4) {
			return "", false, errors.New("string length beyond option data")
		}
		b := data[4 : 4+l]
		data = data[4+l:]
		if l > limit {
			return "", false, nil
		}
		return string(b), true, nil
	}
	var m metaRequest
	export, ok, err := str(maxStringLength)
	if err != nil {
		return m, err
	}
	if !ok {
		return m, errors.New("export name longer than a string may be")
	}
	if len(data) < 4 {
		return m, errors.New("truncated meta context request")
	}
	count := binary.BigEndian.Uint32(data)
	data = data[4:]
	if uint64(count)*4 > uint64(len(data)) {
		return m, errors.New("query count beyond option data")
	}
	queries := make([]string, 0, count)
	for range count {
		q, ok, err := str(maxStringLength)
		if err != nil {
			return m, err
		}
		if ok {
			queries = append(queries, q)
		}
	}
	if len(data) != 0 {
		return m, errors.New("trailing bytes after queries")
	}
	return metaRequest{export: export, queries: queries, sent: int(count)}, nil
}

// blockStatus runs NBD_CMD_BLOCK_STATUS: one NBD_REPLY_TYPE_BLOCK_STATUS
// chunk per selected context, base:allocation first. Every chunk covers
// at most the request's range (with NBD_CMD_FLAG_REQ_ONE, one extent);
// nothing is sent until every chunk is ready, so a failure is one error
// reply.
func (c *conn) blockStatus(req *request, r runner) {
	off, length := int64(req.off), int64(req.length)
	limit := maxExtents
	if req.flags&cmdFlagReqOne != 0 {
		limit = 1
	}
	var alloc []pool.Extent
	if c.baseAlloc {
		var err error
		if alloc, err = c.disk.Extents(off, length, limit); err != nil {
			c.answer(req, r, err)
			return
		}
		if len(alloc) > limit {
			alloc = alloc[:limit]
		}
	}
	dirty := make([][]statusExtent, len(c.bitmaps))
	size := 0
	if c.baseAlloc {
		size += 4 + 8*len(alloc)
	}
	for i, b := range c.bitmaps {
		dirty[i] = bitmapExtents(b.ranges, off, length, limit)
		size += 4 + 8*len(dirty[i])
	}
	req.buf = getBuf(size)
	p := *req.buf
	var chunks [][]byte
	if c.baseAlloc {
		ch := p[:4+8*len(alloc)]
		p = p[len(ch):]
		binary.BigEndian.PutUint32(ch, baseAllocationID)
		for i, e := range alloc {
			state := uint32(0)
			if e.Hole {
				state = stateHole | stateZero
			}
			binary.BigEndian.PutUint32(ch[4+8*i:], uint32(e.Length))
			binary.BigEndian.PutUint32(ch[8+8*i:], state)
		}
		chunks = append(chunks, ch)
	}
	for i, b := range c.bitmaps {
		ch := p[:4+8*len(dirty[i])]
		p = p[len(ch):]
		binary.BigEndian.PutUint32(ch, b.id)
		for j, e := range dirty[i] {
			binary.BigEndian.PutUint32(ch[4+8*j:], e.length)
			binary.BigEndian.PutUint32(ch[8+8*j:], e.flags)
		}
		chunks = append(chunks, ch)
	}
	c.flushOut(r.out)
	c.wmu.Lock()
	for i, ch := range chunks {
		flags := uint16(0)
		if i == len(chunks)-1 {
			flags = replyFlagDone
		}
		if c.writeChunk(req, flags, replyTypeBlockStatus, nil, ch) != nil {
			break
		}
	}
	c.wmu.Unlock()
	req.release()
}

// statusExtent is one block status descriptor.
type statusExtent struct {
	length, flags uint32
}

// bitmapExtents describes [off, off+length) as clean and dirty extents
// (stateDirty) by the dirty ranges, at most limit of them: the first
// limit, which then cover only the start of the range. length fits in 32
// bits, and so does every extent.
func bitmapExtents(ranges []pool.ChangedRange, off, length int64, limit int) []statusExtent {
	end := off + length
	var out []statusExtent
	add := func(to int64, flags uint32) {
		if to > off {
			out = append(out, statusExtent{uint32(to - off), flags})
			off = to
		}
	}
	// The first range that ends after off.
	i := sort.Search(len(ranges), func(i int) bool { return ranges[i].Offset+ranges[i].Length > off })
	for ; off < end && len(out) < limit; i++ {
		if i == len(ranges) {
			add(end, 0)
			break
		}
		r := ranges[i]
		add(min(r.Offset, end), 0)
		if len(out) == limit {
			break
		}
		add(min(r.Offset+r.Length, end), stateDirty)
	}
	return out
}
