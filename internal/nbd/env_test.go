package nbd

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"io"
	"log/slog"
	"net"
	"testing"
	"time"

	"github.com/quiverstorage/quiver/internal/pool"
)

// The test volume: two disks, and a snapshot taken after seeding root.
const (
	testVolume   = "vm"
	testSnapshot = "snap"
	rootSize     = 2 << 20
	dataSize     = 1 << 20

	exportRoot = "vm/root"      // read-write
	exportData = "vm/data"      // read-write
	exportSnap = "vm@snap/root" // read-only
)

// testEnv is an in-process server over a real pool, with a model of what
// every disk must contain: each legitimate write updates the model, and
// checkDisks compares the model with the disks byte for byte.
type testEnv struct {
	t     testing.TB
	srv   *Server
	addr  string
	pool  *pool.Pool
	vol   *pool.Volume
	model map[string][]byte // disk name -> expected content
	done  chan error        // Serve's result
}

func discardLogger() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// pattern returns n bytes, none zero, that depend on seed and on their
// offset, so that data at a wrong offset never compares equal.
func pattern(seed byte, off int64, n int) []byte {
	start := off &^ 7
	buf := make([]byte, int(off-start)+n+8)
	for o := start; o < off+int64(n); o += 8 {
		v := uint64(o)*0x9e3779b97f4a7c15 ^ uint64(seed)*0x0101010101010101
		binary.LittleEndian.PutUint64(buf[o-start:], v|0x0101010101010101)
	}
	return buf[off-start : off-start+int64(n) : off-start+int64(n)]
}

// newEnv serves a fresh pool; wrap, if not nil, wraps the exports (to
// inject behaviour into the disks).
func newEnv(t testing.TB, cfg Config, wrap func(Exports) Exports) *testEnv {
	t.Helper()
	return newEnvWith(t, cfg, wrap, pool.Options{})
}

// newEnvWith is newEnv over a pool opened with popts.
func newEnvWith(t testing.TB, cfg Config, wrap func(Exports) Exports, popts pool.Options) *testEnv {
	t.Helper()
	ctx := context.Background()
	if popts.Logger == nil {
		popts.Logger = discardLogger()
	}
	p, err := pool.OpenWith(ctx, t.TempDir(), popts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close() })
	if _, _, err := p.Create(ctx, pool.VolumeSpec{Name: testVolume, Capacity: 64 << 20,
		Disks: []pool.DiskSpec{{Name: "root", Size: rootSize}, {Name: "data", Size: dataSize}}}); err != nil {
		t.Fatal(err)
	}
	v, err := p.Volume(testVolume)
	if err != nil {
		t.Fatal(err)
	}
	e := &testEnv{t: t, pool: p, vol: v, model: map[string][]byte{
		"root": make([]byte, rootSize), "data": make([]byte, dataSize)}}
	// Seed root with data at 0 and at 1 MiB, holes elsewhere, then snapshot.
	e.poolWrite("root", 0, pattern(1, 0, 64<<10))
	e.poolWrite("root", 1<<20, pattern(2, 1<<20, 4096))
	if _, _, err := v.CreateSnapshot(ctx, testSnapshot, nil); err != nil {
		t.Fatal(err)
	}
	e.model["snap"] = bytes.Clone(e.model["root"])

	if cfg.Logger == nil {
		cfg.Logger = discardLogger()
	}
	var exports Exports = PoolExports{Pool: p}
	if wrap != nil {
		exports = wrap(exports)
	}
	e.srv = NewServer(exports, cfg)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	e.addr = ln.Addr().String()
	e.done = make(chan error, 1)
	go func() { e.done <- e.srv.Serve(ln) }()
	t.Cleanup(func() {
		sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := e.srv.Shutdown(sctx); err != nil {
			t.Errorf("shutdown: %v", err)
		}
		if err := <-e.done; !errors.Is(err, ErrServerClosed) {
			t.Errorf("Serve: %v, want ErrServerClosed", err)
		}
	})
	return e
}

