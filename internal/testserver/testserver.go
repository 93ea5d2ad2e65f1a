package testserver

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/quiverstorage/quiver/internal/testfs"
)

// Build compiles ./cmd/quiver of the enclosing module into out, with the
// race detector when race is true (pass RaceEnabled so the server is
// race-checked by real clients whenever the tests are).
func Build(out string, race bool) error {
	mod, err := exec.Command("go", "env", "GOMOD").Output()
	if err != nil {
		return fmt.Errorf("go env GOMOD: %w", err)
	}
	gomod := strings.TrimSpace(string(mod))
	if gomod == "" || gomod == os.DevNull {
		return errors.New("go env GOMOD: not inside the quiver module")
	}
	args := []string{"build", "-o", out}
	if race {
		args = append(args, "-race")
	}
	cmd := exec.Command("go", append(args, "./cmd/quiver")...)
	cmd.Dir = filepath.Dir(gomod)
	if b, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("go %s: %w\n%s", strings.Join(cmd.Args[1:], " "), err, b)
	}
	return nil
}

// The binaries Binary built, by race detector, in one temporary directory
// that Main removes.
var bins struct {
	mu    sync.Mutex
	dir   string
	paths map[bool]string
}

// Binary returns cmd/quiver built for this test binary, once per flavour:
// with the race detector when race is true and the tests run with it, so
// that the server is checked for races while real clients load it.
func Binary(t testing.TB, race bool) string {
	t.Helper()
	testfs.RequireTool(t, "go")
	race = race && RaceEnabled
	bins.mu.Lock()
	defer bins.mu.Unlock()
	if p, ok := bins.paths[race]; ok {
		return p
	}
	if bins.dir == "" {
		dir, err := os.MkdirTemp("", "quiver-bin-")
		if err != nil {
			t.Fatal(err)
		}
		bins.dir, bins.paths = dir, map[bool]string{}
	}
	bin := filepath.Join(bins.dir, "quiver")
	if race {
		bin += "-race"
	}
	if err := Build(bin, race); err != nil {
		t.Fatal(err)
	}
	bins.paths[race] = bin
	return bin
}

// Main runs a test binary's tests and removes what Binary built: call it from
// TestMain as os.Exit(testserver.Main(m)).
func Main(m *testing.M) int {
	code := m.Run()
	bins.mu.Lock()
	if bins.dir != "" {
		_ = os.RemoveAll(bins.dir)
	}
	bins.mu.Unlock()
	return code
}

// LogBuffer collects a server's output; exec copies into it from another
// goroutine while tests read it.
type LogBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *LogBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *LogBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}
