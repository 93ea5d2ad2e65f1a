package testfs

import (
	"os"
	"path/filepath"
	"testing"
)

// TestTreeSum: the sum of a tree changes with any name, content or mode
// in it, and not with where the tree is.
func TestTreeSum(t *testing.T) {
	mk := func() string {
		dir := t.TempDir()
		if err := os.MkdirAll(filepath.Join(dir, "a", "b"), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, "a", "b", "f"), []byte("data"), 0o644); err != nil {
			t.Fatal(err)
		}
		return dir
	}
	base := TreeSum(t, mk())
	if got := TreeSum(t, mk()); got != base {
		t.Fatal("two equal trees have different sums")
	}
	for name, change := range map[string]func(dir string) error{
		"content": func(dir string) error { return os.WriteFile(filepath.Join(dir, "a", "b", "f"), []byte("datA"), 0o644) },
		"name": func(dir string) error {
			return os.Rename(filepath.Join(dir, "a", "b", "f"), filepath.Join(dir, "a", "b", "g"))
		},
		"mode": func(dir string) error { return os.Chmod(filepath.Join(dir, "a"), 0o700) },
		"new":  func(dir string) error { return os.Mkdir(filepath.Join(dir, "c"), 0o755) },
	} {
		dir := mk()
		if err := change(dir); err != nil {
			t.Fatal(err)
		}
		if TreeSum(t, dir) == base {
			t.Errorf("a changed %s leaves the sum", name)
		}
	}
}

// TestReadOnlyTree: no write bit anywhere until the test ends, then the
// owner's back.
func TestReadOnlyTree(t *testing.T) {
	dir := t.TempDir()
	f := filepath.Join(dir, "sub", "f")
	if err := os.MkdirAll(filepath.Dir(f), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(f, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	for p, m := range map[string]os.FileMode{dir: 0o755, filepath.Dir(f): 0o755, f: 0o644} { // whatever the umask
		if err := os.Chmod(p, m); err != nil {
			t.Fatal(err)
		}
	}
	t.Run("ro", func(t *testing.T) {
		ReadOnlyTree(t, dir)
		for _, p := range []string{dir, filepath.Dir(f), f} {
			if fi, err := os.Stat(p); err != nil || fi.Mode().Perm()&0o222 != 0 {
				t.Errorf("%s: %v, %v; want no write bit", p, fi.Mode(), err)
			}
		}
	})
	for p, want := range map[string]os.FileMode{dir: 0o755, filepath.Dir(f): 0o755, f: 0o644} {
		if fi, err := os.Stat(p); err != nil || fi.Mode().Perm() != want {
			t.Errorf("%s after the test: %v, %v; want %v", p, fi.Mode().Perm(), err, want)
		}
	}
}
