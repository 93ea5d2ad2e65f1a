package server

import (
	"os"
	"path/filepath"
	"testing"
)

// TestKeyFileWithinPool: a key file is inside the pool when its path, with
// symbolic links resolved as far as they exist, lies beneath the pool
// directory's; a sibling whose name starts like the pool's is not.
func TestKeyFileWithinPool(t *testing.T) {
	root := t.TempDir()
	pool := filepath.Join(root, "pool")
	if err := os.MkdirAll(filepath.Join(pool, "sub"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(filepath.Join(pool, "sub"), filepath.Join(root, "link")); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		path string
		want bool
	}{
		{filepath.Join(pool, "keys.json"), true},
		{filepath.Join(pool, "..keys.json"), true}, // a name that starts with two dots
		{filepath.Join(pool, "sub", "new", "keys.json"), true},
		{pool, true},
		{filepath.Join(root, "link", "keys.json"), true},
		{filepath.Join(root, "pool2", "keys.json"), false},
		{filepath.Join(root, "keys.json"), false},
		{filepath.Join(pool, "..", "keys.json"), false},
	} {
		got, err := within(c.path, pool)
		if err != nil || got != c.want {
			t.Errorf("within(%s, pool) = %v, %v; want %v", c.path, got, err, c.want)
		}
	}
	if _, err := keyring(Config{PoolDir: pool, KeyFile: filepath.Join(root, "link", "k.json")}); err == nil {
		t.Error("a key file reached through a link into the pool was accepted")
	}
	if k, err := keyring(Config{PoolDir: pool, KeyFile: filepath.Join(root, "keys.json")}); err != nil || len(k) != 1 {
		t.Errorf("a key file outside the pool: %v, %v", k, err)
	}
}
