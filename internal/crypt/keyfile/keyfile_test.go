package keyfile

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/quiverstorage/quiver/internal/crypt"
)

func open(t *testing.T, path string) *Provider {
	t.Helper()
	p, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// TestWrapSurvivesRestart: a data key wrapped by one provider, its wrapped
// form through JSON (as a manifest holds it), unwraps in a provider opened
// anew on the same file.
func TestWrapSurvivesRestart(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "keks.json")
	dk, w, err := crypt.NewVMKey(ctx, open(t, path))
	if err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o600 {
		t.Fatalf("key file mode %04o, want 0600", fi.Mode().Perm())
	}
	js, err := json.Marshal(w)
	if err != nil {
		t.Fatal(err)
	}
	var back crypt.WrappedKey
	if err := json.Unmarshal(js, &back); err != nil {
		t.Fatal(err)
	}
	if back.Provider != Name || back.Algorithm != crypt.AlgorithmGCM || back.KeyID == "" {
		t.Fatalf("wrapped key %s", js)
	}
	got, err := open(t, path).Unwrap(ctx, back)
	if err != nil {
		t.Fatal(err)
	}
	if !got.Equal(dk) {
		t.Fatal("unwrapped another data key")
	}
}

func TestRefusesLooseFile(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "keks.json")
	if _, err := open(t, path).CreateKEK(context.Background()); err != nil {
		t.Fatal(err)
	}
	for _, mode := range []os.FileMode{0o644, 0o640, 0o604, 0o620} {
		if err := os.Chmod(path, mode); err != nil {
			t.Fatal(err)
		}
		if _, err := Open(path); err == nil {
			t.Errorf("a key file of mode %04o opened", mode)
		}
	}
	if err := os.Chmod(path, 0o600); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(dir, "link.json")
	if err := os.Symlink(path, link); err != nil {
		t.Fatal(err)
	}
	if _, err := Open(link); err == nil {
		t.Error("a symbolic link opened as a key file")
	}
}

func TestRevokeAndDestroy(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "keks.json")
	p := open(t, path)
	_, w, err := crypt.NewVMKey(ctx, p)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.RevokeKEK(ctx, w.KeyID); err != nil {
		t.Fatal(err)
	}
	for _, q := range []*Provider{p, open(t, path)} {
		if _, err := q.Unwrap(ctx, w); !errors.Is(err, crypt.ErrKEKRevoked) {
			t.Fatalf("unwrap under a revoked KEK: %v, want ErrKEKRevoked", err)
		}
	}
	if err := p.DestroyKEK(ctx, w.KeyID); err != nil {
		t.Fatal(err)
	}
	for _, q := range []*Provider{p, open(t, path)} {
		if _, err := q.Unwrap(ctx, w); !errors.Is(err, crypt.ErrKEKNotFound) {
			t.Fatalf("unwrap under a destroyed KEK: %v, want ErrKEKNotFound", err)
		}
	}
	if err := p.DestroyKEK(ctx, w.KeyID); !errors.Is(err, crypt.ErrKEKNotFound) {
		t.Fatalf("second destroy: %v", err)
	}
}

// TestTamper: wrapped bytes or metadata changed in a manifest do not unwrap.
func TestTamper(t *testing.T) {
	ctx := context.Background()
	p := open(t, filepath.Join(t.TempDir(), "keks.json"))
	_, w, err := crypt.NewVMKey(ctx, p)
	if err != nil {
		t.Fatal(err)
	}
	_, other, err := crypt.NewVMKey(ctx, p)
	if err != nil {
		t.Fatal(err)
	}
	flipped := w
	flipped.Wrapped = append([]byte(nil), w.Wrapped...)
	flipped.Wrapped[20] ^= 1
	moved := w
	moved.KeyID = other.KeyID
	short := w
	short.Wrapped = w.Wrapped[:10]
	alg := w
	alg.Algorithm = "AES-KW"
	for name, bad := range map[string]crypt.WrappedKey{"flipped bit": flipped, "other KEK": moved, "short": short, "algorithm": alg} {
		if _, err := p.Unwrap(ctx, bad); !errors.Is(err, crypt.ErrUnwrap) {
			t.Errorf("%s: %v, want ErrUnwrap", name, err)
		}
	}
	foreign := w
	foreign.Provider = "kmip"
	if _, err := p.Unwrap(ctx, foreign); !errors.Is(err, crypt.ErrProvider) {
		t.Errorf("another provider's key: %v, want ErrProvider", err)
	}
}

