package nbd

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/quiverstorage/quiver/internal/pool"
)

// failingListener fails its first n accepts with err, then accepts.
type failingListener struct {
	net.Listener
	mu  sync.Mutex
	n   int
	err error
}

func (l *failingListener) Accept() (net.Conn, error) {
	l.mu.Lock()
	if l.n > 0 {
		l.n--
		l.mu.Unlock()
		return nil, l.err
	}
	l.mu.Unlock()
	return l.Listener.Accept()
}

// TestAcceptErrorsThatPass: an accept that fails for want of file
// descriptors (or for a connection reset before it was accepted) does not
// stop the server: it pauses and serves the next client.
func TestAcceptErrorsThatPass(t *testing.T) {
	for _, errno := range []syscall.Errno{syscall.EMFILE, syscall.ENFILE, syscall.ECONNABORTED} {
		t.Run(errno.Error(), func(t *testing.T) {
			e := newEnv(t, Config{}, nil)
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			fl := &failingListener{Listener: ln, n: 5,
				err: &net.OpError{Op: "accept", Net: "tcp", Err: os.NewSyscallError("accept4", errno)}}
			done := make(chan error, 1)
			go func() { done <- e.srv.Serve(fl) }()
			c := dial(t, ln.Addr().String())
			c.handshake(hsOpts{export: exportRoot})
			if rep := c.do(testReq{typ: cmdRead, length: 4096}); rep.errno != 0 {
				t.Fatalf("READ after %d failed accepts: errno %d", 5, rep.errno)
			}
			select {
			case err := <-done:
				t.Fatalf("Serve returned %v after a passing accept error", err)
			default:
			}
		})
	}
}

// dialFrom connects to addr from a given loopback source address.
func dialFrom(t testing.TB, src, addr string) *testClient {
	t.Helper()
	d := net.Dialer{Timeout: 5 * time.Second, LocalAddr: &net.TCPAddr{IP: net.ParseIP(src)}}
	nc, err := d.Dial("tcp", addr)
	if err != nil {
		t.Fatalf("dial %s from %s: %v", addr, src, err)
	}
	t.Cleanup(func() { _ = nc.Close() })
	return newTestClient(t, nc)
}

// recordingObserver records rejections.
type recordingObserver struct {
	mu       sync.Mutex
	rejected map[string]int
	waits    map[string]int
	errors   map[string]int
}

func newRecorder() *recordingObserver {
	return &recordingObserver{rejected: map[string]int{}, waits: map[string]int{}, errors: map[string]int{}}
}
func (o *recordingObserver) ConnOpened() {}
func (o *recordingObserver) ConnClosed() {}
func (o *recordingObserver) ConnRejected(r string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.rejected[r]++
}
func (o *recordingObserver) MemoryWait(s string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.waits[s]++
}
func (o *recordingObserver) DataError(e string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.errors[e]++
}
func (o *recordingObserver) count(m map[string]int, k string) int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return m[k]
}

// TestMaxConnsPerPeer: one peer holds at most MaxConnsPerPeer connections;
// another peer still gets in; each refusal is counted.
func TestMaxConnsPerPeer(t *testing.T) {
	obs := newRecorder()
	e := newEnv(t, Config{MaxConnsPerPeer: 2, Observer: obs}, nil)
	for range 2 {
		dialFrom(t, "127.0.0.2", e.addr).handshake(hsOpts{export: exportRoot})
	}
	dialFrom(t, "127.0.0.2", e.addr).expectClosed(5 * time.Second)
	other := dialFrom(t, "127.0.0.3", e.addr)
	other.handshake(hsOpts{export: exportRoot})
	if rep := other.do(testReq{typ: cmdRead, length: 4096}); rep.errno != 0 {
		t.Errorf("READ from another peer: errno %d", rep.errno)
	}
	if n := obs.count(obs.rejected, "peer"); n != 1 {
		t.Errorf("%d rejections for reason peer, want 1", n)
	}
}

// TestMaxHandshakes: connections that stall in negotiation take at most
// MaxHandshakes slots; one more is refused, and a client that finishes
// negotiating frees its handshake slot for the next.
func TestMaxHandshakes(t *testing.T) {
	obs := newRecorder()
	e := newEnv(t, Config{MaxHandshakes: 2, HandshakeTimeout: time.Hour, GreetingTimeout: time.Hour, Observer: obs}, nil)
	stalled := dial(t, e.addr)
	if _, err := stalled.greeting(); err != nil {
		t.Fatal(err)
	}
	good := dial(t, e.addr)
	good.handshake(hsOpts{export: exportRoot}) // leaves negotiation: its slot is free again
	// The server gives the slot back just after its last option reply.
	for deadline := time.Now().Add(5 * time.Second); e.srv.negotiating.Load() != 1; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%d connections negotiating 5 s after GO, want 1", e.srv.negotiating.Load())
		}
	}
	second := dial(t, e.addr)
	if _, err := second.greeting(); err != nil {
		t.Fatal(err)
	}
	dialFrom(t, "127.0.0.2", e.addr).expectClosed(5 * time.Second) // a third negotiating connection
	if n := obs.count(obs.rejected, ReasonHandshakes); n != 1 {
		t.Errorf("%d rejections for reason %s, want 1", n, ReasonHandshakes)
	}
	if rep := good.do(testReq{typ: cmdRead, length: 4096}); rep.errno != 0 {
		t.Errorf("READ on the negotiated connection: errno %d", rep.errno)
	}
}

