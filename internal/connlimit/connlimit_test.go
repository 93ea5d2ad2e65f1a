package connlimit

import (
	"errors"
	"io"
	"net"
	"os"
	"sync"
	"syscall"
	"testing"
	"time"
)

func TestLimiter(t *testing.T) {
	for _, tc := range []struct {
		name          string
		max, perPeer  int
		peers         []string
		want          []string
		releaseFirst  bool
		afterRelease  string
		wantAfterward string
	}{
		{"total", 3, 0, []string{"a", "b", "c", "d"}, []string{"", "", "", ReasonTotal}, true, "d", ""},
		{"per peer", 0, 2, []string{"a", "a", "a", "b"}, []string{"", "", ReasonPeer, ""}, true, "a", ""},
		{"both", 3, 2, []string{"a", "a", "b", "c"}, []string{"", "", "", ReasonTotal}, false, "b", ReasonTotal},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l := New(tc.max, tc.perPeer)
			for i, p := range tc.peers {
				if got := l.Acquire(p); got != tc.want[i] {
					t.Errorf("connection %d from %s: %q, want %q", i, p, got, tc.want[i])
				}
			}
			if tc.releaseFirst {
				l.Release(tc.peers[0])
			}
			if got := l.Acquire(tc.afterRelease); got != tc.wantAfterward {
				t.Errorf("after release, from %s: %q, want %q", tc.afterRelease, got, tc.wantAfterward)
			}
		})
	}
}

func TestTemporary(t *testing.T) {
	sys := func(e syscall.Errno) error {
		return &net.OpError{Op: "accept", Net: "tcp", Err: os.NewSyscallError("accept4", e)}
	}
	for _, tc := range []struct {
		err       error
		temporary bool
		fds       bool
	}{
		{sys(syscall.EMFILE), true, true},
		{sys(syscall.ENFILE), true, true},
		{sys(syscall.ECONNABORTED), true, false},
		{sys(syscall.ENOBUFS), true, false},
		{net.ErrClosed, false, false},
		{sys(syscall.EBADF), false, false},
	} {
		if got := Temporary(tc.err); got != tc.temporary {
			t.Errorf("Temporary(%v) = %v, want %v", tc.err, got, tc.temporary)
		}
		if got := OutOfFDs(tc.err); got != tc.fds {
			t.Errorf("OutOfFDs(%v) = %v, want %v", tc.err, got, tc.fds)
		}
	}
}

// failing fails its first n accepts with EMFILE.
type failing struct {
	net.Listener
	n int
}

func (f *failing) Accept() (net.Conn, error) {
	if f.n > 0 {
		f.n--
		return nil, &net.OpError{Op: "accept", Net: "tcp", Err: os.NewSyscallError("accept4", syscall.EMFILE)}
	}
	return f.Listener.Accept()
}

// TestListener: over-limit connections are closed at accept and counted,
// EMFILE is waited out, a closed connection frees its slot, and Accept
// returns once the listener is closed.
func TestListener(t *testing.T) {
	inner, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	reasons := map[string]int{}
	ln := &Listener{Listener: &failing{Listener: inner, n: 3}, Limiter: New(0, 1), Rejected: func(r string) {
		mu.Lock()
		reasons[r]++
		mu.Unlock()
	}}
	accepted := make(chan net.Conn, 10)
	done := make(chan error, 1)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				done <- err
				return
			}
			accepted <- c
		}
	}()
	dialAndRead := func() error {
		c, err := net.Dial("tcp", inner.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		_ = c.SetReadDeadline(time.Now().Add(300 * time.Millisecond))
		_, err = c.Read(make([]byte, 1))
		return err
	}
	var ne net.Error
	if err := dialAndRead(); !errors.As(err, &ne) || !ne.Timeout() {
		t.Fatalf("first connection: %v, want it held open", err)
	}
	first := <-accepted
	if err := dialAndRead(); err != io.EOF && !errors.Is(err, syscall.ECONNRESET) {
		t.Fatalf("second connection from the same peer: %v, want it closed", err)
	}
	_ = first.Close()
	if err := dialAndRead(); !errors.As(err, &ne) || !ne.Timeout() {
		t.Fatalf("connection after the first closed: %v, want it held open", err)
	}
	(<-accepted).Close()
	mu.Lock()
	if reasons[ReasonFDs] != 3 || reasons[ReasonPeer] != 1 {
		t.Errorf("rejections %v, want 3 %s and 1 %s", reasons, ReasonFDs, ReasonPeer)
	}
	mu.Unlock()
	_ = inner.Close()
	if err := <-done; !errors.Is(err, net.ErrClosed) {
		t.Errorf("Accept after Close: %v", err)
	}
}
