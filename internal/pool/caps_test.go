package pool

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/quiverstorage/quiver/internal/storage"
	"github.com/quiverstorage/quiver/internal/testfs"
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

// probeFS is a pool's filesystem whose probe answers otherwise than the
// real one: answer rewrites what the real probe found.
type probeFS struct {
	storage.FS
	answer func(storage.Caps) (storage.Caps, error)
}

func (f *probeFS) Probe(rel string) (storage.Caps, error) {
	caps, err := f.FS.Probe(rel)
	if err != nil {
		return caps, err
	}
	return f.answer(caps)
}

// reflinkUnknown is a probe whose clone failed with errno, as fscap.Probe
// reports it: reflink unknown, the rest as found.
func reflinkUnknown(errno unix.Errno) func(storage.Caps) (storage.Caps, error) {
	return func(c storage.Caps) (storage.Caps, error) {
		c.Reflink = false
		cause := storage.Classify(&os.PathError{Op: "reflink", Path: ".probe-src", Err: errno})
		return c, fmt.Errorf("probe staging: %w", &storage.ProbeError{Unknown: storage.Caps{Reflink: true}, Err: cause})
	}
}

// reflinkAbsent is a probe that found no reflink.
func reflinkAbsent(c storage.Caps) (storage.Caps, error) {
	c.Reflink = false
	return c, nil
}

// openProbed opens the pool at dir with its probe answering through answer.
func openProbed(t *testing.T, dir string, answer func(storage.Caps) (storage.Caps, error)) (*Pool, error) {
	t.Helper()
	osfs, err := storage.OpenOS(dir)
	if err != nil {
		t.Fatal(err)
	}
	return OpenWith(context.Background(), dir, Options{Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
		FS: &probeFS{FS: osfs, answer: answer}})
}

// readCapsFile returns caps.json of the pool at dir, "" when there is none.
func readCapsFile(t *testing.T, dir string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, capsFile))
	if errors.Is(err, fs.ErrNotExist) {
		return ""
	}
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// TestProbeFailureKeepsTheUnshareGuard is defect 6 of issue 29: on a pool
// on XFS whose caps.json records reflink, a probe whose clone fails with a
// transient error (or even one that finds no reflink) leaves reflink on,
// and with it the unshare guard and the chunks; caps.json is not lowered.
// Before, the probe's "no reflink" was taken and recorded, and the pool
// opened without the guard while its files still shared extents.
func TestProbeFailureKeepsTheUnshareGuard(t *testing.T) {
	dir := filepath.Join(testfs.MountXFS(t, 300<<20), "pool")
	p := openTestPool(t, dir)
	if !p.Caps().Reflink || p.us == nil {
		t.Fatalf("a pool on a reflink XFS: caps %+v, unshare guard %v", p.Caps(), p.us != nil)
	}
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	recorded := readCapsFile(t, dir)
	for _, tc := range []struct {
		name   string
		answer func(storage.Caps) (storage.Caps, error)
	}{
		{"clone fails with EIO", reflinkUnknown(unix.EIO)},
		{"clone fails with ENOMEM", reflinkUnknown(unix.ENOMEM)},
		{"the probe finds no reflink", reflinkAbsent},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, err := openProbed(t, dir, tc.answer)
			if err != nil {
				t.Fatalf("open: %v", err)
			}
			defer p.Close()
			if !p.Caps().Reflink || p.us == nil || p.chunk != ChunkSize {
				t.Errorf("caps %+v, unshare guard %v, chunk %d: want reflink kept, the guard on, chunks of %d",
					p.Caps(), p.us != nil, p.chunk, ChunkSize)
			}
			if got := readCapsFile(t, dir); got != recorded {
				t.Errorf("%s changed:\n%s\nwas\n%s", capsFile, got, recorded)
			}
		})
	}
}

// TestProbeFailureOnANewPool: what a probe cannot tell is never recorded,
// nor served, as absent. A new pool whose probe cannot tell reflink does
// not open (the error says what failed and what to do) and writes no
// caps.json; the next open, whose probe works, records what it finds. The
// other cases are the rest of probeCaps's rules, on the test's temporary
// directory.
func TestProbeFailureOnANewPool(t *testing.T) {
	dir := t.TempDir()
	p, err := openProbed(t, dir, reflinkUnknown(unix.EIO))
	if err == nil {
		p.Close()
		t.Fatalf("a new pool opened with reflink unknown (caps %+v)", p.Caps())
	}
	if msg := err.Error(); !errors.Is(err, unix.EIO) || !strings.Contains(msg, "reflink") || !strings.Contains(msg, "open the pool again") {
		t.Errorf("error %q does not say what failed and what to do", msg)
	}
	if got := readCapsFile(t, dir); got != "" {
		t.Fatalf("%s written by a probe that could not tell reflink:\n%s", capsFile, got)
	}
	p = openTestPool(t, dir)
	probed := p.Caps()
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	if readCapsFile(t, dir) == "" {
		t.Fatalf("no %s after an open whose probe worked", capsFile)
	}

	writeRecord := func(c storage.Caps) string {
		b, err := json.Marshal(capsRecord{Kind: "PoolCapabilities", Version: 1, ProbedAt: time.Now().UTC(), Caps: c})
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, capsFile), b, 0o600); err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	withReflink := probed
	withReflink.Reflink = true
	withoutReflink := probed
	withoutReflink.Reflink = false
	moved := storage.Caps{Filesystem: "xfs-before-the-move", Reflink: true, ExtentSizeHint: true}
	if probed.Filesystem == moved.Filesystem {
		t.Fatal("the test's moved-from filesystem is the real one")
	}
	for _, tc := range []struct {
		name     string
		record   storage.Caps
		answer   func(storage.Caps) (storage.Caps, error)
		opens    bool
		want     storage.Caps
		rewrites bool // caps.json becomes want
	}{
		{"a recorded answer stands in for an unknown one", probed, reflinkUnknown(unix.EAGAIN), true, probed, false},
		{"a recorded capability is kept when the probe cannot tell", withReflink, reflinkUnknown(unix.EIO), true, withReflink, false},
		{"a recorded capability is kept when the probe finds it absent", withReflink, reflinkAbsent, true, withReflink, false},
		{"a record of another filesystem is replaced by a probe that tells all", moved, reflinkAbsent, true, withoutReflink, true},
		{"a record of another filesystem does not stand in for an unknown", moved, reflinkUnknown(unix.EIO), false, storage.Caps{}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := writeRecord(tc.record)
			p, err := openProbed(t, dir, tc.answer)
			if err != nil {
				if tc.opens {
					t.Fatalf("open: %v", err)
				}
				if got := readCapsFile(t, dir); got != before {
					t.Errorf("a refused open changed %s:\n%s", capsFile, got)
				}
				return
			}
			p.Close()
			if !tc.opens {
				t.Fatalf("opened with caps %+v, want a refusal", p.Caps())
			}
			if p.Caps() != tc.want {
				t.Errorf("caps %+v, want %+v", p.Caps(), tc.want)
			}
			after := readCapsFile(t, dir)
			var rec capsRecord
			if err := json.Unmarshal([]byte(after), &rec); err != nil {
				t.Fatalf("%s: %v", capsFile, err)
			}
			if tc.rewrites && rec.Caps != tc.want || !tc.rewrites && after != before {
				t.Errorf("%s after the open:\n%s\nbefore:\n%s", capsFile, after, before)
			}
		})
	}
}