// poolWrite writes through the pool (not NBD) and updates the model.
func (e *testEnv) poolWrite(disk string, off int64, b []byte) {
	e.t.Helper()
	d, err := e.vol.OpenDisk(disk)
	if err != nil {
		e.t.Fatal(err)
	}
	defer d.Close()
	if err := d.WriteAt(b, off, false); err != nil {
		e.t.Fatal(err)
	}
	copy(e.model[disk][off:], b)
}

// wrote records a write that the server acknowledged.
func (e *testEnv) wrote(disk string, off uint64, b []byte) { copy(e.model[disk][off:], b) }

// zeroed records an acknowledged TRIM or WRITE_ZEROES.
func (e *testEnv) zeroed(disk string, off uint64, n uint32) {
	clear(e.model[disk][off : off+uint64(n)])
}

// content reads a whole disk (or the snapshot's root) through the pool.
func (e *testEnv) content(disk string) []byte {
	e.t.Helper()
	var d pool.Disk
	var err error
	if disk == "snap" {
		d, err = e.vol.OpenSnapshotDisk(testSnapshot, "root")
	} else {
		d, err = e.vol.OpenDisk(disk)
	}
	if err != nil {
		e.t.Fatal(err)
	}
	defer d.Close()
	if d.Size() != int64(len(e.model[disk])) {
		e.t.Fatalf("disk %s: size %d, want %d", disk, d.Size(), len(e.model[disk]))
	}
	b := make([]byte, d.Size())
	if err := d.ReadAt(b, 0); err != nil {
		e.t.Fatal(err)
	}
	return b
}

// checkDisks fails unless every disk holds exactly what the model says:
// no write landed at a wrong offset, and no refused write landed at all.
func (e *testEnv) checkDisks() {
	e.t.Helper()
	for _, disk := range []string{"root", "data", "snap"} {
		e.checkDisk(e.t, disk, "")
	}
}

func (e *testEnv) checkDisk(t testing.TB, disk, after string) {
	t.Helper()
	got, want := e.content(disk), e.model[disk]
	if i := firstDiff(got, want); i >= 0 {
		t.Errorf("%sdisk %s differs from the model at offset %d: got %#x, want %#x", after, disk, i, got[i], want[i])
	}
}

func firstDiff(a, b []byte) int {
	if bytes.Equal(a, b) {
		return -1
	}
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			return i
		}
	}
	return min(len(a), len(b))
}

// waitIdle waits until the server has no connection left, so that a test
// looks at the disks only after the server is done with them.
func (e *testEnv) waitIdle() {
	e.t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for e.srv.Conns() > 0 {
		if time.Now().After(deadline) {
			e.t.Fatalf("%d connections still open after 10 s", e.srv.Conns())
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// connect dials and negotiates; the connection is closed when t ends.
func (e *testEnv) connect(t testing.TB, o hsOpts) *testClient {
	t.Helper()
	c := dial(t, e.addr)
	c.handshake(o)
	return c
}

// gateExports wraps exports so that WriteAt on any disk announces itself on
// entered and then waits for release to be closed.
type gateExports struct {
	Exports
	entered chan struct{}
	release chan struct{}
}

type gateDisk struct {
	pool.Disk
	g *gateExports
}

func (g *gateExports) Open(ctx context.Context, name, peer string) (Export, error) {
	x, err := g.Exports.Open(ctx, name, peer)
	if err != nil {
		return Export{}, err
	}
	x.Disk = gateDisk{Disk: x.Disk, g: g}
	return x, nil
}

func (d gateDisk) WriteAt(p []byte, off int64, fua bool) error {
	d.g.entered <- struct{}{}
	<-d.g.release
	return d.Disk.WriteAt(p, off, fua)
}

// A gateDisk tries nothing without waiting (pool.Nonblocking, always
// ErrWouldBlock), as a file on ext4: small WRITEs go to the write executor,
// where the gate holds them.
func (gateDisk) TryReadAt([]byte, int64) error     { return pool.ErrWouldBlock }
func (gateDisk) TryWriteAt([]byte, int64) error    { return pool.ErrWouldBlock }
func (d gateDisk) Capabilities() pool.Capabilities { return pool.Capabilities{Nonblocking: d} }

var (
	_ Exports          = (*gateExports)(nil)
	_ pool.Nonblocking = gateDisk{}
)
