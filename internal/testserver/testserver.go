package testserver

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
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

// FreePort returns a loopback address that was free a moment ago; callers
// retry when the server then reports "address already in use".
func FreePort() (string, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer ln.Close()
	return ln.Addr().String(), nil
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
