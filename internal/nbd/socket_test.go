package nbd

import (
	"bytes"
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
