package cli

import (
	"context"
	"io"
	"log/slog"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/quiverstorage/quiver/internal/apiserver"
	"github.com/quiverstorage/quiver/internal/job"
	"github.com/quiverstorage/quiver/internal/pool"
)

// startRealAPI serves the real API over a fresh pool.
func startRealAPI(t *testing.T) string {
	t.Helper()
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	p, err := pool.Open(context.Background(), t.TempDir(), log)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close() })
	jobs := job.NewManager()
	t.Cleanup(func() { _ = jobs.Shutdown(context.Background()) })
	srv := httptest.NewServer(apiserver.NewServer(p, jobs, "", log))
	t.Cleanup(srv.Close)
	return srv.URL
}

// TestCreateOfATakenNameFails: against the real server, a create whose name
// is taken exits non-zero and says what to do, for every create command
// (issue 14: `snapshot create` with an existing name exited 0 and kept the
// old snapshot). The CLI sends no idempotency key: retries are for programs.
func TestCreateOfATakenNameFails(t *testing.T) {
	url := startRealAPI(t)
	ctx := context.Background()
	setup := [][]string{
		{"volume", "create", "db01", "--capacity", "64Mi", "--disk", "root=8Mi"},
		{"snapshot", "create", "db01", "base"},
	}
	for _, args := range setup {
		if got := run(t, ctx, url, nil, args...); got.code != ExitOK {
			t.Fatalf("%v: exit %d: %s", args, got.code, got.stderr)
		}
	}
	for _, args := range [][]string{
		{"volume", "create", "web01", "--capacity", "64Mi", "--disk", "root=8Mi"},
		{"snapshot", "create", "db01", "nightly"},
		{"clone", "db01@base", "db02"},
		{"disk", "add", "db01", "logs=8Mi"},
		{"attach", "create", "db01", "worker-2"},
	} {
		t.Run(strings.Join(args[:2], " "), func(t *testing.T) {
			if got := run(t, ctx, url, nil, args...); got.code != ExitOK {
				t.Fatalf("first: exit %d: %s", got.code, got.stderr)
			}
			got := run(t, ctx, url, nil, args...)
			if got.code != ExitError || !strings.Contains(got.stderr, "already") ||
				!strings.Contains(got.stderr, "first") {
				t.Errorf("again: exit %d, stderr %q; want exit %d and what to do", got.code, got.stderr, ExitError)
			}
		})
	}
}
