package server

import (
	"fmt"
	"path/filepath"
	"strings"

	"github.com/quiverstorage/quiver/internal/crypt"
	"github.com/quiverstorage/quiver/internal/crypt/keyfile"
)

// keyring builds the key providers of encrypted volumes from the flags:
// the key file of --key-file, if any (nil: none, and encrypted volumes are
// refused). The key file must live outside the pool: one that a copy of the
// pool carries along would give its data away with it.
func keyring(cfg Config) (crypt.Keyring, error) {
	if cfg.KeyFile == "" {
		return nil, nil
	}
	inside, err := within(cfg.KeyFile, cfg.PoolDir)
	if err != nil {
		return nil, fmt.Errorf("--key-file: %w", err)
	}
	if inside {
		return nil, fmt.Errorf("--key-file %s: inside the pool directory %s; keep the keys apart from the data they protect", cfg.KeyFile, cfg.PoolDir)
	}
	kf, err := keyfile.Open(cfg.KeyFile)
	if err != nil {
		return nil, fmt.Errorf("--key-file: %w", err)
	}
	return crypt.NewKeyring(kf)
}

// within reports whether path is dir or lies beneath it, symbolic links of
// either resolved as far as they exist.
func within(path, dir string) (bool, error) {
	p, err := resolve(path)
	if err != nil {
		return false, err
	}
	d, err := resolve(dir)
	if err != nil {
		return false, err
	}
	rel, err := filepath.Rel(d, p)
	if err != nil {
		return false, err
	}
	return rel == "." || rel != ".." && !strings.HasPrefix(rel, ".."+string(filepath.Separator)), nil
}

// resolve makes path absolute and resolves the symbolic links of its
// longest existing ancestor.
func resolve(path string) (string, error) {
	abs, err := filepath.Abs(path)
	if err != nil {
		return "", err
	}
	rest := ""
	for cur := abs; ; {
		if r, err := filepath.EvalSymlinks(cur); err == nil {
			return filepath.Join(r, rest), nil
		}
		parent := filepath.Dir(cur)
		if parent == cur {
			return abs, nil
		}
		rest = filepath.Join(filepath.Base(cur), rest)
		cur = parent
	}
}
