package interop

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/quiverstorage/quiver/internal/api"
	"github.com/quiverstorage/quiver/internal/client"
	"github.com/quiverstorage/quiver/internal/crypt"
	"github.com/quiverstorage/quiver/internal/crypt/keyfile"
	"github.com/quiverstorage/quiver/internal/testserver"
)

// TestRekeyAndShredThroughTheCLI drives a server with --key-file through
// the quiver CLI and qemu-io over NBD: a shallow rekey changes the KEK and
// destroys the old one; a deep rekey of a 2-disk VM while qemu-io keeps a
// connection open and writes through it leaves every write readable after
// a restart, under a new data key; a shred is refused while a clone shares
// the key and not named, and with the clone named destroys both KEKs and
// both volumes: no export, snapshot export or copy of the key opens again.
func TestRekeyAndShredThroughTheCLI(t *testing.T) {
	requireTools(t, "qemu-io")
	pool := filepath.Join(t.TempDir(), "pool")
	keys := filepath.Join(t.TempDir(), "keys.json")
	opts := testserver.Options{Pool: pool, NBDTCP: true, Args: []string{"--key-file", keys}}
	s := testserver.StartT(t, quiverBin, opts)
	cli := func(args ...string) (string, error) {
		return exe(t.Context(), quiverBin, append([]string{"--server", s.APIAddr}, args...)...)
	}
	mustCLI := func(args ...string) string {
		t.Helper()
		out, err := cli(args...)
		if err != nil {
			t.Fatalf("%v\n%s", err, out)
		}
		return out
	}
	mustCLI("volume", "create", "vault", "--capacity", "16Mi", "--disk", "root=4Mi", "--disk", "data=3Mi", "--encrypt")
	qemuIO(t, s.URI("vault/root"), false, "write -P 0x61 0 1m", "write -P 0x62 3m 5000")
	qemuIO(t, s.URI("vault/data"), false, "write -P 0x63 1m 1m")
	getVol := func(name string) api.Volume {
		t.Helper()
		v, err := s.API.GetVolume(t.Context(), name)
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	kekOf := func(name string) crypt.WrappedKey { return wrappedKeyOf(t, pool, name) }
	unwraps := func(w crypt.WrappedKey) error {
		kf, err := keyfile.Open(keys)
		if err != nil {
			t.Fatal(err)
		}
		_, err = kf.Unwrap(context.Background(), w)
		return err
	}

	// Shallow.
	first := kekOf("vault")
	out := mustCLI("volume", "rekey", "vault")
	if !strings.Contains(out, "old KEK is destroyed") {
		t.Fatalf("shallow rekey said:\n%s", out)
	}
	if v := getVol("vault"); v.Encryption.KeyID == first.KeyID {
		t.Fatal("the KEK did not change")
	}
	if err := unwraps(first); !errors.Is(err, crypt.ErrKEKNotFound) {
		t.Fatalf("the old KEK after a shallow rekey: %v, want not found", err)
	}

	// Deep, while a VM's connection writes.
	vm := startQemuIO(t, s.URI("vault/root"))
	before := kekOf("vault")
	type result struct {
		out string
		err error
	}
	done := make(chan result, 1)
	go func() {
		out, err := cli("volume", "rekey", "vault", "--deep", "--rate", "2Mi")
		done <- result{out, err}
	}()
	// The CLI is a process of its own: the rekey is under way once the
	// volume shows it (it takes 3.5 s at 2 MiB/s).
	for deadline := time.Now().Add(20 * time.Second); ; {
		if r := getVol("vault").Encryption.Rekey; r != nil && r.Running {
			break
		}
		select {
		case res := <-done:
			t.Fatalf("the deep rekey ended before it showed: %v\n%s", res.err, res.out)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatal("no deep rekey shows in the volume")
		}
		time.Sleep(10 * time.Millisecond)
	}
	var writes int
	var res result
	for running := true; running; writes++ {
		select {
		case res = <-done:
			running = false
		default:
		}
		vm.do(t, fmt.Sprintf("write -P %d %d 12k", 0x70+writes%16, int64(writes%64)*16<<10), "flush")
		if writes == 3 {
			_, err := s.API.CreateSnapshot(t.Context(), "vault", "s1")
			var apiErr *client.Error
			if !errors.As(err, &apiErr) || apiErr.Detail.Code != api.CodeBusy {
				t.Fatalf("snapshot during a deep rekey: %v, want %s", err, api.CodeBusy)
			}
			if r := getVol("vault").Encryption.Rekey; r == nil || !r.Running || r.TotalBytes != 7<<20 {
				t.Fatalf("rekey progress during it: %+v", r)
			}
		}
	}
	if res.err != nil {
		t.Fatalf("deep rekey: %v\n%s", res.err, res.out)
	}
	t.Logf("%d writes through the open connection during the deep rekey", writes)
	if writes < 5 {
		t.Fatalf("only %d writes during the rekey: it did not overlap", writes)
	}
	vm.quit(t)
	if err := unwraps(before); !errors.Is(err, crypt.ErrKEKNotFound) {
		t.Fatalf("the old KEK after a deep rekey: %v, want not found", err)
	}
	s = restart(t, s, opts)
	var reads []string
	for i := max(0, writes-64); i < writes; i++ { // the last write to each slot wins
		reads = append(reads, fmt.Sprintf("read -P %d %d 12k", 0x70+i%16, int64(i%64)*16<<10))
	}
	if writes < 64 {
		reads = append(reads, "read -P 0x61 1040384 8192") // the end of the first pattern, written over by none
	}
	reads = append(reads, "read -P 0x62 3m 5000")
	qemuIO(t, s.URI("vault/root"), true, reads...)
	qemuIO(t, s.URI("vault/data"), true, "read -P 0x63 1m 1m", "read -P 0 0 1m")
	for _, d := range getVol("vault").Disks {
		img, err := os.ReadFile(d.Path)
		if err != nil {
			t.Fatal(err)
		}
		for _, b := range []byte{0x61, 0x62, 0x63, 0x70} {
			if bytes.Contains(img, bytes.Repeat([]byte{b}, 64)) {
				t.Errorf("disk %s holds a run of %#x in the clear", d.Name, b)
			}
		}
	}

	// Shred.
	mustCLI("snapshot", "create", "vault", "s1")
	mustCLI("clone", "vault@s1", "vault-test")
	keyVault, keyClone := kekOf("vault"), kekOf("vault-test")
	out, err := cli("volume", "delete", "vault", "--shred")
	if err == nil || !strings.Contains(out, "vault-test") || !strings.Contains(out, "--force") {
		t.Fatalf("shred with a clone not named: %v\n%s", err, out)
	}
	qemuIO(t, s.URI("vault@s1/root"), true, "read -P 0x62 3m 5000") // the refusal changed nothing
	out = mustCLI("volume", "delete", "vault", "--shred", "--force", "vault-test")
	if !strings.Contains(out, "shredded") {
		t.Fatalf("shred said:\n%s", out)
	}
	for _, w := range []crypt.WrappedKey{keyVault, keyClone} {
		if err := unwraps(w); !errors.Is(err, crypt.ErrKEKNotFound) {
			t.Fatalf("KEK %s after the shred: %v, want not found", w.KeyID, err)
		}
	}
	for _, e := range []string{"vault/root", "vault@s1/root", "vault-test/root"} {
		exportRefused(t, s.URI(e))
	}
	if _, err := os.Stat(filepath.Join(pool, "volumes", "vault")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the volume's directory after the shred: %v", err)
	}
	if err := s.Stop(20 * time.Second); err != nil {
		t.Fatal(err)
	}
}
