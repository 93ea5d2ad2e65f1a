package nbd

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/quiverstorage/quiver/internal/pool"
)

// memExports serves in-memory disks that check how the server uses them:
// any access outside a disk, any change to a read-only disk, and any
// handle closed twice or left open is a violation. The server must never
// rely on the storage to catch a bad request: it validates first.
type memExports struct {
	// nonblocking makes handles pool.Nonblocking (nbHandle).
	nonblocking bool
	mu          sync.Mutex
	disks       map[string]*memDisk // by export name
	open        int                 // handles not yet closed
	violations  []string
}

var _ Exports = (*memExports)(nil)

// Sizes of the fuzzing exports: small, so that random offsets hit them, and
// the data disk of an odd size.
const (
	memRootSize = 1 << 20
	memDataSize = 64<<10 + 511
)

// memRootImage is what root and the snapshot hold at first: data between
// holes. The read-only snapshot shares it.
var memRootImage = func() []byte {
	b := make([]byte, memRootSize)
	copy(b[4096:], pattern(7, 4096, 8192))
	return b
}()

func newMemExports() *memExports {
	e := &memExports{disks: map[string]*memDisk{}}
	e.disks[exportRoot] = &memDisk{e: e, data: bytes.Clone(memRootImage)}
	e.disks[exportData] = &memDisk{e: e, data: make([]byte, memDataSize)}
	e.disks[exportSnap] = &memDisk{e: e, data: memRootImage, ro: true}
	return e
}

func (e *memExports) violate(format string, args ...any) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.violations = append(e.violations, fmt.Sprintf(format, args...))
}

func (e *memExports) List(ctx context.Context) ([]ExportInfo, error) {
	var out []ExportInfo
	for _, name := range slices.Sorted(func(yield func(string) bool) {
		for n := range e.disks {
			if !yield(n) {
				return
			}
		}
	}) {
		out = append(out, ExportInfo{Name: name, Description: "in-memory " + name})
	}
	return out, nil
}

func (e *memExports) Open(ctx context.Context, name, peer string) (Export, error) {
	if _, err := ParseExportName(name); err != nil {
		return Export{}, fmt.Errorf("%w: %v", pool.ErrInvalid, err)
	}
	d := e.disks[name]
	if d == nil {
		return Export{}, fmt.Errorf("export %q: %w", name, pool.ErrDiskNotFound)
	}
	e.mu.Lock()
	e.open++
	e.mu.Unlock()
	if e.nonblocking {
		return Export{Disk: &nbHandle{memHandle: memHandle{d: d}}, Description: "in-memory " + name}, nil
	}
	return Export{Disk: &memHandle{d: d}, Description: "in-memory " + name}, nil
}

// memDisk is one disk's bytes, with a log of every change.
type memDisk struct {
	e    *memExports
	ro   bool
	mu   sync.Mutex
	data []byte
	log  []diskOp
}

type diskOp struct {
	op   string // "write", "trim" or "zero"
	off  int64
	data []byte // write: what was written
	n    int64
}

func (d *memDisk) snapshot() []byte {
	d.mu.Lock()
	defer d.mu.Unlock()
	return bytes.Clone(d.data)
}

// memHandle is one open handle on a memDisk.
type memHandle struct {
	d      *memDisk
	closed atomic.Bool
}

var _ pool.Disk = (*memHandle)(nil)

func (h *memHandle) check(op string, off, n int64, mutates bool) error {
	if h.closed.Load() {
		h.d.e.violate("%s on a closed handle", op)
		return pool.ErrClosed
	}
	if off < 0 || n < 0 || off > int64(len(h.d.data)) || n > int64(len(h.d.data))-off {
		h.d.e.violate("%s [%d,+%d) outside a disk of %d bytes", op, off, n, len(h.d.data))
		return pool.ErrOutOfRange
	}
	if mutates && h.d.ro {
		h.d.e.violate("%s [%d,+%d) on a read-only disk", op, off, n)
		return pool.ErrReadOnly
	}
	return nil
}

func (h *memHandle) Size() int64    { return int64(len(h.d.data)) }
func (h *memHandle) ReadOnly() bool { return h.d.ro }

func (h *memHandle) ReadAt(p []byte, off int64) error {
	if err := h.check("read", off, int64(len(p)), false); err != nil {
		return err
	}
	h.d.mu.Lock()
	defer h.d.mu.Unlock()
	copy(p, h.d.data[off:])
	return nil
}

func (h *memHandle) WriteAt(p []byte, off int64, fua bool) error {
	if err := h.check("write", off, int64(len(p)), true); err != nil {
		return err
	}
	h.d.mu.Lock()
	defer h.d.mu.Unlock()
	copy(h.d.data[off:], p)
	h.d.log = append(h.d.log, diskOp{op: "write", off: off, data: bytes.Clone(p), n: int64(len(p))})
	return nil
}

func (h *memHandle) Flush() error {
	if h.closed.Load() {
		h.d.e.violate("flush on a closed handle")
	}
	return nil
}

