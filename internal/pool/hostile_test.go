package pool

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/quiverstorage/quiver/internal/testfs"
)

// hostileEnv is a pool with two volumes, "good" and "v2" (a snapshot "s1"
// and an attachment), closed, beside a victim directory outside the pool
// that nothing quiver does may change.
type hostileEnv struct {
	base, pool, victim string
	v2                 string // the pool's directory of volume v2
}

func (e *hostileEnv) path(rel string) string  { return filepath.Join(e.pool, rel) }
func (e *hostileEnv) vpath(rel string) string { return filepath.Join(e.v2, rel) }

// hostileSpec is a small volume: two disks of 1 MiB.
func hostileSpec(name string) VolumeSpec {
	return VolumeSpec{Name: name, Capacity: 8 * mib,
		Disks: []DiskSpec{{Name: "root", Size: mib}, {Name: "data", Size: mib}}}
}

// newHostileEnv copies the template (newHostileTemplate) for one case.
func newHostileEnv(t *testing.T, template string) *hostileEnv {
	t.Helper()
	base := t.TempDir()
	// Copied here, not by cp(1): a forked child holds this process's pool
	// locks until it execs, which makes a parallel case's reopen fail.
	copyExact(t, template, base)
	e := &hostileEnv{base: base, pool: filepath.Join(base, "pool"), victim: filepath.Join(base, "victim")}
	e.v2 = filepath.Join(e.pool, "volumes", "v2")
	return e
}

// newHostileTemplate makes, once for all cases, the pool and the victim.
// The victim holds a copy of v2's directory (for links to "a volume"),
// loose files and a directory of images (what orphan reclaim would delete).
func newHostileTemplate(t *testing.T) string {
	t.Helper()
	base := t.TempDir()
	e := &hostileEnv{base: base, pool: filepath.Join(base, "pool"), victim: filepath.Join(base, "victim")}
	e.v2 = filepath.Join(e.pool, "volumes", "v2")
	buildHostile(t, e)
	return base
}