// TestCloneAndRekey: a clone's wrapped key is its own (its own KEK) for the
// same data key; shredding the source leaves the clone readable; a shallow
// rekey moves a key to a new KEK and the old one can go.
func TestCloneAndRekey(t *testing.T) {
	ctx := context.Background()
	p := open(t, filepath.Join(t.TempDir(), "keks.json"))
	dk, src, err := crypt.NewVMKey(ctx, p)
	if err != nil {
		t.Fatal(err)
	}
	clone, err := crypt.CloneKey(ctx, p, src)
	if err != nil {
		t.Fatal(err)
	}
	if clone.KeyID == src.KeyID {
		t.Fatal("the clone's key is under its source's KEK")
	}
	if err := p.DestroyKEK(ctx, src.KeyID); err != nil {
		t.Fatal(err)
	}
	if _, err := p.Unwrap(ctx, src); err == nil {
		t.Fatal("the shredded source still unwraps")
	}
	got, err := p.Unwrap(ctx, clone)
	if err != nil || !got.Equal(dk) {
		t.Fatalf("clone after its source's shred: %v", err)
	}

	newKEK, err := p.CreateKEK(ctx)
	if err != nil {
		t.Fatal(err)
	}
	rekeyed, err := crypt.Rewrap(ctx, p, clone, p, newKEK)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.DestroyKEK(ctx, clone.KeyID); err != nil {
		t.Fatal(err)
	}
	got, err = p.Unwrap(ctx, rekeyed)
	if err != nil || !got.Equal(dk) {
		t.Fatalf("after a shallow rekey: %v", err)
	}
}

// TestKeyring: a keyring unwraps with the provider a wrapped key names and
// refuses a key of a provider it lacks.
func TestKeyring(t *testing.T) {
	ctx := context.Background()
	p := open(t, filepath.Join(t.TempDir(), "keks.json"))
	dk, w, err := crypt.NewVMKey(ctx, p)
	if err != nil {
		t.Fatal(err)
	}
	ring, err := crypt.NewKeyring(p)
	if err != nil {
		t.Fatal(err)
	}
	got, err := ring.Unwrap(ctx, w)
	if err != nil || !got.Equal(dk) {
		t.Fatalf("keyring unwrap: %v", err)
	}
	w.Provider = "kmip"
	if _, err := ring.Unwrap(ctx, w); !errors.Is(err, crypt.ErrProvider) {
		t.Fatalf("a key of a provider not configured: %v, want ErrProvider", err)
	}
	if _, err := crypt.NewKeyring(p, p); err == nil {
		t.Fatal("a keyring with two providers of one name")
	}
}

// TestCloneOfLostKeyLeavesNoKEK: a clone of a key whose KEK is gone fails and
// destroys the KEK it created for the clone.
func TestCloneOfLostKeyLeavesNoKEK(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "keks.json")
	p := open(t, path)
	_, w, err := crypt.NewVMKey(ctx, p)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.DestroyKEK(ctx, w.KeyID); err != nil {
		t.Fatal(err)
	}
	if _, err := crypt.CloneKey(ctx, p, w); !errors.Is(err, crypt.ErrKEKNotFound) {
		t.Fatalf("clone of a shredded key: %v, want ErrKEKNotFound", err)
	}
	if n := len(open(t, path).f.KEKs); n != 0 {
		t.Fatalf("%d KEKs left in the key file, want 0", n)
	}
}
