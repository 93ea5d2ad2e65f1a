package forward

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/quiverstorage/quiver/internal/nbd"
	"github.com/quiverstorage/quiver/internal/pool"
)

// store is the data of one disk, shared by the test's two "primaries" as
// the copies of a replicated volume are.
type store struct {
	mu   sync.Mutex
	data []byte
}

// failure is what a memDisk's writes fail with (nil: none).
type failure struct{ err error }

// memDisk is one server's handle on the store; fail, when set, is what its
// writes return instead of writing (a holdErr: after holding them).
type memDisk struct {
	s      *store
	fail   *atomic.Value // error
	writes *atomic.Int64
	held   *atomic.Int64 // writes held by a holdErr
}

func (d memDisk) Size() int64    { return int64(len(d.s.data)) }
func (d memDisk) ReadOnly() bool { return false }
func (d memDisk) ReadAt(p []byte, off int64) error {
	d.s.mu.Lock()
	defer d.s.mu.Unlock()
	copy(p, d.s.data[off:])
	return nil
}
func (d memDisk) WriteAt(p []byte, off int64, fua bool) error {
	if f, _ := d.fail.Load().(failure); f.err != nil {
		if h, ok := f.err.(holdErr); ok {
			d.held.Add(1)
			<-h.c
			return fmt.Errorf("%w: %w", nbd.ErrAbandon, h)
		}
		return f.err
	}
	d.writes.Add(1)
	d.s.mu.Lock()
	defer d.s.mu.Unlock()
	copy(d.s.data[off:], p)
	return nil
}
func (d memDisk) Flush() error                           { return nil }
func (d memDisk) Trim(off, length int64, fua bool) error { return d.Zero(off, length, 0) }
func (d memDisk) Cache(off, length int64) error          { return nil }
func (d memDisk) Close() error                           { return nil }
func (d memDisk) Capabilities() pool.Capabilities        { return pool.Capabilities{} }
func (d memDisk) Zero(off, length int64, _ pool.ZeroFlags) error {
	return d.WriteAt(make([]byte, length), off, false)
}
func (d memDisk) Extents(off, length int64, limit int) ([]pool.Extent, error) {
	return []pool.Extent{{Offset: off, Length: length}}, nil
}

type exports struct{ d memDisk }

func (e exports) List(context.Context) ([]nbd.ExportInfo, error) {
	return []nbd.ExportInfo{{Name: "vol/disk"}}, nil
}

func (e exports) Open(_ context.Context, name, _ string) (nbd.Export, error) {
	if strings.HasPrefix(name, "vol/disk/") {
		return nbd.Export{}, fmt.Errorf("no such export, or its token is wrong: %w", pool.ErrUnauthorized)
	}
	if name != "vol/disk" {
		return nbd.Export{}, fmt.Errorf("export %q: %w", name, pool.ErrVolumeNotFound)
	}
	return nbd.Export{Disk: e.d}, nil
}

// primary is one NBD server on loopback over the shared store.
type primary struct {
	addr   string
	srv    *nbd.Server
	fail   atomic.Value
	writes atomic.Int64
	held   atomic.Int64
}

func startPrimary(t *testing.T, s *store) *primary {
	t.Helper()
	p := &primary{}
	p.fail.Store(failure{})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p.addr = ln.Addr().String()
	p.srv = nbd.NewServer(exports{memDisk{s: s, fail: &p.fail, writes: &p.writes, held: &p.held}}, nbd.Config{})
	go func() { _ = p.srv.Serve(ln) }()
	t.Cleanup(func() { p.stop() })
	return p
}

func (p *primary) stop() {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	_ = p.srv.Shutdown(ctx)
}

