package nbd

import (
	"bytes"
	"context"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/quiverstorage/quiver/internal/pool"
)

// sharedStarts serves memExports' disks through handles whose started
// requests all end on one goroutine: the shape of handles whose
// connections share one upstream connection, and so its reply reader.
type sharedStarts struct {
	*memExports
	ready    chan []sharedIO
	returned atomic.Int64 // ends whose pool.Done returned
}

func (e *sharedStarts) Open(ctx context.Context, name, peer string) (Export, error) {
	x, err := e.memExports.Open(ctx, name, peer)
	if err != nil {
		return x, err
	}
	x.Disk = &sharedHandle{memHandle: x.Disk.(*memHandle), s: e}
	return x, nil
}

// complete is the one reply reader: it runs each batch and ends its
// requests in order, every end but a batch's last with more.
func (e *sharedStarts) complete() {
	for b := range e.ready {
		for i, io := range b {
			var err error
			if io.write {
				err = io.h.memHandle.WriteAt(io.p, io.off, false)
			} else {
				err = io.h.memHandle.ReadAt(io.p, io.off)
			}
			io.done(err, i < len(b)-1)
			e.returned.Add(1)
		}
	}
}

type sharedHandle struct {
	*memHandle
	s    *sharedStarts
	mu   sync.Mutex
	held []sharedIO
}

// sharedIO is a started request and its handle.
type sharedIO struct {
	startedIO
	h *sharedHandle
}

var _ pool.Starter = (*sharedHandle)(nil)

func (h *sharedHandle) Capabilities() pool.Capabilities { return pool.Capabilities{Starter: h} }

func (h *sharedHandle) StartRead(p []byte, off int64, done pool.Done) {
	h.hold(sharedIO{startedIO{p: p, off: off, done: done}, h})
}

func (h *sharedHandle) StartWrite(p []byte, off int64, fua bool, done pool.Done) {
	h.hold(sharedIO{startedIO{p: p, off: off, write: true, done: done}, h})
}

func (h *sharedHandle) hold(io sharedIO) {
	h.mu.Lock()
	h.held = append(h.held, io)
	h.mu.Unlock()
}

func (h *sharedHandle) Unplug() {
	h.mu.Lock()
	b := h.held
	h.held = nil
	h.mu.Unlock()
	if len(b) > 0 {
		h.s.ready <- b
	}
}

