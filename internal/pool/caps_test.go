package pool

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/quiverstorage/quiver/internal/storage"
)

// fullFS is a pool's filesystem that has become too full to probe: Probe
// fails as fscap's does then, naming the filesystem it found.
type fullFS struct {
	storage.FS
	name string
}

func (f *fullFS) Probe(string) (storage.Caps, error) {
	return storage.Caps{Filesystem: f.name}, fmt.Errorf("probe: %w", storage.ErrNoSpace)
}

func TestCapsRecordedAndUsedWhenFull(t *testing.T) {
	dir := t.TempDir()
	ctx := context.Background()
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	p, err := Open(ctx, dir, log)
	if err != nil {
		t.Fatal(err)
	}
	probed := p.Caps()
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(dir, capsFile))
	if err != nil {
		t.Fatalf("no %s after the first open: %v", capsFile, err)
	}
	var rec capsRecord
	if err := json.Unmarshal(b, &rec); err != nil || rec.Caps != probed || rec.ProbedAt.IsZero() {
		t.Fatalf("%s = %s (%v), want the probe's %+v with its time", capsFile, b, err, probed)
	}

	open := func(name string) (*Pool, error) {
		osfs, err := storage.OpenOS(dir)
		if err != nil {
			t.Fatal(err)
		}
		return OpenWith(ctx, dir, Options{Logger: log, FS: &fullFS{FS: osfs, name: name}})
	}
	t.Run("full pool opens with the record", func(t *testing.T) {
		p, err := open(probed.Filesystem)
		if err != nil {
			t.Fatal(err)
		}
		defer p.Close()
		if p.Caps() != probed {
			t.Fatalf("caps %+v, want the record's %+v", p.Caps(), probed)
		}
	})
	t.Run("a record of another filesystem does not stand in", func(t *testing.T) {
		p, err := open("btrfs-elsewhere")
		if err == nil {
			p.Close()
			t.Fatal("opened with the record of another filesystem")
		}
		if !strings.Contains(err.Error(), "free some space") {
			t.Fatalf("error %q does not say what to do", err)
		}
	})
	t.Run("no record, no open", func(t *testing.T) {
		if err := os.Remove(filepath.Join(dir, capsFile)); err != nil {
			t.Fatal(err)
		}
		p, err := open(probed.Filesystem)
		if err == nil {
			p.Close()
			t.Fatal("a full pool without a record opened")
		}
		if !strings.Contains(err.Error(), "free some space") {
			t.Fatalf("error %q does not say what to do", err)
		}
	})
	t.Run("a malformed record does not stand in, and a probe replaces it", func(t *testing.T) {
		if err := os.WriteFile(filepath.Join(dir, capsFile), []byte(`{"kind":"PoolCapabilities","version":1,"caps":{"reflink":"yes"}}`), 0o600); err != nil {
			t.Fatal(err)
		}
		if p, err := open(probed.Filesystem); err == nil {
			p.Close()
			t.Fatal("opened with a malformed record")
		}
		p, err := Open(ctx, dir, log)
		if err != nil {
			t.Fatal(err)
		}
		p.Close()
		b, _ := os.ReadFile(filepath.Join(dir, capsFile))
		if err := json.Unmarshal(b, &rec); err != nil || rec.Caps != probed {
			t.Fatalf("%s after a probe: %s (%v)", capsFile, b, err)
		}
	})
}