func (h *memHandle) zero(op string, off, n int64) error {
	if err := h.check(op, off, n, true); err != nil {
		return err
	}
	h.d.mu.Lock()
	defer h.d.mu.Unlock()
	clear(h.d.data[off : off+n])
	h.d.log = append(h.d.log, diskOp{op: op, off: off, n: n})
	return nil
}

func (h *memHandle) Trim(off, n int64, fua bool) error { return h.zero("trim", off, n) }

func (h *memHandle) Zero(off, n int64, flags pool.ZeroFlags) error {
	return h.zero("zero", off, n)
}

func (h *memHandle) Cache(off, n int64) error { return h.check("cache", off, n, false) }

// Extents reports 4 KiB blocks that are all zeros as holes, as a sparse
// file that punches zeroed blocks would.
func (h *memHandle) Extents(off, n int64, limit int) ([]pool.Extent, error) {
	if err := h.check("extents", off, n, false); err != nil {
		return nil, err
	}
	h.d.mu.Lock()
	defer h.d.mu.Unlock()
	var out []pool.Extent
	for o, end := off, off+n; o < end; {
		blk := o &^ 4095
		next := min(blk+4096, end)
		blockEnd := min(blk+4096, int64(len(h.d.data)))
		hole := !slices.ContainsFunc(h.d.data[blk:blockEnd], func(b byte) bool { return b != 0 })
		if k := len(out) - 1; k >= 0 && out[k].Hole == hole {
			out[k].Length += next - o
		} else {
			out = append(out, pool.Extent{Offset: o, Length: next - o, Hole: hole})
		}
		o = next
	}
	return out, nil
}

// Capabilities: a memHandle offers none (nbHandle does).
func (h *memHandle) Capabilities() pool.Capabilities { return pool.Capabilities{} }

func (h *memHandle) Close() error {
	if h.closed.Swap(true) {
		h.d.e.violate("handle closed twice")
		return pool.ErrClosed
	}
	h.d.e.mu.Lock()
	h.d.e.open--
	h.d.e.mu.Unlock()
	return nil
}

// nbHandle is a memHandle that can try requests without waiting
// (pool.Nonblocking): every third try says ErrWouldBlock, so that a stream
// mixes requests run by the reader with requests handed on.
type nbHandle struct {
	memHandle
	tries atomic.Uint32
}

var _ pool.Nonblocking = (*nbHandle)(nil)

func (h *nbHandle) Capabilities() pool.Capabilities {
	return pool.Capabilities{Nonblocking: h, Batcher: h}
}

func (h *nbHandle) TryReadAt(p []byte, off int64) error {
	if h.tries.Add(1)%3 == 0 {
		return pool.ErrWouldBlock
	}
	return h.ReadAt(p, off)
}

func (h *nbHandle) TryWriteAt(p []byte, off int64) error {
	if h.tries.Add(1)%3 == 0 {
		return pool.ErrWouldBlock
	}
	return h.WriteAt(p, off, false)
}

// streamConn is a net.Conn whose reads come from a fixed client stream and
// then end with io.EOF, and whose writes are collected: a whole client
// session, replayed deterministically, that can neither stall nor be
// stalled.
type streamConn struct {
	r      *bytes.Reader
	mu     sync.Mutex
	out    bytes.Buffer
	limit  int // output kept; the rest is dropped (0: keep everything)
	closed atomic.Bool
}

func newStreamConn(in []byte, limit int) *streamConn {
	return &streamConn{r: bytes.NewReader(in), limit: limit}
}

func (s *streamConn) Read(b []byte) (int, error) {
	if s.closed.Load() {
		return 0, net.ErrClosed
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.r.Read(b)
}

func (s *streamConn) Write(b []byte) (int, error) {
	if s.closed.Load() {
		return 0, net.ErrClosed
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.limit > 0 && s.out.Len()+len(b) > s.limit {
		return len(b), nil
	}
	return s.out.Write(b)
}

func (s *streamConn) output() []byte {
	s.mu.Lock()
	defer s.mu.Unlock()
	return bytes.Clone(s.out.Bytes())
}

func (s *streamConn) Close() error                     { s.closed.Store(true); return nil }
func (s *streamConn) LocalAddr() net.Addr              { return streamAddr{} }
func (s *streamConn) RemoteAddr() net.Addr             { return streamAddr{} }
func (s *streamConn) SetDeadline(time.Time) error      { return nil }
func (s *streamConn) SetReadDeadline(time.Time) error  { return nil }
func (s *streamConn) SetWriteDeadline(time.Time) error { return nil }

type streamAddr struct{}

func (streamAddr) Network() string { return "stream" }
func (streamAddr) String() string  { return "stream" }

var _ pool.Batcher = (*nbHandle)(nil)

// TryBatch tries each IO as TryReadAt or TryWriteAt: every third would
// block, so that the reader's batches hand some of their requests on.
func (h *nbHandle) TryBatch(ios []pool.IO) {
	for i := range ios {
		if io := &ios[i]; io.Err == nil {
			if io.Write {
				io.Err = h.TryWriteAt(io.P, io.Off)
			} else {
				io.Err = h.TryReadAt(io.P, io.Off)
			}
		}
	}
}
