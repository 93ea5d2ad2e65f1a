package interop

import (
	"fmt"
	"github.com/quiverstorage/quiver/internal/testserver"
	"os"
	"path/filepath"
	"testing"
)

// quiverBin is the server binary, built once by TestMain.
var quiverBin string

func TestMain(m *testing.M) {
	os.Exit(runTests(m))
}

func runTests(m *testing.M) int {
	dir, err := os.MkdirTemp("", "quiver-interop-")
	if err != nil {
		fmt.Fprintln(os.Stderr, "interop:", err)
		return 1
	}
	defer os.RemoveAll(dir)
	quiverBin = filepath.Join(dir, "quiver")
	if err := testserver.Build(quiverBin, testserver.RaceEnabled); err != nil {
		fmt.Fprintln(os.Stderr, "interop:", err)
		return 1
	}
	return m.Run()
}