func buildHostile(t testing.TB, e *hostileEnv) {
	p, err := Open(context.Background(), e.pool, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for _, n := range []string{"good", "v2"} {
		if _, _, err := p.Create(ctx, hostileSpec(n)); err != nil {
			t.Fatal(err)
		}
		v, _ := p.Volume(n)
		d, err := v.OpenDisk("root")
		if err != nil {
			t.Fatal(err)
		}
		if err := d.WriteAt([]byte("data of "+n), 0, true); err != nil {
			t.Fatal(err)
		}
		_ = d.Close()
	}
	v2, _ := p.Volume("v2")
	if _, _, err := v2.CreateSnapshot(ctx, "s1", nil); err != nil {
		t.Fatal(err)
	}
	if _, _, err := v2.Attach("node-a", ModeReadWrite); err != nil {
		t.Fatal(err)
	}
	_ = p.Close()

	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(os.MkdirAll(filepath.Join(e.victim, "dir", "sub"), 0o755))
	must(os.WriteFile(filepath.Join(e.victim, "e"), []byte("victim file e"), 0o644))
	must(os.WriteFile(filepath.Join(e.victim, "disk.img"), bytes.Repeat([]byte("v"), 4096), 0o644))
	must(os.WriteFile(filepath.Join(e.victim, "dir", "a.img"), []byte("victim image a"), 0o644))
	must(os.WriteFile(filepath.Join(e.victim, "dir", "sub", "b.txt"), []byte("victim b"), 0o644))
	must(os.WriteFile(filepath.Join(e.victim, "pool.json"), mustRead(t, e.path("pool.json")), 0o644))
	copyTree(t, e.v2, filepath.Join(e.victim, "vol"))
}

func mustRead(t testing.TB, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// copyTree copies a directory of directories and regular files; images
// become 4 KiB stand-ins, which is all a link to them needs.
func copyTree(t testing.TB, src, dst string) {
	t.Helper()
	err := filepath.WalkDir(src, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(src, p)
		to := filepath.Join(dst, rel)
		if d.IsDir() {
			return os.MkdirAll(to, 0o755)
		}
		if strings.HasSuffix(p, ".img") {
			return os.WriteFile(to, bytes.Repeat([]byte("i"), 4096), 0o644)
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		return os.WriteFile(to, b, 0o644)
	})
	if err != nil {
		t.Fatal(err)
	}
}

// copyExact copies a tree of directories and regular files with their
// permissions.
func copyExact(t testing.TB, src, dst string) {
	t.Helper()
	err := filepath.WalkDir(src, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(src, p)
		to := filepath.Join(dst, rel)
		fi, err := d.Info()
		if err != nil {
			return err
		}
		if d.IsDir() {
			if err := os.MkdirAll(to, 0o755); err != nil {
				return err
			}
			return os.Chmod(to, fi.Mode().Perm())
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		return os.WriteFile(to, b, fi.Mode().Perm())
	})
	if err != nil {
		t.Fatal(err)
	}
}

// editJSON rewrites the JSON file at path through edit.
func editJSON(t *testing.T, path string, edit func(m map[string]any)) {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal(mustRead(t, path), &m); err != nil {
		t.Fatal(err)
	}
	edit(m)
	b, err := json.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
}

// setDiskName sets the name of the first disk of a manifest.
func setDiskName(name string) func(map[string]any) {
	return func(m map[string]any) { m["disks"].([]any)[0].(map[string]any)["name"] = name }
}

func replaceWithLink(t *testing.T, path, target string) {
	t.Helper()
	if err := os.RemoveAll(path); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(target, path); err != nil {
		t.Fatal(err)
	}
}

func replaceWithHardLink(t *testing.T, path, target string) {
	t.Helper()
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	if err := os.Link(target, path); err != nil {
		t.Fatal(err)
	}
}

func writeRollbackRecord(t *testing.T, e *hostileEnv, staging string) {
	t.Helper()
	b, _ := json.Marshal(rollbackRecord{Snapshot: "s1", Staging: staging})
	if err := os.WriteFile(e.vpath(rollbackRecordName), b, 0o644); err != nil {
		t.Fatal(err)
	}
}

// TestHostileFiles plants a hostile or damaged file at every level of the
// pool's layout, then starts the pool and runs every operation on the
// volumes: nothing outside the pool may change, the damaged volume must be
// listed as broken (or the whole pool refused, when the damage is in the
// pool's own layout), and the healthy volume must keep working.
func TestHostileFiles(t *testing.T) {
	long := strings.Repeat("a", 64)
	tests := []struct {
		name   string
		mutate func(t *testing.T, e *hostileEnv)
		want   string // "refused": Open fails; "broken": v2 quarantined; "healthy": v2 served
	}{
		// The pool's own layout.
		{"volumes is a link", func(t *testing.T, e *hostileEnv) {
			copyTree(t, e.path("volumes"), filepath.Join(e.victim, "volumes"))
			replaceWithLink(t, e.path("volumes"), filepath.Join(e.victim, "volumes"))
		}, "refused"},
		{"staging is a link", func(t *testing.T, e *hostileEnv) {
			replaceWithLink(t, e.path("staging"), filepath.Join(e.victim, "dir"))
		}, "refused"},
		{"pool.json is a link", func(t *testing.T, e *hostileEnv) {
			replaceWithLink(t, e.path("pool.json"), filepath.Join(e.victim, "pool.json"))
		}, "refused"},
		{"pool.lock is a link", func(t *testing.T, e *hostileEnv) {
			replaceWithLink(t, e.path(lockFile), filepath.Join(e.victim, "e"))
		}, "refused"},
		{"pool.lock is a hard link", func(t *testing.T, e *hostileEnv) {
			replaceWithHardLink(t, e.path(lockFile), filepath.Join(e.victim, "e"))
		}, "refused"},
		{"staging entry is a link to a directory", func(t *testing.T, e *hostileEnv) {
			if err := os.Symlink(filepath.Join(e.victim, "dir"), e.path("staging/vol-0123")); err != nil {
				t.Fatal(err)
			}
		}, "healthy"},
		{"staging entry holds links", func(t *testing.T, e *hostileEnv) {
			d := e.path("staging/rb-0123")
			if err := os.MkdirAll(d, 0o755); err != nil {
				t.Fatal(err)
			}
			for n, target := range map[string]string{"root.img": filepath.Join(e.victim, "e"), "disks": filepath.Join(e.victim, "dir")} {
				if err := os.Symlink(target, filepath.Join(d, n)); err != nil {
					t.Fatal(err)
				}
			}
		}, "healthy"},
		{"temporary file in the pool is a link", func(t *testing.T, e *hostileEnv) {
			if err := os.Symlink(filepath.Join(e.victim, "e"), e.path(".tmp-pool.json-1")); err != nil {
				t.Fatal(err)
			}
		}, "healthy"},

		// A volume's directories and files.
		{"volume directory is a link", func(t *testing.T, e *hostileEnv) {
			replaceWithLink(t, e.v2, filepath.Join(e.victim, "vol"))
		}, "broken"},
		{"disks is a link", func(t *testing.T, e *hostileEnv) {
			replaceWithLink(t, e.vpath("disks"), filepath.Join(e.victim, "dir"))
		}, "broken"},
		{"snapshots is a link", func(t *testing.T, e *hostileEnv) {
			replaceWithLink(t, e.vpath("snapshots"), filepath.Join(e.victim, "vol", "snapshots"))
		}, "broken"},
		{"disk image is a link", func(t *testing.T, e *hostileEnv) {
			replaceWithLink(t, e.vpath("disks/root.img"), filepath.Join(e.victim, "disk.img"))
		}, "broken"},
		{"disk image is a relative link", func(t *testing.T, e *hostileEnv) {
			replaceWithLink(t, e.vpath("disks/root.img"), "../../../../victim/disk.img")
		}, "broken"},
		{"disk image is a hard link", func(t *testing.T, e *hostileEnv) {
			replaceWithHardLink(t, e.vpath("disks/root.img"), filepath.Join(e.victim, "disk.img"))
		}, "broken"},
		{"disk image is a FIFO", func(t *testing.T, e *hostileEnv) {
			if err := os.Remove(e.vpath("disks/root.img")); err != nil {
				t.Fatal(err)
			}
			if err := unix.Mkfifo(e.vpath("disks/root.img"), 0o644); err != nil {
				t.Fatal(err)
			}
		}, "broken"},
		{"disk image is missing", func(t *testing.T, e *hostileEnv) {
			if err := os.Remove(e.vpath("disks/root.img")); err != nil {
				t.Fatal(err)
			}
		}, "broken"},
		{"orphan image is a link", func(t *testing.T, e *hostileEnv) {
			if err := os.Symlink(filepath.Join(e.victim, "e"), e.vpath("disks/orphan.img")); err != nil {
				t.Fatal(err)
			}
		}, "healthy"},
		{"orphan entry is a link to a directory", func(t *testing.T, e *hostileEnv) {
			if err := os.Symlink(filepath.Join(e.victim, "dir"), e.vpath("disks/orphan")); err != nil {
				t.Fatal(err)
			}
		}, "healthy"},
		{"volume.json is a link", func(t *testing.T, e *hostileEnv) {
			replaceWithLink(t, e.vpath("volume.json"), filepath.Join(e.victim, "vol", "volume.json"))
		}, "broken"},
		{"volume.json is a directory", func(t *testing.T, e *hostileEnv) {
			if err := os.Remove(e.vpath("volume.json")); err != nil {
				t.Fatal(err)
			}
			if err := os.Mkdir(e.vpath("volume.json"), 0o755); err != nil {
				t.Fatal(err)
			}
		}, "broken"},
		{"volume.json is missing", func(t *testing.T, e *hostileEnv) {
			if err := os.Remove(e.vpath("volume.json")); err != nil {
				t.Fatal(err)
			}
		}, "broken"},
		{"attachments.json is a link", func(t *testing.T, e *hostileEnv) {
			replaceWithLink(t, e.vpath(attachmentsFile), filepath.Join(e.victim, "vol", attachmentsFile))
		}, "broken"},
		{"rollback.json is a link", func(t *testing.T, e *hostileEnv) {
			if err := os.Symlink(filepath.Join(e.victim, "e"), e.vpath(rollbackRecordName)); err != nil {
				t.Fatal(err)
			}
		}, "broken"},
		{"snapshot directory is a link", func(t *testing.T, e *hostileEnv) {
			replaceWithLink(t, e.vpath("snapshots/s1"), filepath.Join(e.victim, "vol", "snapshots", "s1"))
		}, "broken"},
		{"snapshot.json is a link", func(t *testing.T, e *hostileEnv) {
			replaceWithLink(t, e.vpath("snapshots/s1/snapshot.json"), filepath.Join(e.victim, "vol", "snapshots", "s1", "snapshot.json"))
		}, "broken"},
		{"snapshot image is a link", func(t *testing.T, e *hostileEnv) {
			replaceWithLink(t, e.vpath("snapshots/s1/root.img"), filepath.Join(e.victim, "disk.img"))
		}, "broken"},
		{"snapshot image is a hard link", func(t *testing.T, e *hostileEnv) {
			replaceWithHardLink(t, e.vpath("snapshots/s1/root.img"), filepath.Join(e.victim, "disk.img"))
		}, "broken"},
		{"snapshot without snapshot.json", func(t *testing.T, e *hostileEnv) {
			if err := os.Remove(e.vpath("snapshots/s1/snapshot.json")); err != nil {
				t.Fatal(err)
			}
		}, "broken"},

		// Names in volume.json.
		{"volume.json disk name climbs out", func(t *testing.T, e *hostileEnv) {
			editJSON(t, e.vpath("volume.json"), setDiskName("../../../../../victim/e"))
		}, "broken"},
		{"volume.json disk name is absolute", func(t *testing.T, e *hostileEnv) {
			editJSON(t, e.vpath("volume.json"), setDiskName(filepath.Join(e.victim, "e")))
		}, "broken"},
		{"volume.json disk name is empty", func(t *testing.T, e *hostileEnv) {
			editJSON(t, e.vpath("volume.json"), setDiskName(""))
		}, "broken"},
		{"volume.json disk name is too long", func(t *testing.T, e *hostileEnv) {
			editJSON(t, e.vpath("volume.json"), setDiskName(long))
		}, "broken"},
		{"volume.json names another volume", func(t *testing.T, e *hostileEnv) {
			editJSON(t, e.vpath("volume.json"), func(m map[string]any) { m["name"] = "../good" })
		}, "broken"},
		{"volume.json source climbs out", func(t *testing.T, e *hostileEnv) {
			editJSON(t, e.vpath("volume.json"), func(m map[string]any) {
				m["source"] = map[string]any{"volume": "../../victim"}
			})
		}, "broken"},
		{"volume.json duplicate disk", func(t *testing.T, e *hostileEnv) {
			editJSON(t, e.vpath("volume.json"), setDiskName("data"))
		}, "broken"},
		{"volume.json unknown version", func(t *testing.T, e *hostileEnv) {
			editJSON(t, e.vpath("volume.json"), func(m map[string]any) { m["version"] = 2 })
		}, "broken"},
		{"volume.json unknown field", func(t *testing.T, e *hostileEnv) {
			editJSON(t, e.vpath("volume.json"), func(m map[string]any) { m["path"] = "/victim" })
		}, "broken"},
		{"volume.json truncated", func(t *testing.T, e *hostileEnv) {
			b := mustRead(t, e.vpath("volume.json"))
			if err := os.WriteFile(e.vpath("volume.json"), b[:len(b)/2], 0o644); err != nil {
				t.Fatal(err)
			}
		}, "broken"},
		{"volume.json empty", func(t *testing.T, e *hostileEnv) {
			if err := os.WriteFile(e.vpath("volume.json"), nil, 0o644); err != nil {
				t.Fatal(err)
			}
		}, "broken"},
		{"volume.json garbage", func(t *testing.T, e *hostileEnv) {
			if err := os.WriteFile(e.vpath("volume.json"), []byte("\x00\xffnot json{{"), 0o644); err != nil {
				t.Fatal(err)
			}
		}, "broken"},
		{"volume.json with trailing data", func(t *testing.T, e *hostileEnv) {
			b := append(mustRead(t, e.vpath("volume.json")), []byte(`{"kind":"Volume"}`)...)
			if err := os.WriteFile(e.vpath("volume.json"), b, 0o644); err != nil {
				t.Fatal(err)
			}
		}, "broken"},

		// Names in snapshot.json.
		{"snapshot.json disk name climbs out", func(t *testing.T, e *hostileEnv) {
			editJSON(t, e.vpath("snapshots/s1/snapshot.json"), setDiskName("../../disks/root"))
		}, "broken"},
		{"snapshot.json disk name is absolute", func(t *testing.T, e *hostileEnv) {
			editJSON(t, e.vpath("snapshots/s1/snapshot.json"), setDiskName(filepath.Join(e.victim, "disk")))
		}, "broken"},
		{"snapshot.json name is empty", func(t *testing.T, e *hostileEnv) {
			editJSON(t, e.vpath("snapshots/s1/snapshot.json"), func(m map[string]any) { m["name"] = "" })
		}, "broken"},
		{"snapshot.json disk name is too long", func(t *testing.T, e *hostileEnv) {
			editJSON(t, e.vpath("snapshots/s1/snapshot.json"), setDiskName(long))
		}, "broken"},
		{"snapshot.json unknown version", func(t *testing.T, e *hostileEnv) {
			editJSON(t, e.vpath("snapshots/s1/snapshot.json"), func(m map[string]any) { m["version"] = 99 })
		}, "broken"},
		{"snapshot.json garbage", func(t *testing.T, e *hostileEnv) {
			if err := os.WriteFile(e.vpath("snapshots/s1/snapshot.json"), []byte("]]"), 0o644); err != nil {
				t.Fatal(err)
			}
		}, "broken"},

		// attachments.json.
		{"attachments.json node climbs out", func(t *testing.T, e *hostileEnv) {
			editJSON(t, e.vpath(attachmentsFile), func(m map[string]any) {
				m["attachments"].([]any)[0].(map[string]any)["node"] = "../../victim"
			})
		}, "broken"},
		{"attachments.json node is empty", func(t *testing.T, e *hostileEnv) {
			editJSON(t, e.vpath(attachmentsFile), func(m map[string]any) {
				m["attachments"].([]any)[0].(map[string]any)["node"] = ""
			})
		}, "broken"},
		{"attachments.json node is too long", func(t *testing.T, e *hostileEnv) {
			editJSON(t, e.vpath(attachmentsFile), func(m map[string]any) {
				m["attachments"].([]any)[0].(map[string]any)["node"] = strings.Repeat("n", 254)
			})
		}, "broken"},
		{"attachments.json unknown version", func(t *testing.T, e *hostileEnv) {
			editJSON(t, e.vpath(attachmentsFile), func(m map[string]any) { m["version"] = 7 })
		}, "broken"},
		{"attachments.json truncated", func(t *testing.T, e *hostileEnv) {
			b := mustRead(t, e.vpath(attachmentsFile))
			if err := os.WriteFile(e.vpath(attachmentsFile), b[:len(b)-3], 0o600); err != nil {
				t.Fatal(err)
			}
		}, "broken"},

		// rollback.json.
		{"rollback.json staging climbs out", func(t *testing.T, e *hostileEnv) {
			writeRollbackRecord(t, e, "../../victim/dir")
		}, "broken"},
		{"rollback.json staging is absolute", func(t *testing.T, e *hostileEnv) {
			writeRollbackRecord(t, e, filepath.Join(e.victim, "dir"))
		}, "broken"},
		{"rollback.json staging is empty", func(t *testing.T, e *hostileEnv) {
			writeRollbackRecord(t, e, "")
		}, "broken"},
		{"rollback.json staging is a link", func(t *testing.T, e *hostileEnv) {
			if err := os.Symlink(filepath.Join(e.victim, "vol", "disks"), e.path("staging/rb-0123")); err != nil {
				t.Fatal(err)
			}
			writeRollbackRecord(t, e, "rb-0123")
		}, "broken"},
		{"rollback.json garbage", func(t *testing.T, e *hostileEnv) {
			if err := os.WriteFile(e.vpath(rollbackRecordName), []byte(`{"snapshot":`), 0o644); err != nil {
				t.Fatal(err)
			}
		}, "broken"},
	}
	template := newHostileTemplate(t)
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			e := newHostileEnv(t, template)
			tt.mutate(t, e)
			before := testfs.TreeSum(t, e.victim)
			checkVictim := func(when string) {
				t.Helper()
				if after := testfs.TreeSum(t, e.victim); after != before {
					t.Fatalf("%s: the victim directory outside the pool changed", when)
				}
			}
			p, err := Open(context.Background(), e.pool, slog.New(slog.NewTextHandler(io.Discard, nil)))
			checkVictim("after start-up")
			if tt.want == "refused" {
				if err == nil {
					p.Close()
					t.Fatal("the pool opened; want it refused")
				}
				if !errors.Is(err, ErrHostile) && !errors.Is(err, ErrNotPool) {
					t.Logf("refused with: %v", err)
				}
				return
			}
			if err != nil {
				t.Fatalf("open: %v", err)
			}
			defer p.Close()
			readVolume(t, p, "good")
			checkVictim("after reading the healthy volume")
			if tt.want == "broken" {
				checkBroken(t, p, "v2")
			} else {
				exerciseVolume(t, p, "v2")
			}
			checkVictim("after operations on v2")
			_ = p.Close()
			p2, err := Open(context.Background(), e.pool, slog.New(slog.NewTextHandler(io.Discard, nil)))
			checkVictim("after a second start")
			if err != nil {
				t.Fatalf("second open: %v", err)
			}
			defer p2.Close()
			readVolume(t, p2, "good")
		})
	}
	if len(tests) < 25 {
		t.Fatalf("%d cases; the suite promises at least 25", len(tests))
	}
}

