package testguest

import (
	"context"
	"os"
	"testing"
	"time"
)

// Context is t's context, ended 15 s before the test binary's -timeout
// and, with limit > 0, after limit at the latest, so that a hung guest
// fails the test with its console instead of the binary being killed.
func Context(t testing.TB, limit time.Duration) context.Context {
	var deadline time.Time
	if limit > 0 {
		deadline = time.Now().Add(limit)
	}
	if d, ok := t.(interface{ Deadline() (time.Time, bool) }); ok {
		if end, ok := d.Deadline(); ok && (deadline.IsZero() || end.Add(-15*time.Second).Before(deadline)) {
			deadline = end.Add(-15 * time.Second)
		}
	}
	if deadline.IsZero() {
		return t.Context()
	}
	ctx, cancel := context.WithDeadline(t.Context(), deadline)
	t.Cleanup(cancel)
	return ctx
}

// ShortDir is a directory for unix sockets (QMP, NBD), whose paths must
// fit in 108 bytes: t.TempDir() paths carry the test name and may not. Its
// name starts with prefix; t.Cleanup removes it.
func ShortDir(t testing.TB, prefix string) string {
	t.Helper()
	dir, err := os.MkdirTemp("", prefix)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}
