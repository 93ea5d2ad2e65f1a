package pool

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/quiverstorage/quiver/internal/testfs"
)

func quiet() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// TestOpenRefusesWhatIsNotAPool: a directory without pool.json becomes a new
// pool only when it is empty (or absent); a pool that lost pool.json, or a
// directory holding anything else, is refused.
func TestOpenRefusesWhatIsNotAPool(t *testing.T) {
	tests := []struct {
		name    string
		prepare func(t *testing.T, dir string)
		opts    Options
		want    error // nil: a new pool opens
	}{
		{"absent directory", func(t *testing.T, dir string) {}, Options{}, nil},
		{"empty directory", func(t *testing.T, dir string) { mkdir(t, dir) }, Options{}, nil},
		{"only an interrupted first start's leftovers", func(t *testing.T, dir string) {
			mkdir(t, dir)
			write(t, filepath.Join(dir, ".tmp-pool.json-1234"), "{")
			write(t, filepath.Join(dir, lockFile), "1\n")
		}, Options{}, nil},
		{"pool.json deleted", func(t *testing.T, dir string) {
			p, err := Open(context.Background(), dir, quiet())
			if err != nil {
				t.Fatal(err)
			}
			mustCreate(t, p, vm3("web"))
			p.Close()
			if err := os.Remove(filepath.Join(dir, "pool.json")); err != nil {
				t.Fatal(err)
			}
		}, Options{}, ErrNotPool},
		{"someone else's files", func(t *testing.T, dir string) {
			mkdir(t, dir)
			write(t, filepath.Join(dir, "notes.txt"), "mine")
		}, Options{}, ErrNotPool},
		{"pool.json of another kind", func(t *testing.T, dir string) {
			mkdir(t, dir)
			write(t, filepath.Join(dir, "pool.json"), `{"kind":"Volume","version":1,"id":"x","createdAt":"2026-01-01T00:00:00Z"}`)
		}, Options{}, ErrNotPool},
		{"empty directory with NoCreate", func(t *testing.T, dir string) { mkdir(t, dir) }, Options{NoCreate: true}, ErrNotPool},
		{"plain directory with ExpectMount", func(t *testing.T, dir string) { mkdir(t, dir) }, Options{ExpectMount: true}, ErrNotMounted},
		{"absent directory with ExpectMount", func(t *testing.T, dir string) {}, Options{ExpectMount: true}, ErrNotMounted},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "pool")
			tt.prepare(t, dir)
			before, _ := os.ReadDir(dir)
			tt.opts.Logger = quiet()
			p, err := OpenWith(context.Background(), dir, tt.opts)
			if tt.want == nil {
				if err != nil {
					t.Fatalf("open: %v", err)
				}
				p.Close()
				return
			}
			if err == nil {
				p.Close()
				t.Fatalf("opened; want %v", tt.want)
			}
			if !errors.Is(err, tt.want) && !(tt.want == ErrNotMounted && errors.Is(err, os.ErrNotExist)) {
				t.Fatalf("open: %v, want %v", err, tt.want)
			}
			if after, _ := os.ReadDir(dir); !sameNames(before, after) {
				t.Fatalf("a refused open changed the directory: %v -> %v", before, after)
			}
		})
	}
}

// TestOpenExpectMountOnAMountPoint: a real mount point passes --expect-mount.
func TestOpenExpectMountOnAMountPoint(t *testing.T) {
	mnt := testfs.MountTmpfs(t, 64<<20)
	p, err := OpenWith(context.Background(), mnt, Options{Logger: quiet(), ExpectMount: true})
	if err != nil {
		t.Fatal(err)
	}
	p.Close()
}

// TestInitRefusesAPool: `pool init` makes a pool only where there is none.
func TestInitRefusesAPool(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "pool")
	p, err := Init(context.Background(), dir, quiet())
	if err != nil {
		t.Fatal(err)
	}
	p.Close()
	if _, err := Init(context.Background(), dir, quiet()); !errors.Is(err, ErrExists) {
		t.Fatalf("second init: %v, want ErrExists", err)
	}
	other := t.TempDir()
	write(t, filepath.Join(other, "x"), "x")
	if _, err := Init(context.Background(), other, quiet()); !errors.Is(err, ErrNotPool) {
		t.Fatalf("init over other files: %v, want ErrNotPool", err)
	}
}

// TestOpenTwiceIsRefused: the pool's lock is held while the pool is open, a
// second open fails naming the holder and touches nothing, and the lock goes
// with Close.
func TestOpenTwiceIsRefused(t *testing.T) {
	dir := t.TempDir()
	p := openTestPool(t, dir)
	mustCreate(t, p, vm3("web"))
	leftover := filepath.Join(dir, "staging", "vol-0123")
	mkdir(t, leftover) // the running pool's work in progress
	_, err := Open(context.Background(), dir, quiet())
	if !errors.Is(err, ErrLocked) {
		t.Fatalf("second open: %v, want ErrLocked", err)
	}
	if !strings.Contains(err.Error(), fmt.Sprintf("process %d", os.Getpid())) {
		t.Fatalf("error does not name the holder's PID %d: %v", os.Getpid(), err)
	}
	if _, err := os.Stat(leftover); err != nil {
		t.Fatalf("the refused open touched staging: %v", err)
	}
	p.Close()
	p2, err := Open(context.Background(), dir, quiet())
	if err != nil {
		t.Fatalf("open after Close: %v", err)
	}
	p2.Close()
}

