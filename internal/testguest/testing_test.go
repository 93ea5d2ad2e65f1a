package testguest

import (
	"os"
	"testing"
	"time"
)

func TestContext(t *testing.T) {
	ctx := Context(t, time.Minute)
	dl, ok := ctx.Deadline()
	if !ok || time.Until(dl) > time.Minute {
		t.Fatalf("Context with a minute's limit: deadline %v, %v", dl, ok)
	}
	end, hasEnd := t.Deadline()
	ctx = Context(t, 0)
	dl, ok = ctx.Deadline()
	switch {
	case hasEnd && (!ok || !dl.Equal(end.Add(-15*time.Second))):
		t.Fatalf("Context without a limit: deadline %v, %v; want 15 s before the test's %v", dl, ok, end)
	case !hasEnd && ok:
		t.Fatalf("Context without a limit or -timeout: deadline %v", dl)
	}
	if hasEnd {
		ctx = Context(t, time.Until(end)+time.Hour)
		if dl, _ := ctx.Deadline(); !dl.Equal(end.Add(-15 * time.Second)) {
			t.Fatalf("Context with a limit past the test's end: deadline %v, want %v", dl, end.Add(-15*time.Second))
		}
	}
}

func TestShortDir(t *testing.T) {
	var dir string
	t.Run("make", func(t *testing.T) {
		dir = ShortDir(t, "qtg")
		if fi, err := os.Stat(dir); err != nil || !fi.IsDir() || len(dir) > 40 {
			t.Fatalf("ShortDir: %q: %v", dir, err)
		}
	})
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Fatalf("%s still there after its test: %v", dir, err)
	}
}
