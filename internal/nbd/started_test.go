package nbd

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/quiverstorage/quiver/internal/nbdclient"
	"github.com/quiverstorage/quiver/internal/pool"
)

// startExports serves memExports' disks through startHandles.
type startExports struct {
	*memExports
	// stopEarly: each batch's last end says more too (a run of ends
	// that stops early, as when a request is sent again elsewhere).
	stopEarly bool
	mu        sync.Mutex
	handles   []*startHandle
}

func (e *startExports) Open(ctx context.Context, name, peer string) (Export, error) {
	x, err := e.memExports.Open(ctx, name, peer)
	if err != nil {
		return x, err
	}
	h := &startHandle{memHandle: x.Disk.(*memHandle), stopEarly: e.stopEarly, ready: make(chan []startedIO, 1024)}
	go h.complete()
	e.mu.Lock()
	e.handles = append(e.handles, h)
	e.mu.Unlock()
	x.Disk = h
	return x, nil
}

// startHandle starts reads and writes (pool.Starter) as a disk served over
// the network does: a started request is held until Unplug, then run and
// ended by the handle's own goroutine, batch by batch in reverse order,
// every end but a batch's last with more. ReadAt and WriteAt count the
// requests that were not started.
type startHandle struct {
	*memHandle
	stopEarly bool
	mu        sync.Mutex
	held      []startedIO
	ready     chan []startedIO
	started   atomic.Int64
	ended     atomic.Int64
	direct    atomic.Int64
	// gate, when set, holds every batch until it is closed.
	gate atomic.Pointer[chan struct{}]
}

type startedIO struct {
	p     []byte
	off   int64
	write bool
	done  pool.Done
}

var _ pool.Starter = (*startHandle)(nil)

func (h *startHandle) Capabilities() pool.Capabilities { return pool.Capabilities{Starter: h} }

func (h *startHandle) StartRead(p []byte, off int64, done pool.Done) {
	h.hold(startedIO{p, off, false, done})
}
func (h *startHandle) StartWrite(p []byte, off int64, fua bool, done pool.Done) {
	h.hold(startedIO{p, off, true, done})
}

func (h *startHandle) hold(io startedIO) {
	h.started.Add(1)
	h.mu.Lock()
	h.held = append(h.held, io)
	h.mu.Unlock()
}

func (h *startHandle) Unplug() {
	h.mu.Lock()
	b := h.held
	h.held = nil
	h.mu.Unlock()
	if len(b) > 0 {
		h.ready <- b
	}
}

func (h *startHandle) complete() {
	for b := range h.ready {
		if g := h.gate.Load(); g != nil {
			<-*g
		}
		for i := len(b) - 1; i >= 0; i-- {
			io := b[i]
			var err error
			if io.write {
				err = h.memHandle.WriteAt(io.p, io.off, false)
			} else {
				err = h.memHandle.ReadAt(io.p, io.off)
			}
			h.ended.Add(1)
			io.done(err, i > 0 || h.stopEarly)
		}
	}
}

func (h *startHandle) ReadAt(p []byte, off int64) error {
	h.direct.Add(1)
	return h.memHandle.ReadAt(p, off)
}

func (h *startHandle) WriteAt(p []byte, off int64, fua bool) error {
	h.direct.Add(1)
	return h.memHandle.WriteAt(p, off, fua)
}

// Close: a handle is closed only once every request started on it ended.
func (h *startHandle) Close() error {
	if s, e := h.started.Load(), h.ended.Load(); s != e {
		h.d.e.violate("handle closed with %d requests started and %d ended", s, e)
	}
	close(h.ready)
	return h.memHandle.Close()
}

// TestStartedRequests: on a disk that starts requests (pool.Starter), the
// server starts every valid READ and WRITE from its reader and answers
// each when it ends, many in flight at once and ending in any order: the
// data read is the data written, nothing is run the ordinary way, held
// requests are sent (Unplug) before the reader waits, a run of ends that
// stops early still gets its replies out (within replyHold), and the
// connection closes its disk only once every started request ended. With
// one worker nothing is started: replies keep the order of requests.
func TestStartedRequests(t *testing.T) {
	for _, tc := range []struct {
		name      string
		workers   int
		stopEarly bool
	}{
		{"workers", 4, false},
		{"workers, runs stop early", 4, true},
		{"one worker", 1, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := &startExports{memExports: newMemExports(), stopEarly: tc.stopEarly}
			srv := NewServer(e, Config{Workers: tc.workers, Logger: discardLogger()})
			sock := filepath.Join(t.TempDir(), "nbd.sock")
			ln, err := net.Listen("unix", sock)
			if err != nil {
				t.Fatal(err)
			}
			go func() { _ = srv.Serve(ln) }()
			defer func() {
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				defer cancel()
				_ = srv.Shutdown(ctx)
			}()
			dial := func(ctx context.Context, _, _ string) (net.Conn, error) {
				var d net.Dialer
				return d.DialContext(ctx, "unix", sock)
			}
			c, err := nbdclient.Dial(context.Background(), "", exportRoot, nbdclient.Options{Dial: dial, Timeout: 10 * time.Second})
			if err != nil {
				t.Fatal(err)
			}
			const n, size = 48, 4096 // fewer than a batch of replies (batchMaxReplies) holds
			var wg sync.WaitGroup
			errs := make(chan error, 2*n)
			for i := range n {
				wg.Go(func() {
					if err := c.WriteAt(pattern(byte(i), int64(i)*size, size), int64(i)*size, i%8 == 0); err != nil {
						errs <- fmt.Errorf("write %d: %w", i, err)
					}
				})
			}
			wg.Wait()
			if err := c.Flush(); err != nil {
				t.Fatal(err)
			}
			for i := range n {
				wg.Go(func() {
					got := make([]byte, size)
					if err := c.ReadAt(got, int64(i)*size); err != nil {
						errs <- fmt.Errorf("read %d: %w", i, err)
					} else if !bytes.Equal(got, pattern(byte(i), int64(i)*size, size)) {
						errs <- fmt.Errorf("read %d: not the data written", i)
					}
				})
			}
			wg.Wait()
			// A request beyond the disk is refused by the reader, never
			// started.
			if err := c.WriteAt(make([]byte, size), memRootSize, false); !errors.Is(err, nbdclient.Errno(errNoSpc)) {
				t.Errorf("write beyond the end: %v, want ENOSPC", err)
			}
			// Writes still in flight when the client leaves: the disk is
			// closed only after they ended (startHandle.Close), however
			// long that takes.
			e.mu.Lock()
			h := e.handles[0]
			e.mu.Unlock()
			gate := make(chan struct{})
			h.gate.Store(&gate)
			for i := range n {
				c.StartWrite(pattern(byte(i+1), int64(i)*size, size), int64(i)*size, false, func(error, bool) {})
			}
			c.Close()
			time.Sleep(100 * time.Millisecond) // time enough to close the disk too early
			close(gate)
			close(errs)
			for err := range errs {
				t.Error(err)
			}
			deadline := time.Now().Add(10 * time.Second)
			for srv.Conns() != 0 && time.Now().Before(deadline) {
				time.Sleep(5 * time.Millisecond)
			}
			checkExports(t, e.memExports)
			started, direct := h.started.Load(), h.direct.Load()
			if tc.workers == 1 {
				if started != 0 {
					t.Errorf("one worker: %d requests started, want none (replies in order)", started)
				}
				return
			}
			if direct != 0 || started < 2*n {
				t.Errorf("%d READs and WRITEs started, %d run the ordinary way: want at least %d started and none run", started, direct, 2*n)
			}
		})
	}
}
