package interop

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/quiverstorage/quiver/internal/api"
	"github.com/quiverstorage/quiver/internal/client"
	"github.com/quiverstorage/quiver/internal/crypt"
	"github.com/quiverstorage/quiver/internal/crypt/kmip"
	"github.com/quiverstorage/quiver/internal/crypt/kmip/kmiptest"
	"github.com/quiverstorage/quiver/internal/testserver"
)

// TestEncryptedVolumeWithKMIP is issue 35's acceptance 2 against a real
// `quiver server` and a PyKMIP server: encrypted volumes whose KEKs live in
// the KMS are written through NBD, read back after the node restarts; with
// the KMS down, a VM whose key the node holds keeps reading and writing
// while a node started with the KMS down refuses to open the volume with a
// message naming the KMS, and serves it again once the KMS is back; a KEK
// revoked in the KMS leaves its volume readable only until the node
// restarts, then its export is refused saying the key is deactivated.
func TestEncryptedVolumeWithKMIP(t *testing.T) {
	requireTools(t, "qemu-io")
	kms := kmiptest.Start(t)
	pool, keys := t.TempDir(), t.TempDir()+"/keys.json"
	opts := testserver.Options{Pool: pool, NBDTCP: true, Args: []string{"--key-file", keys,
		"--kmip-server", kms.Addr, "--kmip-ca", kms.CAFile, "--kmip-cert", kms.CertFile, "--kmip-key", kms.KeyFile,
		"--kmip-timeout", "5s", "--new-volume-keys", "kmip"}}
	s := testserver.StartT(t, quiverBin, opts)
	vols := map[string]api.Volume{}
	for _, name := range []string{"a", "b", "c"} {
		v, err := s.API.CreateVolume(t.Context(), api.VolumeSpec{Name: name, Capacity: 4 * miB, Encrypt: true,
			Disks: []api.DiskSpec{disk("root", 4*miB)}})
		if err != nil {
			t.Fatalf("create %s: %v\nKMS log:\n%s", name, err, kms.Log())
		}
		if v.Encryption == nil || v.Encryption.Provider != kmip.Name || v.Encryption.KeyID == "" {
			t.Fatalf("volume %s: encryption %+v, want a KEK of the KMS", name, v.Encryption)
		}
		vols[name] = v
	}
	if _, err := s.API.CreateVolume(t.Context(), api.VolumeSpec{Name: "plain", Capacity: miB,
		Disks: []api.DiskSpec{disk("root", miB)}}); err != nil {
		t.Fatal(err)
	}
	pattern := map[string]byte{"a": 0xa1, "b": 0xb1, "c": 0xc1}
	for name, b := range pattern {
		qemuIO(t, s.URI(name+"/root"), false, fmt.Sprintf("write -P %#x 0 1m", b), fmt.Sprintf("write -P %#x 3m 5000", b+1))
	}
	img, err := os.ReadFile(diskPath(t, vols["a"].Disks, "root"))
	if err != nil {
		t.Fatal(err)
	}
	if bytes.Contains(img, bytes.Repeat([]byte{0xa1}, 64)) {
		t.Fatal("the image file of a holds its pattern in the clear")
	}
	readBack := func(name string, b byte) []string {
		return []string{fmt.Sprintf("read -P %#x 0 1m", b), "read -P 0 1m 2m", fmt.Sprintf("read -P %#x 3m 5000", pattern[name]+1)}
	}

	// Create, write, restart the node, read back: the data keys come back
	// from the KMS.
	s = restart(t, s, opts)
	for name, b := range pattern {
		qemuIO(t, s.URI(name+"/root"), true, readBack(name, b)...)
	}

	// The KMS goes down under a running node: the VM on a, whose key the
	// node holds, keeps writing and reading on its connection; a new
	// connection to b opens, its key in memory too.
	vm := startQemuIO(t, s.URI("a/root"))
	vm.do(t, "write -P 0xa3 1m 64k", "read -P 0xa3 1m 64k")
	kms.Stop()
	vm.do(t, "write -P 0xa4 2m 64k", "flush", "read -P 0xa4 2m 64k", "read -P 0xa1 0 1m")
	qemuIO(t, s.URI("b/root"), false, "write -P 0xb3 1m 4k", "read -P 0xb3 1m 4k")
	vm.quit(t)

	// A node started while the KMS is down serves the plain volume and
	// its API, and refuses a's export with a message naming the KMS.
	s = restart(t, s, opts)
	qemuIO(t, s.URI("plain/root"), false, "write -P 0x77 0 4k", "read -P 0x77 0 4k")
	msg := exportRefused(t, s.URI("a/root"))
	t.Logf("KMS down: %s", msg)
	for _, want := range []string{`"a"`, "cannot be opened", vols["a"].Encryption.KeyID, kms.Addr, "unreachable"} {
		if !strings.Contains(msg, want) {
			t.Errorf("refusal of a with the KMS down does not say %q:\n%s", want, msg)
		}
	}
	if got, err := s.API.GetVolume(t.Context(), "a"); err != nil || got.Encryption == nil {
		t.Fatalf("the API with the KMS down: %+v, %v", got, err)
	}
	_, err = s.API.CreateVolume(t.Context(), api.VolumeSpec{Name: "d", Capacity: miB, Encrypt: true,
		Disks: []api.DiskSpec{disk("root", miB)}})
	var apiErr *client.Error
	if !errors.As(err, &apiErr) || apiErr.Detail.Code != api.CodeUnavailable || !strings.Contains(err.Error(), kms.Addr) {
		t.Fatalf("create with the KMS down: %v, want %s naming %s", err, api.CodeUnavailable, kms.Addr)
	}
	if _, err := s.API.GetVolume(t.Context(), "d"); !errors.As(err, &apiErr) || apiErr.Detail.Code != api.CodeNotFound {
		t.Fatalf("volume d after its failed create: %v, want %s", err, api.CodeNotFound)
	}

	// The KMS back: the same node opens a, with what the VM wrote.
	kms.Start()
	qemuIO(t, s.URI("a/root"), true, "read -P 0xa1 0 1m", "read -P 0xa3 1m 64k", "read -P 0xa4 2m 64k")

	// c's KEK revoked in the KMS: c stays served while its key is in
	// memory, and cannot be opened after a restart.
	qemuIO(t, s.URI("c/root"), true, readBack("c", 0xc1)...)
	admin, err := kmip.New(kmip.Config{Addr: kms.Addr, TLS: kms.TLS})
	if err != nil {
		t.Fatal(err)
	}
	if err := admin.RevokeKEK(t.Context(), vols["c"].Encryption.KeyID); err != nil {
		t.Fatal(err)
	}
	qemuIO(t, s.URI("c/root"), true, readBack("c", 0xc1)...)
	s = restart(t, s, opts)
	msg = exportRefused(t, s.URI("c/root"))
	t.Logf("KEK revoked: %s", msg)
	for _, want := range []string{`"c"`, vols["c"].Encryption.KeyID, "revoked", "Deactivated"} {
		if !strings.Contains(msg, want) {
			t.Errorf("refusal of c with its KEK revoked does not say %q:\n%s", want, msg)
		}
	}
	qemuIO(t, s.URI("b/root"), true, "read -P 0xb1 0 1m", "read -P 0xb3 1m 4k")

	// A shallow rekey of b in the KMS (a new KEK, a Decrypt and an
	// Encrypt, the old KEK destroyed), then a move of b into the key file.
	oldB := wrappedKeyOf(t, pool, "b")
	start := time.Now()
	rb, err := s.API.Rekey(t.Context(), "b", api.RekeySpec{})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("shallow rekey through the KMS: %v", time.Since(start).Round(time.Millisecond))
	if rb.Encryption.Provider != kmip.Name || rb.Encryption.KeyID == oldB.KeyID {
		t.Fatalf("after a shallow rekey: %+v (KEK before %s)", rb.Encryption, oldB.KeyID)
	}
	if _, err := admin.Unwrap(t.Context(), oldB); !errors.Is(err, crypt.ErrKEKNotFound) {
		t.Fatalf("b's old KEK after the rekey: %v, want destroyed", err)
	}
	if rb, err = s.API.Rekey(t.Context(), "b", api.RekeySpec{Provider: "keyfile"}); err != nil || rb.Encryption.Provider != "keyfile" {
		t.Fatalf("move b into the key file: %+v, %v", rb.Encryption, err)
	}
	s = restart(t, s, opts)
	qemuIO(t, s.URI("b/root"), true, "read -P 0xb1 0 1m", "read -P 0xb3 1m 4k")
}

