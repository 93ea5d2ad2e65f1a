package nbd

import (
	"context"
	"errors"
	"io"
	"net"
	"sync"
	"testing"
	"time"
)

// TestMaxConns: connections beyond Config.MaxConns are closed at once,
// without a greeting, while the open ones keep working; a freed slot is
// usable again.
func TestMaxConns(t *testing.T) {
	e := newEnv(t, Config{MaxConns: 2}, nil)
	c1 := e.connect(t, hsOpts{export: exportRoot})
	c2 := e.connect(t, hsOpts{export: exportData, structured: true})

	var wg sync.WaitGroup
	for range 20 {
		wg.Go(func() {
			nc, err := net.DialTimeout("tcp", e.addr, 5*time.Second)
			if err != nil {
				t.Error(err)
				return
			}
			defer nc.Close()
			_ = nc.SetReadDeadline(time.Now().Add(5 * time.Second))
			b := make([]byte, 1)
			n, err := nc.Read(b)
			var ne net.Error
			if n > 0 || (errors.As(err, &ne) && ne.Timeout()) {
				t.Errorf("connection beyond the limit: read %d bytes, %v; want it closed", n, err)
			}
		})
	}
	wg.Wait()

	for _, c := range []*testClient{c1, c2} {
		if rep := c.do(testReq{typ: cmdRead, off: 0, length: 4096}); rep.errno != 0 {
			t.Errorf("READ on a connection within the limit: errno %d", rep.errno)
		}
	}
	_ = c1.nc.Close()
	deadline := time.Now().Add(10 * time.Second)
	for e.srv.Conns() > 1 {
		if time.Now().After(deadline) {
			t.Fatal("closed connection still counted after 10 s")
		}
		time.Sleep(5 * time.Millisecond)
	}
	c3 := e.connect(t, hsOpts{export: exportSnap})
	if rep := c3.do(testReq{typ: cmdRead, off: 0, length: 4096}); rep.errno != 0 {
		t.Errorf("READ on a connection in a freed slot: errno %d", rep.errno)
	}
}

// queued returns the number of requests read but not yet taken by a
// worker, over every connection.
func (e *testEnv) queued() int {
	e.srv.mu.Lock()
	defer e.srv.mu.Unlock()
	n := 0
	for c := range e.srv.conns {
		n += len(c.reqs) + len(c.writes)
	}
	return n
}

// TestShutdownInFlight: Shutdown while requests are in flight. Every
// request already read gets its reply; later ones get ESHUTDOWN or no reply
// and a disconnect; exactly the acknowledged writes are on disk.
func TestShutdownInFlight(t *testing.T) {
	for _, structured := range []bool{false, true} {
		t.Run(map[bool]string{false: "simple", true: "structured"}[structured], func(t *testing.T) {
			gate := &gateExports{entered: make(chan struct{}, 16), release: make(chan struct{})}
			e := newEnv(t, Config{Workers: 1}, func(x Exports) Exports { gate.Exports = x; return gate })
			c := e.connect(t, hsOpts{export: exportRoot, structured: structured})
			w := func(i int) testReq {
				return withPayload(testReq{typ: cmdWrite, cookie: uint64(i), off: uint64(i) * 65536, length: 4096}, byte(i))
			}
			// 1 is executing (blocked in WriteAt), 2 waits for the worker.
			// They go out in one write: a lone request would run on the
			// reader.
			c.expect(w(1))
			c.expect(w(2))
			c.mustWrite(append(reqBytes(w(1)), reqBytes(w(2))...))
			<-gate.entered
			for deadline := time.Now().Add(10 * time.Second); e.queued() < 1; time.Sleep(time.Millisecond) {
				if time.Now().After(deadline) {
					t.Fatal("second request never queued")
				}
			}
			// 3 to 6 arrive together; the reader may or may not have
			// taken them when Shutdown stops it.
			var burst []byte
			for i := 3; i <= 6; i++ {
				c.expect(w(i))
				burst = append(burst, reqBytes(w(i))...)
			}
			c.mustWrite(burst)

			done := make(chan error, 1)
			go func() {
				ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
				defer cancel()
				done <- e.srv.Shutdown(ctx)
			}()
			for !e.srv.closing.Load() {
				time.Sleep(time.Millisecond)
			}
			close(gate.release)

			replies := map[uint64]uint32{}
			for {
				rep, err := c.readReply()
				if err != nil {
					break // the server hung up
				}
				replies[rep.cookie] = rep.errno
			}
			if err := <-done; err != nil {
				t.Fatalf("Shutdown: %v", err)
			}
			for i := 1; i <= 6; i++ {
				errno, ok := replies[uint64(i)]
				switch {
				case i <= 2 && (!ok || errno != 0):
					t.Errorf("write %d, read before Shutdown: reply %v errno %d, want success", i, ok, errno)
				case ok && errno != 0 && errno != errShutdown:
					t.Errorf("write %d: errno %d, want success or ESHUTDOWN", i, errno)
				case ok && errno == 0:
					r := w(i)
					e.wrote("root", r.off, r.payload)
				}
			}
			t.Logf("replies: %v", replies)
			c.expectClosed(5 * time.Second)
			e.checkDisks()
		})
	}
}

