package cluster

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
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
				t.Logf("join ended: %v", err)
			case <-time.After(time.Minute):
				t.Fatal("the join still runs a minute later: the member's Close hangs")
			}
		})
	}
}