// wrappedKeyOf reads a volume's wrapped data key from its manifest in the
// pool, as someone holding the pool's files would.
func wrappedKeyOf(t *testing.T, pool, volume string) crypt.WrappedKey {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(pool, "volumes", volume, "volume.json"))
	if err != nil {
		t.Fatal(err)
	}
	var m struct{ Key crypt.WrappedKey }
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatal(err)
	}
	return m.Key
}

// restart stops s and starts a server on its pool again with opts.
func restart(t *testing.T, s *testserver.Process, opts testserver.Options) *testserver.Process {
	t.Helper()
	if err := s.Stop(20 * time.Second); err != nil {
		t.Fatal(err)
	}
	return testserver.StartT(t, quiverBin, opts)
}

// exportRefused opens uri with qemu-io, which must fail, and returns its output
// (the NBD server's refusal, as qemu reports it).
func exportRefused(t *testing.T, uri string) string {
	t.Helper()
	out, err := exe(t.Context(), "qemu-io", qemuIOArgs(uri, true, []string{"read 0 4k"})...)
	if err == nil && qemuIOFailure(out) == "" {
		t.Fatalf("qemu-io opened %s:\n%s", uri, out)
	}
	return out
}

// interactiveQemuIO is one qemu-io process reading its commands from a
// pipe: one NBD connection held open across the test's steps, as a VM's.
type interactiveQemuIO struct {
	cmd   *exec.Cmd
	in    io.WriteCloser
	mu    sync.Mutex
	out   bytes.Buffer
	sent  int // commands sent
	uri   string
	ended chan struct{}
}