// readVolume checks that a healthy volume serves its data.
func readVolume(t *testing.T, p *Pool, name string) {
	t.Helper()
	v, err := p.Volume(name)
	if err != nil {
		t.Fatal(err)
	}
	if info := v.Info(); info.Broken != "" {
		t.Fatalf("%s is broken: %s", name, info.Broken)
	}
	d, err := v.OpenDisk("root")
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	buf := make([]byte, len("data of "+name))
	if err := d.ReadAt(buf, 0); err != nil || string(buf) != "data of "+name {
		t.Fatalf("%s: read %q, %v", name, buf, err)
	}
}

// exerciseVolume runs every kind of operation on a healthy volume.
func exerciseVolume(t *testing.T, p *Pool, name string) {
	t.Helper()
	ctx := context.Background()
	v, err := p.Volume(name)
	if err != nil {
		t.Fatal(err)
	}
	if info := v.Info(); info.Broken != "" {
		t.Fatalf("%s is broken: %s", name, info.Broken)
	}
	d, err := v.OpenDisk("root")
	if err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, len("data of "+name))
	if err := d.ReadAt(buf, 0); err != nil || string(buf) != "data of "+name {
		t.Fatalf("%s: read %q, %v", name, buf, err)
	}
	if err := d.WriteAt([]byte("more"), 4096, true); err != nil {
		t.Fatal(err)
	}
	_ = d.Close()
	for _, op := range []func() error{
		func() error { _, _, err := v.CreateSnapshot(ctx, "hs", nil); return err },
		func() error { _, err := v.AddDisk(ctx, DiskSpec{Name: "extra", Size: mib}); return err },
		func() error { _, err := v.GrowDisk(ctx, "extra", 2*mib); return err },
		func() error { _, err := v.Rollback(ctx, "hs", nil); return err },
		func() error {
			_, err := p.Clone(ctx, CloneRequest{Source: Source{Volume: name, Snapshot: "hs"}, Names: []string{name + "-c"}}, nil)
			return err
		},
		func() error { return p.Delete(ctx, name+"-c") },
		func() error { return v.DeleteSnapshot(ctx, "hs") },
	} {
		if err := op(); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
	}
}

