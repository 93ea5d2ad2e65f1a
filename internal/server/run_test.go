package server

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"path/filepath"
	"testing"
	"time"
)

func quietLogger() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// freePort returns a loopback address that was free a moment ago.
func freePort(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	_ = l.Close()
	return addr
}

// TestRunClosesListenersWhenStartFails: when the NBD unix socket cannot be
// made, Run fails and has closed the API and NBD TCP listeners it opened:
// their ports can be listened on again.
func TestRunClosesListenersWhenStartFails(t *testing.T) {
	apiAddr, nbdAddr := freePort(t), freePort(t)
	err := Run(context.Background(), Config{PoolDir: t.TempDir(), APIAddr: apiAddr, NBDAddr: nbdAddr,
		NBDSocket: filepath.Join(t.TempDir(), "missing", "nbd.sock"), Logger: quietLogger()})
	if err == nil {
		t.Fatal("Run with an NBD socket in a missing directory succeeded")
	}
	for _, addr := range []string{apiAddr, nbdAddr} {
		l, err := net.Listen("tcp", addr)
		if err != nil {
			t.Errorf("listen %s after Run failed: %v (a listener leaked)", addr, err)
			continue
		}
		_ = l.Close()
	}
}

var errInjected = errors.New("injected accept failure")

// failingListener fails Accept with errInjected.
type failingListener struct{ net.Listener }

func (failingListener) Accept() (net.Conn, error) { return nil, errInjected }

// TestRunStopsEverythingWhenAListenerFails: when a listener fails while
// serving, Run returns its error and has shut down the others first: the
// API no longer accepts connections, nor does the NBD TCP listener.
func TestRunStopsEverythingWhenAListenerFails(t *testing.T) {
	ready := make(chan [2]net.Addr, 1)
	done := make(chan error, 1)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		done <- Run(ctx, Config{PoolDir: t.TempDir(), APIAddr: "127.0.0.1:0", NBDAddr: "127.0.0.1:0",
			NBDSocket: filepath.Join(t.TempDir(), "nbd.sock"), Logger: quietLogger(),
			Ready: func(api, nbd net.Addr) { ready <- [2]net.Addr{api, nbd} },
			WrapListener: func(l net.Listener) net.Listener {
				if l.Addr().Network() == "unix" {
					return failingListener{l}
				}
				return l
			}})
	}()
	var addrs [2]net.Addr
	select {
	case addrs = <-ready:
	case err := <-done:
		t.Fatalf("Run ended before serving: %v", err)
	}
	select {
	case err := <-done:
		if !errors.Is(err, errInjected) {
			t.Fatalf("Run: %v, want the listener's error", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("Run kept running after a listener failed")
	}
	for i, a := range addrs {
		if c, err := net.DialTimeout("tcp", a.String(), time.Second); err == nil {
			self := c.LocalAddr().String() == c.RemoteAddr().String()
			_ = c.Close()
			// A dial to a closed port in the ephemeral range can pick
			// that very port as its source and connect to itself (TCP
			// simultaneous open): no listener, and no failure.
			if !self {
				t.Errorf("%s (%s) still accepts connections after Run returned", a, [2]string{"API", "NBD"}[i])
			}
		}
	}
}
