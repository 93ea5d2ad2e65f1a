package dr

import (
	"bytes"
	"context"
	"errors"
	"io"
	"io/fs"
	"log/slog"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"

	"github.com/quiverstorage/quiver/internal/crypt"
	"github.com/quiverstorage/quiver/internal/crypt/keyfile"
	"github.com/quiverstorage/quiver/internal/pool"
)

// encPool opens a pool at dir whose key provider is kp: both sites of a
// test share one, as two sites share a KMIP server.
func encPool(t *testing.T, dir string, kp crypt.Provider) *pool.Pool {
	t.Helper()
	ring, err := crypt.NewKeyring(kp)
	if err != nil {
		t.Fatal(err)
	}
	p, err := pool.OpenWith(context.Background(), dir, pool.Options{Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), Keyring: ring})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close() })
	return p
}

// noneHolds fails the test if a file under dir holds the run b.
func noneHolds(t *testing.T, dir string, b []byte) {
	t.Helper()
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil || !d.Type().IsRegular() {
			return err
		}
		data, err := os.ReadFile(path)
		if err == nil && bytes.Contains(data, b) {
			t.Errorf("%s holds the plaintext", path)
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
}

// TestEncryptedVolumeShipsCiphertext: DR of an encrypted volume ships its
// ciphertext and its data key under its backup KEK, never its plaintext:
// the target site's files hold no plaintext, its points read back as the
// source's (a full point and a delta), and after a promote it serves the
// VM. A target under another data key (the source deep-rekeyed) refuses the
// point; a target whose key manager lacks the KEK refuses it before
// anything changes; and shredding the source leaves the target's copy
// unreadable.
func TestEncryptedVolumeShipsCiphertext(t *testing.T) {
	ctx := context.Background()
	kf, err := keyfile.Open(filepath.Join(t.TempDir(), "keys.json"))
	if err != nil {
		t.Fatal(err)
	}
	srcDir, dstDir := t.TempDir(), t.TempDir()
	ps, pd := encPool(t, srcDir, kf), encPool(t, dstDir, kf)
	spec := vm("vm")
	spec.Encrypt = true
	src := volume(t, ps, spec)
	dst := volume(t, pd, pool.VolumeSpec{Name: "vm-dr", Capacity: mib})
	s, err := NewSource(src, "site-b")
	if err != nil {
		t.Fatal(err)
	}
	r, err := NewReceiver(dst, "site-b", 2)
	if err != nil {
		t.Fatal(err)
	}
	marker := bytes.Repeat([]byte("dr-plaintext-marker."), 200)
	h, err := src.OpenDisk("root")
	if err != nil {
		t.Fatal(err)
	}
	if err := h.WriteAt(marker, 12345, false); err != nil {
		t.Fatal(err)
	}
	h.Close()
	rng := rand.New(rand.NewPCG(3, 4))
	scribble(t, src, rng, 50)
	st, err := s.Cycle(ctx, r)
	if err != nil {
		t.Fatal(err)
	}
	sameContent(t, "point 1", content(t, dst, st.Point.Snapshot), content(t, src, st.Point.Snapshot))
	scribble(t, src, rng, 5)
	st2, err := s.Cycle(ctx, r)
	if err != nil {
		t.Fatal(err)
	}
	if st2.Base != st.Point.Snapshot {
		t.Fatalf("second cycle: %+v, want a delta", st2)
	}
	sameContent(t, "point 2", content(t, dst, st2.Point.Snapshot), content(t, src, st2.Point.Snapshot))
	noneHolds(t, dstDir, marker[:40])
	di := dst.Info()
	if di.Encryption == nil {
		t.Fatal("the target's volume is not encrypted")
	}

	// A target whose key manager does not hold the KEK refuses the point,
	// and stays as it was.
	other, err := keyfile.Open(filepath.Join(t.TempDir(), "other.json"))
	if err != nil {
		t.Fatal(err)
	}
	lone := volume(t, encPool(t, t.TempDir(), other), pool.VolumeSpec{Name: "vm-dr", Capacity: mib})
	lr, err := NewReceiver(lone, "site-c", 2)
	if err != nil {
		t.Fatal(err)
	}
	s3, err := NewSource(src, "site-c")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s3.Cycle(ctx, lr); !errors.Is(err, pool.ErrKeyUnavailable) {
		t.Fatalf("a point into a site without the KEK: %v, want ErrKeyUnavailable", err)
	}
	if li := lone.Info(); li.Encryption != nil || len(li.Disks) != 0 {
		t.Fatalf("the refused target changed: %+v", li)
	}

	// The source deep-rekeyed: its next point is under another data key.
	for _, sn := range src.Snapshots() {
		if err := src.DeleteSnapshot(ctx, sn.Name); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := src.Rekey(ctx, pool.RekeyOptions{Deep: true, Rate: 1 << 40}, nil); err != nil {
		t.Fatal(err)
	}
	s.Replace = true
	if _, err := s.Cycle(ctx, r); !errors.Is(err, ErrDiverged) {
		t.Fatalf("a point under a new data key into the old target: %v, want ErrDiverged", err)
	}

	// Promote: the target's last point serves the VM, under the key the
	// source shipped.
	if err := backTo(ctx, dst, st2.Point); err != nil { // as Targets.Promote does
		t.Fatal(err)
	}
	sameContent(t, "promoted", content(t, dst, ""), content(t, dst, st2.Point.Snapshot))

	// Shredding the source destroys its backup KEK, under which the target
	// holds the data key: the target's copy cannot be opened again.
	if err := ps.DeleteWith(ctx, "vm", pool.DeleteOptions{Shred: true}); err != nil {
		t.Fatal(err)
	}
	_ = pd.Close()
	pd = encPool(t, dstDir, kf)
	v, err := pd.Volume("vm-dr")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := v.OpenDisk("root"); !errors.Is(err, pool.ErrKeyUnavailable) {
		t.Fatalf("the DR copy after the source's shred: %v, want ErrKeyUnavailable", err)
	}
}