// TestEndsNeverWaitForTheClient: the goroutine that ends started requests
// (pool.Done, a disk's reply reader) never waits for a client to take its
// replies. Client A sends READs worth far more than the socket's buffers
// in one burst and reads nothing; client B's requests end on the same goroutine (one
// upstream shared by both) and are served meanwhile; every Done returns,
// A's included, with the send timeout an hour away. Then A reads its
// replies: each whole and in place, READs with their reply header in
// front of the data (at most inlineMax, many to a batch) and apart from it
// (larger), with simple and structured replies.
func TestEndsNeverWaitForTheClient(t *testing.T) {
	const bigDisk = 4 << 20
	image := pattern(3, 0, bigDisk)
	for _, structured := range []bool{false, true} {
		name := "simple replies"
		if structured {
			name = "structured replies"
		}
		t.Run(name, func(t *testing.T) {
			e := &sharedStarts{memExports: newMemExports(), ready: make(chan []sharedIO, 1024)}
			e.disks[exportRoot] = &memDisk{e: e.memExports, data: bytes.Clone(image)}
			go e.complete()
			srv := NewServer(e, Config{Workers: 4, SendTimeout: time.Hour, Logger: discardLogger()})
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			go func() { _ = srv.Serve(ln) }()
			defer func() {
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				defer cancel()
				_ = srv.Shutdown(ctx)
				close(e.ready)
			}()

			a := dial(t, ln.Addr().String())
			_ = a.nc.(*net.TCPConn).SetReadBuffer(64 << 10) // the server's buffer fills sooner
			a.handshake(hsOpts{export: exportRoot, structured: structured})
			// In one write: 256 READs of 32 KiB (header in front of the
			// data, many replies to a batch), then 8 of 3 MiB (header
			// apart from the data); 32 MiB, within MaxConnBytes.
			var reads []testReq
			cookies := map[uint64]testReq{}
			var burst []byte
			for i := range 256 + 8 {
				r := testReq{typ: cmdRead, off: uint64(i%97) * 32 << 10, length: 32 << 10, cookie: uint64(i + 1)}
				if i >= 256 {
					r.off, r.length = uint64(i%2)<<20, 3<<20
				}
				a.expect(r)
				burst = append(burst, reqBytes(r)...)
				reads = append(reads, r)
				cookies[r.cookie] = r
			}
			a.mustWrite(burst)

			b := dial(t, ln.Addr().String())
			b.handshake(hsOpts{export: exportData, structured: structured})
			for i := range 16 {
				p := pattern(byte(i), int64(i)*512, 512)
				if rep := b.do(testReq{typ: cmdWrite, off: uint64(i) * 512, length: 512, payload: p}); rep.errno != 0 {
					t.Fatalf("client B's write %d while A reads nothing: errno %d", i, rep.errno)
				}
				if rep := b.do(testReq{typ: cmdRead, off: uint64(i) * 512, length: 512}); rep.errno != 0 || !bytes.Equal(rep.data, p) {
					t.Fatalf("client B's read %d while A reads nothing: errno %d, data as written %v", i, rep.errno, bytes.Equal(rep.data, p))
				}
			}
			// Every end of A's returned too (the 30 s bound only checks
			// liveness: without the bound on the reply path the reply
			// reader waits for A, here an hour).
			want := int64(len(reads) + 32)
			for deadline := time.Now().Add(30 * time.Second); e.returned.Load() < want; {
				if time.Now().After(deadline) {
					t.Fatalf("%d of %d ends returned while client A reads nothing", e.returned.Load(), want)
				}
				time.Sleep(5 * time.Millisecond)
			}

			a.timeout = 30 * time.Second
			for range reads {
				rep, err := a.readReply()
				if err != nil {
					t.Fatalf("client A's replies: %v", err)
				}
				r := cookies[rep.cookie]
				if rep.errno != 0 || !bytes.Equal(rep.data, image[r.off:r.off+uint64(r.length)]) {
					t.Errorf("client A's read of %d bytes at %d: errno %d, data as on disk %v", r.length, r.off, rep.errno,
						bytes.Equal(rep.data, image[r.off:r.off+uint64(r.length)]))
				}
			}
		})
	}
}

// TestEndsHeldAtTheEnd: requests started and still held for more ends
// when the connection ends (a client that sends NBD_CMD_DISC right behind
// its WRITEs; a run of ends that stops early) are answered before the
// connection closes, as the protocol asks of requests received before
// the disconnect.
func TestEndsHeldAtTheEnd(t *testing.T) {
	e := &startExports{memExports: newMemExports(), stopEarly: true}
	srv := NewServer(e, Config{Workers: 4, Logger: discardLogger()})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = srv.Serve(ln) }()
	defer func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = srv.Shutdown(ctx)
	}()
	c := dial(t, ln.Addr().String())
	c.handshake(hsOpts{export: exportRoot})
	// In one write, so that the reader reaches the disconnect before any
	// write is sent to the disk (it unplugs only when nothing is buffered).
	const n = 4
	var burst []byte
	for i := range n {
		r := testReq{typ: cmdWrite, off: uint64(i) * 4096, length: 4096, payload: pattern(byte(i), int64(i)*4096, 4096), cookie: uint64(i + 1)}
		c.expect(r)
		burst = append(burst, reqBytes(r)...)
	}
	burst = append(burst, reqBytes(testReq{typ: cmdDisc})...)
	c.mustWrite(burst)
	for i := range n {
		rep, err := c.readReply()
		if err != nil {
			t.Fatalf("reply %d of %d to the writes before the disconnect: %v", i+1, n, err)
		}
		if rep.errno != 0 {
			t.Errorf("write %d: errno %d", rep.cookie, rep.errno)
		}
	}
	c.expectClosed(10 * time.Second)
	e.mu.Lock()
	h := e.handles[0]
	e.mu.Unlock()
	if s := h.started.Load(); s != n {
		t.Errorf("%d writes started, want %d", s, n)
	}
}
