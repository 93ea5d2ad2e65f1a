package cluster

import (
	"context"
	"errors"
	"fmt"
	"net"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestMemberWithoutQuorumStops starts a member whose --initial-cluster names
// two peers that never come: the join must end, with its message, at
// --etcd-start-timeout and when its context is cancelled (SIGTERM), not
// hang in etcd's Close.
func TestMemberWithoutQuorumStops(t *testing.T) {
	for _, c := range []struct {
		name    string
		timeout time.Duration
		cancel  time.Duration // cancel the join's context after this (0: never)
		want    error
	}{
		{"start timeout", time.Second, 0, ErrUnreachable},
		{"cancelled", time.Hour, time.Second, context.Canceled},
	} {
		t.Run(c.name, func(t *testing.T) {
			dir := t.TempDir()
			cfg := Config{NodeName: "n1", ClusterName: "alpha", TokenFile: writeToken(t, dir, "0123456789abcdef-secret"),
				InitialCluster: fmt.Sprintf("n1=http://127.0.0.1:%d,n2=http://127.0.0.1:%d,n3=http://127.0.0.1:%d",
					freePort(t), freePort(t), freePort(t)),
				EtcdClientURLs: []string{fmt.Sprintf("http://127.0.0.1:%d", freePort(t))},
				StateDir:       filepath.Join(dir, "n1"), StartTimeout: c.timeout, Logger: testLogger(t)}
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			if c.cancel > 0 {
				time.AfterFunc(c.cancel, cancel)
			}
			done := make(chan error, 1)
			go func() {
				n, err := Join(ctx, cfg, newMemStore())
				if err == nil {
					_ = n.Close()
				}
				done <- err
			}()
			// A bound for a hang, far above the second the join needs.
			select {
			case err := <-done:
				if !errors.Is(err, c.want) {
					t.Fatalf("join: %v, want %v", err, c.want)
				}
				// Without a peer it can know no leader, and says so.
				if c.want == ErrUnreachable && !strings.Contains(err.Error(), "no leader known") {
					t.Fatalf("join: %v: the message does not say that the member knows no leader", err)
				}
				t.Logf("join ended: %v", err)
			case <-time.After(time.Minute):
				t.Fatal("the join still runs a minute later: the member's Close hangs")
			}
		})
	}
}

// TestMemberPortInUse starts a member whose client or peer port another
// process holds (a second node on one machine with the first one's
// ports): the join is refused with EADDRINUSE, and its message names the
// flag that gives that address.
func TestMemberPortInUse(t *testing.T) {
	for _, c := range []struct {
		name, flag string
		peer       bool // hold the peer port, else the client port
	}{
		{"client port", "--etcd-listen-client", false},
		{"peer port", "--initial-cluster", true},
	} {
		t.Run(c.name, func(t *testing.T) {
			held, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			defer held.Close()
			peerPort, clientPort := freePort(t), freePort(t)
			if c.peer {
				peerPort = held.Addr().(*net.TCPAddr).Port
			} else {
				clientPort = held.Addr().(*net.TCPAddr).Port
			}
			dir := t.TempDir()
			cfg := Config{NodeName: "n1", ClusterName: "alpha", TokenFile: writeToken(t, dir, "0123456789abcdef-secret"),
				InitialCluster: fmt.Sprintf("n1=http://127.0.0.1:%d", peerPort),
				EtcdClientURLs: []string{fmt.Sprintf("http://127.0.0.1:%d", clientPort)},
				StateDir:       filepath.Join(dir, "n1"), StartTimeout: time.Minute, Logger: testLogger(t)}
			n, err := Join(context.Background(), cfg, newMemStore())
			if err == nil {
				_ = n.Close()
				t.Fatal("the join succeeded with its port held by another listener")
			}
			if !errors.Is(err, syscall.EADDRINUSE) {
				t.Fatalf("join: %v, want EADDRINUSE", err)
			}
			if !strings.Contains(err.Error(), c.flag) {
				t.Fatalf("join: %v: the message does not name %s", err, c.flag)
			}
			t.Logf("refused: %v", err)
		})
	}
}

// TestMemberRaftTiming: the embedded member runs with the heartbeat and
// election timeout it was given, in etcd's own configuration.
func TestMemberRaftTiming(t *testing.T) {
	dir := t.TempDir()
	peerPort, clientPort := freePort(t), freePort(t)
	cfg := Config{NodeName: "n1", ClusterName: "alpha", TokenFile: writeToken(t, dir, "0123456789abcdef-secret"),
		InitialCluster: fmt.Sprintf("n1=http://127.0.0.1:%d", peerPort),
		EtcdClientURLs: []string{fmt.Sprintf("http://127.0.0.1:%d", clientPort)},
		StateDir:       filepath.Join(dir, "n1"), StartTimeout: time.Minute, Logger: testLogger(t),
		LeaseTTL: 3 * time.Second, EtcdHeartbeat: 50 * time.Millisecond, EtcdElection: 500 * time.Millisecond}
	n, err := Join(context.Background(), cfg, newMemStore())
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close()
	got := n.etcd.Config()
	if got.TickMs != 50 || got.ElectionMs != 500 || n.etcd.Server.Cfg.ElectionTicks != 10 {
		t.Fatalf("member runs with tick %d ms, election %d ms (%d ticks), want 50, 500 (10)", got.TickMs, got.ElectionMs, n.etcd.Server.Cfg.ElectionTicks)
	}
}
