package dr

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"path/filepath"
	"testing"

	"github.com/quiverstorage/quiver/internal/crypt"
	"github.com/quiverstorage/quiver/internal/crypt/keyfile"
	"github.com/quiverstorage/quiver/internal/pool"
)

// TestEncryptedVolumeNotShipped: DR of an encrypted volume is refused: its
// points would reach the other site in
// plaintext (found while merging the encrypted data path: backups and DR
// read through the disk handles, which decrypt).
func TestEncryptedVolumeNotShipped(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	kf, err := keyfile.Open(filepath.Join(dir, "keys.json"))
	if err != nil {
		t.Fatal(err)
	}
	ring, err := crypt.NewKeyring(kf)
	if err != nil {
		t.Fatal(err)
	}
	p, err := pool.OpenWith(ctx, filepath.Join(dir, "pool"), pool.Options{Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), Keyring: ring})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	spec := vm("vm")
	spec.Encrypt = true
	src := volume(t, p, spec)
	if _, err := NewSource(src, "db"); !errors.Is(err, pool.ErrNotSupported) {
		t.Fatalf("DR of an encrypted volume: %v, want ErrNotSupported", err)
	}
	if len(src.Snapshots()) != 0 {
		t.Fatal("a refused DR of an encrypted volume left a point")
	}
}