// TestFollowsThePrimary: requests go to the primary the resolver names;
// when that one goes away (its server stops) or abandons a request (closes
// the connection unanswered, as a primary whose lease ran short does), the
// request is sent again to the next primary and the caller sees no error.
// An error the primary answers is passed on, mapped back to the domain's.
func TestFollowsThePrimary(t *testing.T) {
	s := &store{data: make([]byte, 1<<20)}
	a, b := startPrimary(t, s), startPrimary(t, s)
	var current atomic.Pointer[primary]
	current.Store(a)
	resolve := func(context.Context) (string, error) { return current.Load().addr, nil }
	d, err := Open(context.Background(), "vol/disk", resolve, Options{RequestTimeout: 5 * time.Second,
		RetryFor: 20 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	if d.Size() != 1<<20 {
		t.Fatalf("size %d", d.Size())
	}
	write := func(v byte, off int64) {
		t.Helper()
		if err := d.WriteAt(bytes.Repeat([]byte{v}, 4096), off, false); err != nil {
			t.Fatalf("write %#x at %d: %v", v, off, err)
		}
	}
	write(1, 0)
	if a.writes.Load() != 1 || b.writes.Load() != 0 {
		t.Fatalf("writes on a %d, b %d: want 1, 0", a.writes.Load(), b.writes.Load())
	}

	// a abandons every write: the connection closes unanswered; the
	// write is sent again to b.
	a.fail.Store(failure{fmt.Errorf("lease short: %w", nbd.ErrAbandon)})
	done := make(chan error, 1)
	go func() { done <- d.WriteAt(bytes.Repeat([]byte{2}, 4096), 4096, false) }()
	time.Sleep(200 * time.Millisecond) // the write is being retried at a
	current.Store(b)
	if err := <-done; err != nil {
		t.Fatalf("write through an abandoning primary: %v", err)
	}
	if b.writes.Load() != 1 {
		t.Fatalf("b got %d writes, want 1", b.writes.Load())
	}

	// b stops; a answers again.
	a.fail.Store(failure{})
	b.stop()
	current.Store(a)
	write(3, 8192)
	got := make([]byte, 3*4096)
	if err := d.ReadAt(got, 0); err != nil {
		t.Fatal(err)
	}
	for i, want := range []byte{1, 2, 3} {
		if !bytes.Equal(got[i*4096:(i+1)*4096], bytes.Repeat([]byte{want}, 4096)) {
			t.Fatalf("block %d does not hold %#x", i, want)
		}
	}
	if err := d.Flush(); err != nil {
		t.Fatal(err)
	}

	// An answered error is the caller's, with its domain sentinel.
	a.fail.Store(failure{fmt.Errorf("full: %w", pool.ErrNoSpace)})
	if err := d.WriteAt(make([]byte, 4096), 0, false); !errors.Is(err, pool.ErrNoSpace) {
		t.Fatalf("write on a full primary: %v, want ErrNoSpace", err)
	}
}

// TestGivesUp: with no primary answering, a request is abandoned after
// RetryFor: the client's connection is to close unanswered.
func TestGivesUp(t *testing.T) {
	s := &store{data: make([]byte, 1<<20)}
	a := startPrimary(t, s)
	addr := a.addr
	d, err := Open(context.Background(), "vol/disk", func(context.Context) (string, error) { return addr, nil },
		Options{RequestTimeout: time.Second, RetryFor: time.Second, DialTimeout: 200 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	a.stop()
	if err := d.WriteAt(make([]byte, 512), 0, false); !errors.Is(err, nbd.ErrAbandon) {
		t.Fatalf("write with no primary: %v, want ErrAbandon", err)
	}
}

// TestResolverThatHangs: a look-up of the primary that never answers (an
// etcd without a leader, an API that hangs) is bounded like a request, so
// that the request is tried again and, with no primary, abandoned after
// RetryFor instead of waiting forever.
func TestResolverThatHangs(t *testing.T) {
	s := &store{data: make([]byte, 1<<20)}
	a := startPrimary(t, s)
	var hang atomic.Bool
	resolve := func(ctx context.Context) (string, error) {
		if hang.Load() {
			<-ctx.Done() // answers only when given up on
			return "", ctx.Err()
		}
		return a.addr, nil
	}
	d, err := Open(context.Background(), "vol/disk", resolve,
		Options{RequestTimeout: 200 * time.Millisecond, RetryFor: time.Second, DialTimeout: 200 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	hang.Store(true)
	a.stop()
	done := make(chan error, 1)
	go func() { done <- d.WriteAt(make([]byte, 512), 0, false) }()
	select {
	case err := <-done:
		if !errors.Is(err, nbd.ErrAbandon) {
			t.Fatalf("write with a hanging look-up: %v, want ErrAbandon", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("a write whose look-up hangs was still waiting after 10 s (RetryFor is 1 s)")
	}
}
