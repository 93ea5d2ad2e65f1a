package storage

import (
	"testing"

	"github.com/quiverstorage/quiver/internal/fscap"
)

// mustProbe probes dir or fails the test.
func mustProbe(t testing.TB, dir string) Caps {
	t.Helper()
	caps, err := fscap.Probe(dir)
	if err != nil {
		t.Fatal(err)
	}
	return caps
}
