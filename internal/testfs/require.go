package testfs

import (
	"fmt"
	"os"
	"os/exec"
	"testing"
)

// SkipOrFail stops the test because a prerequisite is missing: t.Skip
// locally, t.Fatal when the environment variable CI is set.
func SkipOrFail(t testing.TB, format string, args ...any) {
	t.Helper()
	msg := fmt.Sprintf(format, args...)
	if os.Getenv("CI") != "" {
		t.Fatalf("%s (CI is set, so a missing prerequisite fails the test)", msg)
	}
	t.Skip(msg)
}

// RequireTool stops the test (see SkipOrFail) unless name is found in PATH.
func RequireTool(t testing.TB, name string) {
	t.Helper()
	if _, err := exec.LookPath(name); err != nil {
		SkipOrFail(t, "%s not found: %v", name, err)
	}
}

// RequireRoot stops the test (see SkipOrFail) unless it runs as root.
func RequireRoot(t testing.TB) {
	t.Helper()
	if uid := os.Geteuid(); uid != 0 {
		SkipOrFail(t, "needs root, running as uid %d", uid)
	}
}
