package nbd

import (
	"bytes"
	"fmt"
	"io"
	"net"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// TestTransmissionOnBlockingSocket: once negotiated, a TCP connection is
// served from a blocking socket outside the poller (socket.go).
func TestTransmissionOnBlockingSocket(t *testing.T) {
	e := newEnv(t, Config{}, nil)
	c := e.connect(t, hsOpts{export: exportRoot, structured: true})
	// The server switches after sending its GO reply: wait for it.
	deadline := time.Now().Add(5 * time.Second)
	for {
		e.srv.mu.Lock()
		blocking := 0
		for sc := range e.srv.conns {
			if _, ok := sc.nc.(*blockingConn); ok && sc.snd.blocking {
				blocking++
			}
		}
		e.srv.mu.Unlock()
		if blocking == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("connection still in the poller 5 s after negotiation")
		}
		time.Sleep(time.Millisecond)
	}
	rep := c.do(testReq{typ: cmdRead, off: 0, length: 4096})
	if rep.errno != 0 || !bytes.Equal(rep.data, e.model["root"][:4096]) {
		t.Fatalf("READ on the blocking socket: error %d, data equal %v", rep.errno, bytes.Equal(rep.data, e.model["root"][:4096]))
	}
}

// TestPolledStaysInPoller: with Config.Polled (the benchmarks' hidden
// switch) a TCP connection is served from the poller: after a READ has been
// answered, and so after the point where it would have left it, it is still
// a net.TCPConn and sends as a polled socket.
func TestPolledStaysInPoller(t *testing.T) {
	e := newEnv(t, Config{Polled: true}, nil)
	c := e.connect(t, hsOpts{export: exportRoot, structured: true})
	rep := c.do(testReq{typ: cmdRead, off: 0, length: 4096})
	if rep.errno != 0 || !bytes.Equal(rep.data, e.model["root"][:4096]) {
		t.Fatalf("READ: error %d, data equal %v", rep.errno, bytes.Equal(rep.data, e.model["root"][:4096]))
	}
	e.srv.mu.Lock()
	defer e.srv.mu.Unlock()
	if len(e.srv.conns) != 1 {
		t.Fatalf("%d connections, want 1", len(e.srv.conns))
	}
	for sc := range e.srv.conns {
		if _, ok := sc.nc.(*net.TCPConn); !ok || sc.snd.blocking {
			t.Fatalf("connection is a %T (blocking sends %v), want a polled *net.TCPConn", sc.nc, sc.snd.blocking)
		}
	}
}

// TestReplyWaitsForSlowClient: a reply larger than the socket buffers,
// to a client that does not read for a while, is sent whole once the
// client reads (the sender waits in the kernel when MSG_DONTWAIT finds the
// buffer full), and the connection goes on working.
func TestReplyWaitsForSlowClient(t *testing.T) {
	e := newEnv(t, Config{}, nil)
	d := net.Dialer{Timeout: 5 * time.Second, Control: func(_, _ string, rc syscall.RawConn) error {
		return rc.Control(func(fd uintptr) {
			_ = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_RCVBUF, 4096)
		})
	}}
	nc, err := d.Dial("tcp", e.addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = nc.Close() })
	c := newTestClient(t, nc)
	c.handshake(hsOpts{export: exportRoot, structured: true})

	// Sixteen 2 MiB READs with DF, so that the holes go out as zeros too
	// (32 MiB of replies, more than any socket buffer), with the client
	// not reading.
	const n = 16
	sent := map[uint64]bool{}
	for range n {
		sent[c.send(testReq{typ: cmdRead, flags: cmdFlagDF, off: 0, length: rootSize})] = true
	}
	time.Sleep(200 * time.Millisecond)
	for range n {
		rep, err := c.readReply()
		if err != nil {
			t.Fatalf("reply: %v", err)
		}
		if !sent[rep.cookie] {
			t.Fatalf("reply for cookie %d, not in flight", rep.cookie)
		}
		delete(sent, rep.cookie)
		if rep.errno != 0 || !bytes.Equal(rep.data, e.model["root"]) {
			t.Fatalf("2 MiB READ: error %d, data equal %v", rep.errno, bytes.Equal(rep.data, e.model["root"]))
		}
	}
	if rep := c.do(testReq{typ: cmdFlush}); rep.errno != 0 {
		t.Fatalf("FLUSH after the large replies: error %d", rep.errno)
	}
}

// tcpPair returns the two ends of a loopback TCP connection.
func tcpPair(t *testing.T) (server, client net.Conn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	accepted := make(chan net.Conn, 1)
	go func() {
		sc, _ := ln.Accept()
		accepted <- sc
	}()
	client, err = net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	server = <-accepted
	if server == nil {
		t.Fatal("accept failed")
	}
	t.Cleanup(func() { _ = client.Close() })
	return server, client
}

// TestSendWritesEverything: send delivers every byte of any list of
// buffers (empty ones anywhere, more than one sendmsg takes, larger than
// a raw send), on a polled socket and on a blocking one.
func TestSendWritesEverything(t *testing.T) {
	cases := map[string]func() [][]byte{
		"1024 empty, then data": func() [][]byte {
			b := make([][]byte, 1025)
			for i := range 1024 {
				b[i] = []byte{}
			}
			b[1024] = []byte("payload")
			return b
		},
		"3000 buffers, every third empty": func() [][]byte {
			var b [][]byte
			for i := range 3000 {
				if i%3 == 0 {
					b = append(b, nil)
				} else {
					b = append(b, pattern(byte(i), int64(i), 1+i%100))
				}
			}
			return b
		},
		"8 MiB in two buffers": func() [][]byte {
			return [][]byte{pattern(1, 0, 16), pattern(2, 16, 8<<20)}
		},
	}
	for _, blocking := range []bool{false, true} {
		for name, mk := range cases {
			t.Run(fmt.Sprintf("%s blocking=%v", name, blocking), func(t *testing.T) {
				sc, cc := tcpPair(t)
				c := &conn{nc: sc}
				c.raw, _ = sc.(syscall.Conn).SyscallConn()
				if blocking {
					c.leavePoller()
					if !c.snd.blocking {
						t.Fatal("leavePoller left the TCP connection in the poller")
					}
				}
				defer c.nc.Close()
				bufs := mk()
				want := bytes.Join(bufs, nil)
				got := make(chan []byte, 1)
				go func() {
					b := make([]byte, len(want))
					_ = cc.SetReadDeadline(time.Now().Add(10 * time.Second))
					n, _ := io.ReadFull(cc, b)
					got <- b[:n]
				}()
				if err := c.send(bufs); err != nil {
					t.Fatalf("send: %v", err)
				}
				if g := <-got; !bytes.Equal(g, want) {
					t.Fatalf("peer got %d bytes, want %d (equal prefix: %v)", len(g), len(want), bytes.HasPrefix(want, g))
				}
			})
		}
	}
}