func startQemuIO(t *testing.T, uri string) *interactiveQemuIO {
	t.Helper()
	q := &interactiveQemuIO{uri: uri, ended: make(chan struct{})}
	q.cmd = exec.Command("qemu-io", "-f", "raw", uri)
	in, err := q.cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	q.in = in
	q.cmd.Stdout, q.cmd.Stderr = q, q
	if err := q.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { _ = q.cmd.Wait(); close(q.ended) }()
	t.Cleanup(func() { _ = q.cmd.Process.Kill(); <-q.ended })
	q.wait(t, 1) // the first prompt: connected
	return q
}

func (q *interactiveQemuIO) Write(p []byte) (int, error) {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.out.Write(p)
}

func (q *interactiveQemuIO) output() string {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.out.String()
}

// wait waits for the n-th prompt: qemu-io prints one at start and one after
// each command it has run.
func (q *interactiveQemuIO) wait(t *testing.T, n int) {
	t.Helper()
	deadline := time.After(toolTimeout)
	for strings.Count(q.output(), "qemu-io> ") < n {
		select {
		case <-q.ended:
			t.Fatalf("qemu-io on %s ended:\n%s", q.uri, q.output())
		case <-deadline:
			t.Fatalf("qemu-io on %s: no prompt %d:\n%s", q.uri, n, q.output())
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// do runs the commands one after the other and fails the test if any fails.
func (q *interactiveQemuIO) do(t *testing.T, cmds ...string) {
	t.Helper()
	before := len(q.output())
	for _, c := range cmds {
		if _, err := io.WriteString(q.in, c+"\n"); err != nil {
			t.Fatal(err)
		}
		q.sent++
		q.wait(t, q.sent+1)
	}
	if bad := qemuIOFailure(q.output()[before:]); bad != "" {
		t.Fatalf("qemu-io on %s: %s\n%s", q.uri, bad, q.output())
	}
}

// quit ends qemu-io, which closes its connection.
func (q *interactiveQemuIO) quit(t *testing.T) {
	t.Helper()
	_ = q.in.Close()
	select {
	case <-q.ended:
	case <-time.After(toolTimeout):
		t.Fatalf("qemu-io on %s did not quit", q.uri)
	}
}
