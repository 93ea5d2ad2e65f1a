package nbdcrash

import (
	"context"
	"os"
	"testing"

	"github.com/quiverstorage/quiver/internal/testserver"
)

func TestMain(m *testing.M) { os.Exit(testserver.Main(m)) }

// startQuiver starts a server on poolDir, NBD on loopback TCP, and waits
// until it serves.
func startQuiver(ctx context.Context, bin, poolDir string) (*testserver.Process, error) {
	return testserver.Start(ctx, bin, testserver.Options{Pool: poolDir, NBDTCP: true})
}

// killServer kills the server and reports whether it had ended by itself
// before.
func killServer(s *testserver.Process) error {
	s.Kill()
	return s.EndedByItself()
}
