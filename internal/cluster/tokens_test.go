package cluster

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/quiverstorage/quiver/internal/auth"
	"github.com/quiverstorage/quiver/internal/storage"
)

func openAuth(t *testing.T) *auth.Store {
	t.Helper()
	fsys, err := storage.OpenOS(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	s, err := auth.Open(fsys, false)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// TestSharedTokens (issue 17 on a cluster): the token stores of two nodes
// shared through etcd. The first node's tokens become the cluster's; the
// second node's own tokens are replaced; a token made on either works on
// both; a revocation on one closes its Done channel on the other within
// 1 s; concurrent changes on both nodes are all kept (compare-and-swap).
func TestSharedTokens(t *testing.T) {
	tc := startCluster(t)
	n2 := tc.join(t, tc.config(t, "n2"), newMemStore())
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	s1, s2 := openAuth(t), openAuth(t)
	first, secret1, err := s1.Create("", auth.RoleAdmin, "n1's own")
	if err != nil {
		t.Fatal(err)
	}
	_, lone, err := s2.Create("", auth.RoleMonitor, "n2's own, before it joined")
	if err != nil {
		t.Fatal(err)
	}
	if err := s1.Share(ctx, tc.first.TokenStore(), testLogger(t)); err != nil {
		t.Fatal(err)
	}
	if err := s2.Share(ctx, n2.TokenStore(), testLogger(t)); err != nil {
		t.Fatal(err)
	}
	if _, err := s2.Authenticate(secret1); err != nil {
		t.Fatalf("n1's token on n2 after sharing: %v", err)
	}
	if _, err := s2.Authenticate(lone); !errors.Is(err, auth.ErrUnauthenticated) {
		t.Fatalf("n2's own token after it took the cluster's store: %v, want refused", err)
	}

	made, secret, err := s2.Create("", auth.RoleMonitor, "made on n2")
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, "n2's new token on n1", func() bool { _, err := s1.Authenticate(secret); return err == nil })

	done := s2.Done(first.ID)
	start := time.Now()
	if err := s1.Revoke(first.ID); err != nil {
		t.Fatal(err)
	}
	select {
	case <-done:
		t.Logf("revoked on n1; n2 saw it after %v", time.Since(start).Round(time.Microsecond))
	case <-time.After(time.Second):
		t.Fatal("a token revoked on n1 still lives on n2 after 1 s")
	}
	if _, err := s2.Authenticate(secret1); !errors.Is(err, auth.ErrUnauthenticated) {
		t.Fatalf("revoked token on n2: %v", err)
	}

	// Concurrent creates on both nodes: each commit compares the version,
	// and a loser makes its change again on the newer state.
	var wg sync.WaitGroup
	ids := make(chan string, 20)
	for i := range 20 {
		s := []*auth.Store{s1, s2}[i%2]
		wg.Add(1)
		go func() {
			defer wg.Done()
			tk, _, err := s.Create("", auth.RoleMonitor, "concurrent")
			if err != nil {
				t.Error(err)
				return
			}
			ids <- tk.ID
		}()
	}
	wg.Wait()
	close(ids)
	want := map[string]bool{made.ID: true}
	for id := range ids {
		want[id] = true
	}
	for _, s := range []*auth.Store{s1, s2} {
		waitFor(t, "every token on both nodes", func() bool {
			have := map[string]bool{}
			for _, tk := range s.List() {
				have[tk.ID] = true
			}
			for id := range want {
				if !have[id] {
					return false
				}
			}
			return len(have) == len(want)
		})
	}
}