// TestMaxHandshakesPerPeer: one peer that stalls in negotiation takes at
// most MaxHandshakesPerPeer negotiation slots; another peer still
// negotiates.
func TestMaxHandshakesPerPeer(t *testing.T) {
	obs := newRecorder()
	e := newEnv(t, Config{MaxHandshakesPerPeer: 2, HandshakeTimeout: time.Hour, GreetingTimeout: time.Hour, Observer: obs}, nil)
	for range 2 {
		if _, err := dialFrom(t, "127.0.0.2", e.addr).greeting(); err != nil {
			t.Fatal(err)
		}
	}
	dialFrom(t, "127.0.0.2", e.addr).expectClosed(5 * time.Second)
	c := dialFrom(t, "127.0.0.3", e.addr)
	c.handshake(hsOpts{export: exportRoot})
	if rep := c.do(testReq{typ: cmdRead, length: 4096}); rep.errno != 0 {
		t.Errorf("READ from another peer: errno %d", rep.errno)
	}
	if n := obs.count(obs.rejected, ReasonHandshakes); n != 1 {
		t.Errorf("%d rejections for reason %s, want 1", n, ReasonHandshakes)
	}
}

// TestGreetingTimeout: a client that never sends its flags is dropped after
// GreetingTimeout, long before HandshakeTimeout.
func TestGreetingTimeout(t *testing.T) {
	e := newEnv(t, Config{GreetingTimeout: 100 * time.Millisecond, HandshakeTimeout: time.Hour}, nil)
	c := dial(t, e.addr)
	if _, err := c.greeting(); err != nil {
		t.Fatal(err)
	}
	c.expectClosed(5 * time.Second)
	// Past the greeting the option phase has the longer bound.
	c = dial(t, e.addr)
	c.mustGreet(clientFlagFixedNewstyle)
	time.Sleep(300 * time.Millisecond)
	c.handshake(hsOpts{export: exportRoot, greeted: true})
	if rep := c.do(testReq{typ: cmdRead, length: 512}); rep.errno != 0 {
		t.Errorf("READ after a slow option phase: errno %d", rep.errno)
	}
}

// countingExports counts the READs that reach a disk.
type countingExports struct {
	Exports
	reads *atomic.Int64
}

type countingDisk struct {
	pool.Disk
	reads *atomic.Int64
}

func (x countingExports) Open(ctx context.Context, name, peer string) (Export, error) {
	ex, err := x.Exports.Open(ctx, name, peer)
	if err == nil {
		ex.Disk = countingDisk{Disk: ex.Disk, reads: x.reads}
	}
	return ex, err
}

func (d countingDisk) ReadAt(p []byte, off int64) error {
	d.reads.Add(1)
	return d.Disk.ReadAt(p, off)
}

// TestMemoryBackpressure: clients that pipeline large READs and never read
// the replies get only as many served as the caps allow (plus what the
// kernel's socket buffers hold), instead of one per worker and queue slot;
// once they read, every reply arrives, correct. The disks do not take
// RWF_NOWAIT here, so each served READ is one ReadAt.
func TestMemoryBackpressure(t *testing.T) {
	const size = 1 << 20
	const pipelined = 100
	for _, tc := range []struct {
		name  string
		cfg   Config
		conns int
		scope string
	}{
		{"per connection", Config{Workers: 64, MaxConnBytes: 2 * size}, 1, "conn"},
		{"per peer", Config{Workers: 64, MaxPeerBytes: 2 * size}, 3, "peer"},
		{"per server", Config{Workers: 64, MaxBytes: 2 * size}, 3, "server"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var reads atomic.Int64
			obs := newRecorder()
			tc.cfg.Observer = obs
			e := newEnv(t, tc.cfg, func(x Exports) Exports { return countingExports{Exports: x, reads: &reads} })
			var clients []*testClient
			for range tc.conns {
				c := dial(t, e.addr)
				_ = c.nc.(*net.TCPConn).SetReadBuffer(64 << 10)
				c.handshake(hsOpts{export: exportRoot}) // simple replies: all the data on the wire
				var wire []byte
				for i := range pipelined {
					r := testReq{typ: cmdRead, cookie: uint64(i + 1), off: uint64(i%2) * size, length: size}
					c.expect(r)
					wire = append(wire, reqBytes(r)...)
				}
				go func() { _ = c.write(wire) }()
				clients = append(clients, c)
			}
			// Let the server serve what it will while nobody reads.
			time.Sleep(time.Second)
			served := reads.Load()
			// Kernel buffers on both sides of a loopback TCP connection
			// hold some MiB; the workers and queue alone would take 128
			// per connection.
			if limit := int64(24 * tc.conns); served > limit {
				t.Errorf("%d READs of 1 MiB served to clients that read nothing, want at most %d", served, limit)
			}
			if obs.count(obs.waits, tc.scope) == 0 {
				t.Errorf("no memory wait counted with scope %s", tc.scope)
			}
			t.Logf("%d READs served while the clients did not read", served)
			var wg sync.WaitGroup
			for _, c := range clients {
				c.timeout = 30 * time.Second
				wg.Go(func() {
					for range pipelined {
						rep, err := c.readReply()
						if err != nil {
							t.Errorf("reading replies: %v", err)
							return
						}
						if rep.errno != 0 {
							t.Errorf("READ: errno %d", rep.errno)
							return
						}
					}
				})
			}
			wg.Wait()
			if got := e.srv.mem.inflight.Load(); got != 0 {
				t.Errorf("%d bytes still reserved after every reply was read", got)
			}
		})
	}
}

