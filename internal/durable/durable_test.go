package durable

import (
	"errors"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/quiverstorage/quiver/internal/faultio"
	"github.com/quiverstorage/quiver/internal/storage"
)

func openFS(t *testing.T, dir string) storage.FS {
	t.Helper()
	fsys, err := storage.OpenOS(dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { fsys.Close() })
	return fsys
}

func TestWriteFileReplacesAtomically(t *testing.T) {
	dir := t.TempDir()
	fsys := openFS(t, dir)
	for _, content := range []string{"one", "two, longer", "3"} {
		if err := WriteFile(fsys, "m.json", []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		got, err := os.ReadFile(filepath.Join(dir, "m.json"))
		if err != nil || string(got) != content {
			t.Fatalf("got %q, %v; want %q", got, err, content)
		}
	}
	entries, _ := os.ReadDir(dir)
	if len(entries) != 1 {
		t.Fatalf("temporary files left: %v", entries)
	}
}

func TestWriteFileMissingDirLeavesNothing(t *testing.T) {
	fsys := openFS(t, t.TempDir())
	if err := WriteFile(fsys, "no/x", []byte("x"), 0o600); err == nil || errors.Is(err, ErrUncertain) {
		t.Fatalf("missing directory: %v, want an error that is not ErrUncertain", err)
	}
}

func TestJSONRoundTripRefusesUnknownFields(t *testing.T) {
	p := filepath.Join(t.TempDir(), "v.json")
	type v1 struct{ A int }
	if err := WriteJSONPath(p, struct{ A, B int }{1, 2}); err != nil {
		t.Fatal(err)
	}
	var got v1
	if err := ReadJSON(p, &got); err == nil {
		t.Fatal("want error for unknown field B")
	}
	if err := WriteJSONPath(p, v1{A: 7}); err != nil {
		t.Fatal(err)
	}
	if err := ReadJSON(p, &got); err != nil || got.A != 7 {
		t.Fatalf("got %+v, %v", got, err)
	}
	if fi, err := os.Stat(p); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("mode %v, %v; want 0600", fi.Mode(), err)
	}
}

func TestIsTemp(t *testing.T) {
	for name, want := range map[string]bool{".tmp-volume.json-abc": true, "volume.json": false, "disk.img": false} {
		if IsTemp(name) != want {
			t.Errorf("IsTemp(%q) = %v", name, !want)
		}
	}
}

// TestDirSyncFailureIsUncertain: when the directory sync after the rename
// fails (the fault twin fails it), the error says the state is unknown
// (ErrUncertain, with the cause); failures before the rename are not
// uncertain (TestWriteFileMissingDirLeavesNothing, and a failed file sync
// below).
func TestDirSyncFailureIsUncertain(t *testing.T) {
	t.Run("WriteFile", func(t *testing.T) {
		dir := t.TempDir()
		fsys := faultio.New(openFS(t, dir))
		if err := WriteFile(fsys, "m.json", []byte("old"), 0o600); err != nil {
			t.Fatal(err)
		}
		fsys.FailDirSync(1, syscall.EIO)
		err := WriteFile(fsys, "m.json", []byte("new"), 0o600)
		if !errors.Is(err, ErrUncertain) || !errors.Is(err, syscall.EIO) || !errors.Is(err, storage.ErrIO) {
			t.Fatalf("WriteFile with a failing directory sync: %v, want ErrUncertain and EIO", err)
		}
	})
	t.Run("WriteFile, file sync fails", func(t *testing.T) {
		dir := t.TempDir()
		fsys := faultio.New(openFS(t, dir))
		if err := WriteFile(fsys, "m.json", []byte("old"), 0o600); err != nil {
			t.Fatal(err)
		}
		fsys.FailSync(1, syscall.EIO)
		err := WriteFile(fsys, "m.json", []byte("new"), 0o600)
		if err == nil || errors.Is(err, ErrUncertain) || !errors.Is(err, syscall.EIO) {
			t.Fatalf("WriteFile with a failing file sync: %v, want EIO and not ErrUncertain", err)
		}
		if b, _ := os.ReadFile(filepath.Join(dir, "m.json")); string(b) != "old" {
			t.Fatalf("content %q after a failed write, want the old", b)
		}
		if es, _ := os.ReadDir(dir); len(es) != 1 {
			t.Fatalf("temporary files left: %v", es)
		}
	})
	t.Run("Rename", func(t *testing.T) {
		dir := t.TempDir()
		if err := os.Mkdir(filepath.Join(dir, "a"), 0o755); err != nil {
			t.Fatal(err)
		}
		fsys := faultio.New(openFS(t, dir))
		fsys.FailDirSync(1, syscall.EIO)
		err := Rename(fsys, "a", "b")
		if !errors.Is(err, ErrUncertain) || !errors.Is(err, syscall.EIO) {
			t.Fatalf("Rename with a failing directory sync: %v, want ErrUncertain and EIO", err)
		}
	})
}

