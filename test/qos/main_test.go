package qosbench

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// quiverBin is the server binary, built once by TestMain.
var quiverBin string

func TestMain(m *testing.M) {
	os.Exit(runTests(m))
}

func runTests(m *testing.M) int {
	dir, err := os.MkdirTemp("", "quiver-qos-")
	if err != nil {
		fmt.Fprintln(os.Stderr, "qos:", err)
		return 1
	}
	defer os.RemoveAll(dir)
	quiverBin = filepath.Join(dir, "quiver")
	if err := buildQuiver(quiverBin); err != nil {
		fmt.Fprintln(os.Stderr, "qos:", err)
		return 1
	}
	return m.Run()
}

// buildQuiver compiles ./cmd/quiver from the module root, with the race
// detector when the tests have it.
func buildQuiver(out string) error {
	args := []string{"build", "-o", out}
	if raceEnabled {
		args = append(args, "-race")
	}
	args = append(args, "./cmd/quiver")
	cmd := exec.Command("go", args...)
	cmd.Dir = filepath.Join("..", "..")
	if b, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("go %s: %v\n%s", strings.Join(args, " "), err, b)
	}
	return nil
}