// TestSendTimeout: a client that stops reading is disconnected once a
// reply has made no progress for SendTimeout, and its reservations return.
func TestSendTimeout(t *testing.T) {
	e := newEnv(t, Config{SendTimeout: 200 * time.Millisecond}, nil)
	c := dial(t, e.addr)
	_ = c.nc.(*net.TCPConn).SetReadBuffer(64 << 10)
	// Simple replies: every READ answers 1 MiB of data (structured ones
	// send the disk's holes in a few bytes, and could all fit in the
	// socket buffers).
	c.handshake(hsOpts{export: exportRoot})
	var wire []byte
	for i := range 64 {
		wire = append(wire, reqBytes(testReq{typ: cmdRead, cookie: uint64(i + 1), length: 1 << 20})...)
	}
	go func() { _ = c.write(wire) }()
	e.waitIdle()
	if got := e.srv.mem.inflight.Load(); got != 0 {
		t.Errorf("%d bytes still reserved after the connection ended", got)
	}
}

// TestBrokenConnectionStopsWork: once a reply cannot be sent (the client
// went away), the requests already buffered are not run: a client that
// pipelines large READs and leaves costs no further disk reads.
func TestBrokenConnectionStopsWork(t *testing.T) {
	var reads atomic.Int64
	e := newEnv(t, Config{MaxConnBytes: 1 << 20}, func(x Exports) Exports { return countingExports{Exports: x, reads: &reads} })
	c := dial(t, e.addr)
	_ = c.nc.(*net.TCPConn).SetReadBuffer(64 << 10)
	c.handshake(hsOpts{export: exportRoot})
	var wire []byte
	for i := range 200 {
		wire = append(wire, reqBytes(testReq{typ: cmdRead, cookie: uint64(i + 1), length: 1 << 20})...)
	}
	c.mustWrite(wire) // 5.6 KiB: all of it sits in the server's buffer
	time.Sleep(500 * time.Millisecond)
	before := reads.Load()
	_ = c.nc.(*net.TCPConn).SetLinger(0) // close with a reset: the server's next send fails
	_ = c.nc.Close()
	e.waitIdle()
	if after := reads.Load(); after-before > 4 {
		t.Errorf("%d READs run after the client went away (%d before), want at most a few", after-before, before)
	}
}

// TestUnixSocketsArePeersOfTheirOwn: the endpoint serves each volume on a
// socket of its own, one nbd.Server for all; one VM that holds its
// socket's connection slots leaves another volume's socket its own. (All
// unix clients were one peer, "local": 256 connections for a whole node,
// and one VM's stalled requests held the node's byte budget.)
func TestUnixSocketsArePeersOfTheirOwn(t *testing.T) {
	obs := newRecorder()
	e := newEnv(t, Config{MaxConnsPerPeer: 1, Observer: obs}, nil)
	dir := t.TempDir()
	var socks []string
	for _, name := range []string{"vm1.sock", "vm2.sock"} {
		path := filepath.Join(dir, name)
		ln, err := ListenUnix(path)
		if err != nil {
			t.Fatal(err)
		}
		go func() { _ = e.srv.Serve(ln) }()
		socks = append(socks, path)
	}
	dialUnix := func(path string) *testClient {
		nc, err := net.DialTimeout("unix", path, 5*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = nc.Close() })
		return newTestClient(t, nc)
	}
	dialUnix(socks[0]).handshake(hsOpts{export: exportRoot})
	second := dialUnix(socks[1])
	second.handshake(hsOpts{export: exportRoot})
	if rep := second.do(testReq{typ: cmdRead, length: 4096}); rep.errno != 0 {
		t.Fatalf("READ over the second socket: errno %d", rep.errno)
	}
	dialUnix(socks[0]).expectClosed(5 * time.Second) // the first socket's one slot is taken
	if n := obs.count(obs.rejected, "peer"); n != 1 {
		t.Errorf("%d rejections for reason peer, want 1", n)
	}
}