// TestShutdownIdle: Shutdown does not wait for idle clients, whether in
// transmission or stalled mid-negotiation (the handshake timeout is an
// hour here), nor for clients connecting while it runs.
func TestShutdownIdle(t *testing.T) {
	e := newEnv(t, Config{HandshakeTimeout: time.Hour}, nil)
	idle := e.connect(t, hsOpts{export: exportRoot})
	stalled := dial(t, e.addr)
	stalled.mustGreet(clientFlagFixedNewstyle)
	stalled.mustWrite(optBytes(optList, nil)[:7])

	stop := make(chan struct{})
	var wg sync.WaitGroup
	for range 8 { // clients dialling throughout, and then sitting idle
		wg.Go(func() {
			var conns []net.Conn
			defer func() {
				for _, nc := range conns {
					_ = nc.Close()
				}
			}()
			for range 50 {
				select {
				case <-stop:
					return
				case <-time.After(time.Millisecond):
				}
				nc, err := net.DialTimeout("tcp", e.addr, time.Second)
				if err != nil {
					return // listener closed
				}
				conns = append(conns, nc)
			}
		})
	}
	time.Sleep(20 * time.Millisecond)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	err := e.srv.Shutdown(ctx)
	close(stop)
	wg.Wait()
	if err != nil {
		t.Fatalf("Shutdown with idle clients: %v", err)
	}
	idle.expectClosed(5 * time.Second)
	stalled.expectClosed(5 * time.Second)
	if n := e.srv.Conns(); n != 0 {
		t.Errorf("%d connections after Shutdown", n)
	}
}

// hookConn holds the first SetDeadline (the handshake deadline set when the
// connection starts) until hold is closed, and reports SetReadDeadline
// (what Shutdown calls to stop a connection).
type hookConn struct {
	net.Conn
	once     sync.Once
	hold     chan struct{}
	stopped  chan struct{}
	stopOnce sync.Once
}

func (h *hookConn) SetDeadline(t time.Time) error {
	h.once.Do(func() { <-h.hold })
	return h.Conn.SetDeadline(t)
}

func (h *hookConn) SetReadDeadline(t time.Time) error {
	err := h.Conn.SetReadDeadline(t)
	h.stopOnce.Do(func() { close(h.stopped) })
	return err
}

// TestShutdownRacesNewConnection: a connection accepted just before
// Shutdown, whose handshake deadline is set only after Shutdown stopped it,
// must not keep Shutdown waiting for the (here hour-long) handshake timeout.
func TestShutdownRacesNewConnection(t *testing.T) {
	s := NewServer(PoolExports{}, Config{HandshakeTimeout: time.Hour, Logger: discardLogger()})
	server, client := net.Pipe()
	defer client.Close()
	go func() { _, _ = io.Copy(io.Discard, client) }()
	hc := &hookConn{Conn: server, hold: make(chan struct{}), stopped: make(chan struct{})}
	s.start(hc)
	done := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		done <- s.Shutdown(ctx)
	}()
	<-hc.stopped
	close(hc.hold)
	if err := <-done; err != nil {
		t.Fatalf("Shutdown: %v", err)
	}
}

