package interop

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/quiverstorage/quiver/internal/api"
	"github.com/quiverstorage/quiver/internal/client"
	"github.com/quiverstorage/quiver/internal/testserver"
)

// TestEncryptedVolumeOverNBD: a server with --key-file makes an encrypted
// volume; qemu-io writes a pattern through NBD, unaligned writes included;
// the image file holds none of it in the clear, qemu-io reads it back,
// also from a snapshot and after the server restarts; direct access to the
// image files is refused, and the volume shows its key provider, never a
// key. A key file inside the pool is refused at start.
func TestEncryptedVolumeOverNBD(t *testing.T) {
	requireTools(t, "qemu-io")
	pool := filepath.Join(t.TempDir(), "pool")
	keys := filepath.Join(t.TempDir(), "keys.json")
	opts := testserver.Options{Pool: pool, NBDTCP: true, Args: []string{"--key-file", keys}}
	s := testserver.StartT(t, quiverBin, opts)
	v, err := s.API.CreateVolume(t.Context(), api.VolumeSpec{Name: "vault", Capacity: 8 * miB, Encrypt: true,
		Disks: []api.DiskSpec{disk("root", 8*miB)}})
	if err != nil {
		t.Fatal(err)
	}
	if v.Encryption == nil || v.Encryption.Provider != "keyfile" || v.Encryption.KeyID == "" {
		t.Fatalf("encryption %+v, want the key file's KEK", v.Encryption)
	}
	writes := []string{"write -P 0x51 0 64k", "write -P 0x52 70000 5000", "write -P 0x53 1m 512", "write -z 8k 4k"}
	reads := []string{"read -P 0x51 0 8k", "read -P 0 8k 4k", "read -P 0x51 12k 52k", "read -P 0x52 70000 5000",
		"read -P 0 65536 4464", "read -P 0x53 1m 512", "read -P 0 1049088 3584"}
	qemuIO(t, s.URI("vault/root"), false, writes...)
	qemuIO(t, s.URI("vault/root"), true, reads...)
	img, err := os.ReadFile(diskPath(t, v.Disks, "root"))
	if err != nil {
		t.Fatal(err)
	}
	for _, b := range []byte{0x51, 0x52, 0x53} {
		if bytes.Contains(img, bytes.Repeat([]byte{b}, 64)) {
			t.Errorf("the image file holds a run of %#x in the clear", b)
		}
	}
	if _, err := s.API.CreateSnapshot(t.Context(), "vault", "s1"); err != nil {
		t.Fatal(err)
	}
	qemuIO(t, s.URI("vault/root"), false, "write -P 0x54 0 4k")
	qemuIO(t, s.URI("vault@s1/root"), true, reads...)

	err = s.API.SetDirectAccess(t.Context(), "vault", "node-1", true)
	var apiErr *client.Error
	if !errors.As(err, &apiErr) || apiErr.Detail.Code != api.CodeEncrypted {
		t.Fatalf("direct access: %v, want %s", err, api.CodeEncrypted)
	}
	got, err := s.API.GetVolume(t.Context(), "vault")
	if err != nil {
		t.Fatal(err)
	}
	if got.Encryption == nil || *got.Encryption != *v.Encryption || len(got.DirectAccess) != 0 {
		t.Fatalf("volume after the refusal: encryption %+v, direct access %v", got.Encryption, got.DirectAccess)
	}

	if err := s.Stop(20 * time.Second); err != nil {
		t.Fatal(err)
	}
	s = testserver.StartT(t, quiverBin, opts)
	qemuIO(t, s.URI("vault/root"), true, append([]string{"read -P 0x54 0 4k"}, reads[2:]...)...)

	// Without the key file the volume cannot be opened; the message says why.
	if err := s.Stop(20 * time.Second); err != nil {
		t.Fatal(err)
	}
	s = testserver.StartT(t, quiverBin, testserver.Options{Pool: pool, NBDTCP: true, LogLevel: "debug"})
	out, err := exe(t.Context(), "qemu-io", qemuIOArgs(s.URI("vault/root"), true, []string{"read 0 4k"})...)
	if err == nil && qemuIOFailure(out) == "" {
		t.Fatalf("read of an encrypted volume without its key provider succeeded:\n%s", out)
	}
	if log := s.Log.String(); !strings.Contains(log, "key provider") {
		t.Errorf("the server log does not say the key provider is missing:\n%s", testserver.Tail(log, 30))
	}
	if _, err := s.API.CreateVolume(t.Context(), api.VolumeSpec{Name: "v2", Capacity: miB, Encrypt: true,
		Disks: []api.DiskSpec{disk("root", miB)}}); !errors.As(err, &apiErr) || apiErr.Detail.Code != api.CodeNoKeyProvider {
		t.Fatalf("create encrypted without a key provider: %v, want %s", err, api.CodeNoKeyProvider)
	}
	if err := s.Stop(20 * time.Second); err != nil {
		t.Fatal(err)
	}

	inside := testserver.Options{Pool: pool, Args: []string{"--key-file", filepath.Join(pool, "keys.json")}}
	p, err := testserver.Start(t.Context(), quiverBin, inside)
	if err == nil {
		_ = p.Stop(20 * time.Second)
		t.Fatal("a server started with its key file inside the pool")
	}
	if !strings.Contains(err.Error(), "inside the pool") {
		t.Fatalf("start with the key file inside the pool: %v, want a refusal naming it", err)
	}
}
