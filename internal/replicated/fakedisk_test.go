package replicated

import (
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/quiverstorage/quiver/internal/cluster"
	"github.com/quiverstorage/quiver/internal/pool"
)

// memDisk is an in-memory disk handle that records the requests reaching
// it, and offers every optional capability (pool.Capabilities), as the
// pool's live disk does: a wrapper must not let a request reach it by one
// of them unless the wrapper declares it.
type memDisk struct {
	mu     sync.Mutex
	data   []byte
	calls  []string
	closed bool
}

var (
	_ pool.Disk        = (*memDisk)(nil)
	_ pool.Nonblocking = (*memDisk)(nil)
	_ pool.Batcher     = (*memDisk)(nil)
	_ pool.Sender      = (*memDisk)(nil)
	_ pool.DataReader  = (*memDisk)(nil)
)

func newMemDisk(size int) *memDisk { return &memDisk{data: make([]byte, size)} }

func (d *memDisk) record(op string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.calls = append(d.calls, op)
}

// seen returns the requests that reached the disk, and forgets them.
func (d *memDisk) seen() []string {
	d.mu.Lock()
	defer d.mu.Unlock()
	c := slices.Clone(d.calls)
	d.calls = nil
	return c
}

func (d *memDisk) Size() int64    { return int64(len(d.data)) }
func (d *memDisk) ReadOnly() bool { return false }
func (d *memDisk) ReadAt(p []byte, off int64) error {
	d.record("read")
	d.mu.Lock()
	defer d.mu.Unlock()
	copy(p, d.data[off:])
	return nil
}
func (d *memDisk) WriteAt(p []byte, off int64, fua bool) error {
	d.record("write")
	d.mu.Lock()
	defer d.mu.Unlock()
	copy(d.data[off:], p)
	return nil
}
func (d *memDisk) Flush() error                                   { d.record("flush"); return nil }
func (d *memDisk) Trim(off, length int64, fua bool) error         { d.record("trim"); return nil }
func (d *memDisk) Zero(off, length int64, _ pool.ZeroFlags) error { d.record("zero"); return nil }
func (d *memDisk) Cache(off, length int64) error                  { d.record("cache"); return nil }
func (d *memDisk) Extents(off, length int64, _ int) ([]pool.Extent, error) {
	d.record("extents")
	return []pool.Extent{{Offset: off, Length: length, Hole: true}}, nil
}
func (d *memDisk) Close() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.closed = true
	return nil
}

func (d *memDisk) TryReadAt(p []byte, off int64) error  { d.record("try read"); return nil }
func (d *memDisk) TryWriteAt(p []byte, off int64) error { d.record("try write"); return nil }
func (d *memDisk) TryBatch(ios []pool.IO)               { d.record("batch") }
func (d *memDisk) TrySendTo(sock int, head []byte, off int64, n int) (int, error) {
	d.record("send")
	return len(head) + n, nil
}
func (d *memDisk) ReadData(p []byte, off int64, ext []pool.Extent) error {
	d.record("read data")
	return nil
}

func (d *memDisk) Capabilities() pool.Capabilities {
	return pool.Capabilities{Nonblocking: d, Batcher: d, Sender: d, DataReader: d}
}

// fakeLease is a node whose lease is held while held is set (leaseHolder).
type fakeLease struct{ held atomic.Bool }

func (l *fakeLease) Holds(cluster.Primacy) bool { return l.held.Load() }

// LeaseTTL is short: a request waits this long for a renewal before it is
// abandoned.
func (l *fakeLease) LeaseTTL() time.Duration { return 30 * time.Millisecond }
func (l *fakeLease) Logger() *slog.Logger    { return quietLogger() }