// TestWriteFileNeverFollowsALink: a directory of the root swapped for a link
// is refused, not written through.
func TestWriteFileNeverFollowsALink(t *testing.T) {
	base := t.TempDir()
	root, outside := filepath.Join(base, "root"), filepath.Join(base, "outside")
	for _, d := range []string{root, outside} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink(outside, filepath.Join(root, "dir")); err != nil {
		t.Fatal(err)
	}
	fsys := openFS(t, root)
	if err := WriteJSON(fsys, "dir/m.json", map[string]int{"a": 1}); !errors.Is(err, storage.ErrEscape) {
		t.Fatalf("write through a link: %v, want ErrEscape", err)
	}
	if es, _ := os.ReadDir(outside); len(es) != 0 {
		t.Fatalf("the write followed the link: %v", es)
	}
}

// TestCreateJSON: the file holds v as WriteJSON writes it, an existing file
// is refused and left as it was, and a directory swapped for a link is
// refused, not written through.
func TestCreateJSON(t *testing.T) {
	base := t.TempDir()
	root, outside := filepath.Join(base, "root"), filepath.Join(base, "outside")
	for _, d := range []string{root, outside} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	fsys := openFS(t, root)
	f, err := CreateJSON(fsys, "m.json", map[string]int{"a": 1})
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil { // no Sync here: the caller's sync points are the pool's (mutate-syncs)
		t.Fatal(err)
	}
	if err := WriteJSON(fsys, "w.json", map[string]int{"a": 1}); err != nil {
		t.Fatal(err)
	}
	got, _ := os.ReadFile(filepath.Join(root, "m.json"))
	want, _ := os.ReadFile(filepath.Join(root, "w.json"))
	if string(got) != string(want) {
		t.Fatalf("CreateJSON wrote %q, WriteJSON %q", got, want)
	}
	if st, err := os.Stat(filepath.Join(root, "m.json")); err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("mode %v (%v), want 0600", st.Mode(), err)
	}
	if _, err := CreateJSON(fsys, "m.json", map[string]int{"b": 2}); !errors.Is(err, os.ErrExist) {
		t.Fatalf("create over an existing file: %v, want ErrExist", err)
	}
	if b, _ := os.ReadFile(filepath.Join(root, "m.json")); string(b) != string(want) {
		t.Fatalf("the refused create changed the file: %q", b)
	}
	if err := os.Symlink(outside, filepath.Join(root, "dir")); err != nil {
		t.Fatal(err)
	}
	if _, err := CreateJSON(fsys, "dir/m.json", map[string]int{"a": 1}); !errors.Is(err, storage.ErrEscape) {
		t.Fatalf("create through a link: %v, want ErrEscape", err)
	}
	if es, _ := os.ReadDir(outside); len(es) != 0 {
		t.Fatalf("the create followed the link: %v", es)
	}
}