// TestReadOnlyPool: a pool without write permission is served read-only:
// disks read, writes and every change refused with ErrReadOnly, and nothing
// in the pool changed (staging is not wiped).
func TestReadOnlyPool(t *testing.T) {
	for _, how := range []string{"mode bits", "read-only mount"} {
		t.Run(how, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "pool")
			p := openTestPool(t, dir)
			mustCreate(t, p, vm3("web"))
			v, _ := p.Volume("web")
			writeDisk(t, v, "root", 0, []byte("hello"))
			if _, _, err := v.CreateSnapshot(context.Background(), "s1", nil); err != nil {
				t.Fatal(err)
			}
			p.Close()
			mkdir(t, filepath.Join(dir, "staging", "vol-0123"))
			open := dir
			switch how {
			case "mode bits":
				testfs.ReadOnlyTree(t, dir)
			case "read-only mount":
				open = readOnlyBind(t, dir)
			}
			before := testfs.TreeSum(t, dir)
			ro, err := Open(context.Background(), open, quiet())
			if err != nil {
				t.Fatal(err)
			}
			defer ro.Close()
			if !ro.ReadOnly() {
				t.Fatal("pool not detected read-only")
			}
			checkReadOnly(t, ro)
			ro.Close()
			if after := testfs.TreeSum(t, dir); after != before {
				t.Fatal("the read-only pool changed")
			}
		})
	}
}

func checkReadOnly(t *testing.T, p *Pool) {
	t.Helper()
	ctx := context.Background()
	v, err := p.Volume("web")
	if err != nil {
		t.Fatal(err)
	}
	d, err := v.OpenDisk("root")
	if err != nil {
		t.Fatalf("open disk of a read-only pool: %v", err)
	}
	defer d.Close()
	if !d.ReadOnly() {
		t.Error("disk handle of a read-only pool is not read-only")
	}
	buf := make([]byte, 5)
	if err := d.ReadAt(buf, 0); err != nil || string(buf) != "hello" {
		t.Fatalf("read %q, %v", buf, err)
	}
	sd, err := v.OpenSnapshotDisk("s1", "root")
	if err != nil {
		t.Fatal(err)
	}
	sd.Close()
	ops := map[string]func() error{
		"write":    func() error { return d.WriteAt([]byte("x"), 0, false) },
		"trim":     func() error { return d.Trim(0, 4096, false) },
		"zero":     func() error { return d.Zero(0, 4096, 0) },
		"create":   func() error { _, _, err := p.Create(ctx, vm3("new")); return err },
		"snapshot": func() error { _, _, err := v.CreateSnapshot(ctx, "s2", nil); return err },
		"add disk": func() error { _, err := v.AddDisk(ctx, DiskSpec{Name: "x", Size: mib}); return err },
		"grow":     func() error { _, err := v.GrowDisk(ctx, "root", 16*mib); return err },
		"rollback": func() error { _, err := v.Rollback(ctx, "s1", nil); return err },
		"clone": func() error {
			_, err := p.Clone(ctx, CloneRequest{Source: Source{Volume: "web", Snapshot: "s1"}, Names: []string{"c"}}, nil)
			return err
		},
		"delete snapshot": func() error { return v.DeleteSnapshot(ctx, "s1") },
		"attach":          func() error { _, _, err := v.Attach("node-a", ModeReadOnly); return err },
		"delete":          func() error { return p.Delete(ctx, "web") },
	}
	for name, op := range ops {
		if err := op(); !errors.Is(err, ErrReadOnly) {
			t.Errorf("%s on a read-only pool: %v, want ErrReadOnly", name, err)
		}
	}
}

// readOnlyBind bind-mounts dir read-only on a new directory and returns it.
func readOnlyBind(t *testing.T, dir string) string {
	t.Helper()
	testfs.RequireRoot(t)
	testfs.RequireTool(t, "mount")
	mnt := filepath.Join(t.TempDir(), "ro")
	mkdir(t, mnt)
	if out, err := exec.Command("mount", "--bind", "-o", "ro", dir, mnt).CombinedOutput(); err != nil {
		testfs.SkipOrFail(t, "mount --bind -o ro: %v: %s", err, out)
	}
	t.Cleanup(func() { _ = exec.Command("umount", mnt).Run() })
	if err := os.WriteFile(filepath.Join(mnt, "probe"), nil, 0o644); err == nil {
		t.Fatal("the read-only bind mount is writable")
	}
	return mnt
}

func sameNames(a, b []os.DirEntry) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i].Name() != b[i].Name() {
			return false
		}
	}
	return true
}

func mkdir(t *testing.T, dir string) {
	t.Helper()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
}

func write(t *testing.T, path, s string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(s), 0o644); err != nil {
		t.Fatal(err)
	}
}