// TestShutdownBusyClient: a client that keeps sending requests does not
// keep Shutdown waiting. (On a blocking TCP socket shutdown(SHUT_RD) does
// not stop later data from being read: the reader must stop by itself.)
func TestShutdownBusyClient(t *testing.T) {
	e := newEnv(t, Config{}, nil)
	c := e.connect(t, hsOpts{export: exportRoot, structured: true})
	go func() { _, _ = io.Copy(io.Discard, c.nc) }()
	var burst []byte
	for i := range 32 {
		burst = append(burst, reqBytes(testReq{typ: cmdRead, cookie: uint64(i + 1), length: 4096})...)
	}
	stop := make(chan struct{})
	sending := make(chan struct{})
	go func() {
		defer close(sending)
		for {
			select {
			case <-stop:
				return
			default:
			}
			_ = c.nc.SetWriteDeadline(time.Now().Add(time.Second))
			if _, err := c.nc.Write(burst); err != nil {
				return
			}
		}
	}()
	time.Sleep(100 * time.Millisecond)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	err := e.srv.Shutdown(ctx)
	close(stop)
	<-sending
	if err != nil {
		t.Fatalf("Shutdown with a client sending requests: %v", err)
	}
}

// TestShutdownServesReceived: a request the server received before
// Shutdown began is served, even if the reader decodes it after (it waited
// in the reader's buffer behind requests that held the reader): only what
// a read begun after Shutdown may bring gets ESHUTDOWN. QEMU fails a
// request answered ESHUTDOWN (an I/O error in the guest), where it sends
// again, after reconnecting, a request left unanswered: the compute node's
// endpoint is restarted under running VMs (TestEndpointGuest).
func TestShutdownServesReceived(t *testing.T) {
	gate := &gateExports{entered: make(chan struct{}, 16), release: make(chan struct{})}
	e := newEnv(t, Config{Workers: 1}, func(x Exports) Exports { gate.Exports = x; return gate })
	c := e.connect(t, hsOpts{export: exportRoot, structured: true})
	w := func(i int) testReq {
		return withPayload(testReq{typ: cmdWrite, cookie: uint64(i), off: uint64(i) * 65536, length: 4096}, byte(i))
	}
	// 1 executes (held in WriteAt), 2 waits in the worker's queue.
	c.expect(w(1))
	c.expect(w(2))
	c.mustWrite(append(reqBytes(w(1)), reqBytes(w(2))...))
	<-gate.entered
	inFlight := func() int64 {
		e.srv.mu.Lock()
		defer e.srv.mu.Unlock()
		n := int64(0)
		for sc := range e.srv.conns {
			n += int64(sc.queued.Load())
		}
		return n
	}
	// 3 and 4 come in one read: the reader hands 3 on and waits for room
	// in the queue, 4 stays in its buffer.
	c.expect(w(3))
	c.expect(w(4))
	c.mustWrite(append(reqBytes(w(3)), reqBytes(w(4))...))
	for deadline := time.Now().Add(10 * time.Second); inFlight() < 3; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the third request never reached the queue")
		}
	}
	done := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		done <- e.srv.Shutdown(ctx)
	}()
	for !e.srv.closing.Load() {
		time.Sleep(time.Millisecond)
	}
	close(gate.release)
	replies := map[uint64]uint32{}
	for {
		rep, err := c.readReply()
		if err != nil {
			break // the server hung up
		}
		replies[rep.cookie] = rep.errno
	}
	if err := <-done; err != nil {
		t.Fatalf("Shutdown: %v", err)
	}
	for i := 1; i <= 4; i++ {
		if errno, ok := replies[uint64(i)]; !ok || errno != 0 {
			t.Errorf("write %d, received before Shutdown: reply %v errno %d, want success", i, ok, errno)
			continue
		}
		r := w(i)
		e.wrote("root", r.off, r.payload)
	}
	e.checkDisks()
}
