package interop

import (
	"context"
	"fmt"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/quiverstorage/quiver/internal/testfs"
)

// toolTimeout bounds one run of a peer, so that a hung client fails the
// test with its output instead of the whole run timing out.
const toolTimeout = 2 * time.Minute

// requireTools stops the test unless every tool is installed (skip locally,
// fail under CI).
func requireTools(t *testing.T, names ...string) {
	t.Helper()
	for _, n := range names {
		testfs.RequireTool(t, n)
	}
}

// exe runs a peer and returns its combined output and error.
func exe(ctx context.Context, name string, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, toolTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, name, args...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		err = fmt.Errorf("%s: %w", commandLine(name, args), err)
	}
	return string(out), err
}

// run runs a peer and fails the test if it fails.
func run(t *testing.T, name string, args ...string) string {
	t.Helper()
	start := time.Now()
	out, err := exe(t.Context(), name, args...)
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	t.Logf("%s (%.2fs)", commandLine(name, args), time.Since(start).Seconds())
	return out
}

// runFails runs a peer that must fail and returns its output.
func runFails(t *testing.T, name string, args ...string) string {
	t.Helper()
	out, err := exe(t.Context(), name, args...)
	if err == nil {
		t.Fatalf("%s succeeded, want a failure\n%s", commandLine(name, args), out)
	}
	return out
}

func commandLine(name string, args []string) string {
	q := make([]string, 0, 1+len(args))
	for _, a := range append([]string{name}, args...) {
		if a == "" || strings.ContainsAny(a, " '\"") {
			a = fmt.Sprintf("%q", a)
		}
		q = append(q, a)
	}
	return strings.Join(q, " ")
}