// checkBroken checks that a volume is listed as broken with a reason and
// that every operation on it is refused with ErrBroken.
func checkBroken(t *testing.T, p *Pool, name string) {
	t.Helper()
	ctx := context.Background()
	var listed bool
	for _, info := range p.List(nil) {
		if info.Name == name {
			listed = true
			if info.Broken == "" {
				t.Fatalf("%s listed as healthy", name)
			}
		}
	}
	if !listed {
		t.Fatalf("%s not listed", name)
	}
	v, err := p.Volume(name)
	if err != nil {
		t.Fatal(err)
	}
	ops := map[string]func() error{
		"open disk":     func() error { _, err := v.OpenDisk("root"); return err },
		"open snapshot": func() error { _, err := v.OpenSnapshotDisk("s1", "root"); return err },
		"snapshot":      func() error { _, _, err := v.CreateSnapshot(ctx, "hs", nil); return err },
		"add disk":      func() error { _, err := v.AddDisk(ctx, DiskSpec{Name: "extra", Size: mib}); return err },
		"grow disk":     func() error { _, err := v.GrowDisk(ctx, "root", 16*mib); return err },
		"remove disk":   func() error { _, err := v.RemoveDisk(ctx, "root"); return err },
		"rollback":      func() error { _, err := v.Rollback(ctx, "s1", nil); return err },
		"update": func() error {
			c := int64(128 * mib)
			_, err := v.Update(ctx, Update{Capacity: &c})
			return err
		},
		"attach": func() error { _, _, err := v.Attach("node-b", ModeReadWrite); return err },
		"clone": func() error {
			_, err := p.Clone(ctx, CloneRequest{Source: Source{Volume: name}, Names: []string{"c1"}}, nil)
			return err
		},
		"delete": func() error { return p.Delete(ctx, name) },
		"create": func() error { _, _, err := p.Create(ctx, vm3(name)); return err },
	}
	for op, f := range ops {
		err := f()
		if op == "open snapshot" && errors.Is(err, ErrSnapshotNotFound) {
			continue // a broken volume lists no snapshots
		}
		if !errors.Is(err, ErrBroken) {
			t.Errorf("%s on broken %s: %v, want ErrBroken", op, name, err)
		}
	}
}

