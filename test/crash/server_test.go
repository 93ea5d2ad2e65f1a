package crash

import (
	"context"
	"os"
	"testing"

	"github.com/quiverstorage/quiver/internal/testserver"
)

func TestMain(m *testing.M) { os.Exit(testserver.Main(m)) }

// buildServer returns cmd/quiver compiled with the race detector when the
// test has it, so the server is checked for races too.
func buildServer(t *testing.T) string { return testserver.Binary(t, true) }

// options runs the server without an NBD listener (the test uses none) and
// with debug logs, for the failure reports.
func options(poolDir string) testserver.Options {
	return testserver.Options{Pool: poolDir, LogLevel: "debug"}
}

// spawn starts the server and does not wait for it.
func spawn(bin, poolDir string) (*testserver.Process, error) {
	return testserver.Spawn(bin, options(poolDir))
}

// startServer starts the server and waits until it serves its pool.
func startServer(ctx context.Context, bin, poolDir string) (*testserver.Process, error) {
	return testserver.Start(ctx, bin, options(poolDir))
}
