package durable

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
	"testing"
)

func TestWriteFileReplacesAtomically(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "m.json")
	for _, content := range []string{"one", "two, longer", "3"} {
		if err := WriteFile(p, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
		got, err := os.ReadFile(p)
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
	if err := WriteFile(filepath.Join(t.TempDir(), "no", "x"), []byte("x"), 0o644); err == nil || errors.Is(err, ErrUncertain) {
		t.Fatalf("missing directory: %v, want an error that is not ErrUncertain", err)
	}
}

func TestJSONRoundTripRefusesUnknownFields(t *testing.T) {
	p := filepath.Join(t.TempDir(), "v.json")
	type v1 struct{ A int }
	if err := WriteJSON(p, struct{ A, B int }{1, 2}); err != nil {
		t.Fatal(err)
	}
	var got v1
	if err := ReadJSON(p, &got); err == nil {
		t.Fatal("want error for unknown field B")
	}
	if err := WriteJSON(p, v1{A: 7}); err != nil {
		t.Fatal(err)
	}
	if err := ReadJSON(p, &got); err != nil || got.A != 7 {
		t.Fatalf("got %+v, %v", got, err)
	}
}

func TestIsTemp(t *testing.T) {
	for name, want := range map[string]bool{".tmp-volume.json-abc": true, "volume.json": false, "disk.img": false} {
		if IsTemp(name) != want {
			t.Errorf("IsTemp(%q) = %v", name, !want)
		}
	}
}

// failDirSync makes every directory sync fail with EIO for the rest of the
// test.
func failDirSync(t *testing.T) {
	old := syncDir
	t.Cleanup(func() { syncDir = old })
	syncDir = func(d *os.File) error { return fmt.Errorf("sync dir %s: %w", d.Name(), syscall.EIO) }
}

// TestDirSyncFailureIsUncertain: when the directory sync after the rename
// fails, the error says the state is unknown (ErrUncertain, with the cause);
// failures before the rename are not uncertain
// (TestWriteFileMissingDirLeavesNothing).
func TestDirSyncFailureIsUncertain(t *testing.T) {
	t.Run("WriteFile", func(t *testing.T) {
		p := filepath.Join(t.TempDir(), "m.json")
		if err := WriteFile(p, []byte("old"), 0o644); err != nil {
			t.Fatal(err)
		}
		failDirSync(t)
		err := WriteFile(p, []byte("new"), 0o644)
		if !errors.Is(err, ErrUncertain) || !errors.Is(err, syscall.EIO) {
			t.Fatalf("WriteFile with a failing directory sync: %v, want ErrUncertain and EIO", err)
		}
	})
	t.Run("Rename", func(t *testing.T) {
		dir := t.TempDir()
		if err := os.Mkdir(filepath.Join(dir, "a"), 0o755); err != nil {
			t.Fatal(err)
		}
		failDirSync(t)
		err := Rename(filepath.Join(dir, "a"), filepath.Join(dir, "b"))
		if !errors.Is(err, ErrUncertain) || !errors.Is(err, syscall.EIO) {
			t.Fatalf("Rename with a failing directory sync: %v, want ErrUncertain and EIO", err)
		}
	})
}

// TestWriteFileAtIgnoresSwappedPath: once the directory is open, a link put
// in place of its path does not redirect the write.
func TestWriteFileAtIgnoresSwappedPath(t *testing.T) {
	base := t.TempDir()
	dir, moved, outside := filepath.Join(base, "dir"), filepath.Join(base, "moved"), filepath.Join(base, "outside")
	for _, d := range []string{dir, outside} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	d, err := os.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	if err := os.Rename(dir, moved); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(outside, dir); err != nil {
		t.Fatal(err)
	}
	if err := WriteJSONAt(d, "m.json", map[string]int{"a": 1}); err != nil {
		t.Fatal(err)
	}
	if es, _ := os.ReadDir(outside); len(es) != 0 {
		t.Fatalf("the write followed the link: %v", es)
	}
	var got map[string]int
	if err := ReadJSON(filepath.Join(moved, "m.json"), &got); err != nil || got["a"] != 1 {
		t.Fatalf("read back: %v, %v", got, err)
	}
}