// TestManifestWritesNeverFollowALink: a volume directory swapped for a link
// to a directory outside the pool while the server runs does not receive
// the next manifest write; the change is refused.
func TestManifestWritesNeverFollowALink(t *testing.T) {
	base := t.TempDir()
	dir, outside := filepath.Join(base, "pool"), filepath.Join(base, "outside")
	p := openTestPool(t, dir)
	mustCreate(t, p, hostileSpec("web"))
	v, _ := p.Volume("web")
	if err := os.Rename(v.dir, outside); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(outside, v.dir); err != nil {
		t.Fatal(err)
	}
	before := testfs.TreeSum(t, outside)
	ctx := context.Background()
	if _, err := v.Update(ctx, Update{Labels: map[string]string{"a": "b"}}); !errors.Is(err, ErrHostile) {
		t.Errorf("update through a swapped link: %v, want ErrHostile", err)
	}
	if _, _, err := v.Attach("node-a", ModeReadWrite); !errors.Is(err, ErrHostile) {
		t.Errorf("attach through a swapped link: %v, want ErrHostile", err)
	}
	if _, err := v.AddDisk(ctx, DiskSpec{Name: "x", Size: mib}); err == nil {
		t.Error("add disk through a swapped link succeeded")
	}
	if testfs.TreeSum(t, outside) != before {
		t.Fatal("a write went through the link to the directory outside the pool")
	}
}
