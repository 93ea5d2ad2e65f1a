package kmip

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"net"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/quiverstorage/quiver/internal/crypt"
	"github.com/quiverstorage/quiver/internal/crypt/keyfile"
	"github.com/quiverstorage/quiver/internal/crypt/kmip/kmiptest"
	"github.com/quiverstorage/quiver/internal/tlscert/certtest"
)

// provider is a client of the test's KMS.
func provider(t *testing.T, s *kmiptest.Server) *Provider {
	t.Helper()
	p, err := New(Config{Addr: s.Addr, TLS: s.TLS, Timeout: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// TestPyKMIP runs the provider against a real KMIP server: a data key
// wrapped under a KEK created there unwraps after the client and the server
// restart; a tampered wrapped key does not; a clone has its own KEK; a
// revoked KEK and a destroyed one refuse to unwrap, each with its error.
func TestPyKMIP(t *testing.T) {
	ctx := context.Background()
	s := kmiptest.Start(t)
	dk, w, err := crypt.NewVMKey(ctx, provider(t, s))
	if err != nil {
		t.Fatalf("new VM key: %v\n%s", err, s.Log())
	}
	manifest, err := json.Marshal(w)
	if err != nil {
		t.Fatal(err)
	}

	s.Restart()
	var back crypt.WrappedKey
	if err := json.Unmarshal(manifest, &back); err != nil {
		t.Fatal(err)
	}
	p := provider(t, s) // a new client: the node restarted too
	got, err := p.Unwrap(ctx, back)
	if err != nil {
		t.Fatalf("unwrap after restarts: %v\n%s", err, s.Log())
	}
	if !got.Equal(dk) {
		t.Fatal("unwrapped another data key")
	}

	bad := back
	bad.Wrapped = append([]byte(nil), back.Wrapped...)
	bad.Wrapped[nonceSize] ^= 1
	if _, err := p.Unwrap(ctx, bad); !errors.Is(err, crypt.ErrUnwrap) {
		t.Errorf("a flipped bit: %v, want ErrUnwrap", err)
	}
	moved := back
	moved.KeyID = "quiver-no-such-key"
	if _, err := p.Unwrap(ctx, moved); !errors.Is(err, crypt.ErrKEKNotFound) {
		t.Errorf("an unknown KEK: %v, want ErrKEKNotFound", err)
	}

	clone, err := crypt.CloneKey(ctx, p, back)
	if err != nil {
		t.Fatal(err)
	}
	if clone.KeyID == back.KeyID {
		t.Fatal("the clone's key is under its source's KEK")
	}

	if err := p.RevokeKEK(ctx, back.KeyID); err != nil {
		t.Fatal(err)
	}
	_, err = p.Unwrap(ctx, back)
	if !errors.Is(err, crypt.ErrKEKRevoked) {
		t.Fatalf("unwrap under a revoked KEK: %v, want ErrKEKRevoked", err)
	}
	t.Logf("revoked: %v", err)
	if _, err := p.Wrap(ctx, back.KeyID, dk); !errors.Is(err, crypt.ErrKEKRevoked) {
		t.Fatalf("wrap under a revoked KEK: %v, want ErrKEKRevoked", err)
	}
	got, err = p.Unwrap(ctx, clone)
	if err != nil || !got.Equal(dk) {
		t.Fatalf("the clone after its source's revocation: %v", err)
	}

	if err := p.DestroyKEK(ctx, clone.KeyID); err != nil { // active: revoked, then destroyed
		t.Fatal(err)
	}
	if err := p.DestroyKEK(ctx, back.KeyID); err != nil { // revoked already
		t.Fatal(err)
	}
	for _, w := range []crypt.WrappedKey{back, clone} {
		_, err := p.Unwrap(ctx, w)
		if !errors.Is(err, crypt.ErrKEKNotFound) {
			t.Fatalf("unwrap under a destroyed KEK: %v, want ErrKEKNotFound", err)
		}
		t.Logf("destroyed: %v", err)
	}
}

// TestWrongCA: a client that does not trust the server's certificate gets a
// TLS error naming the server, not ErrUnreachable; a client without a
// certificate of the KMS's CA is refused by the server.
func TestWrongCA(t *testing.T) {
	ctx := context.Background()
	s := kmiptest.Start(t)
	other := certtest.NewCA(t, "another CA")
	roots := x509.NewCertPool()
	roots.AddCert(other.Cert)
	wrong := s.TLS.Clone()
	wrong.RootCAs = roots
	p, err := New(Config{Addr: s.Addr, TLS: wrong})
	if err != nil {
		t.Fatal(err)
	}
	_, err = p.CreateKEK(ctx)
	if err == nil || errors.Is(err, crypt.ErrUnreachable) || !strings.Contains(err.Error(), s.Addr) ||
		!strings.Contains(err.Error(), "TLS") {
		t.Fatalf("untrusted server: %v, want a TLS error naming %s", err, s.Addr)
	}
	pair := other.Client(t, "intruder")
	cert, err := tls.X509KeyPair(pair.Cert, pair.Key)
	if err != nil {
		t.Fatal(err)
	}
	intruder := s.TLS.Clone()
	intruder.Certificates = []tls.Certificate{cert}
	p, err = New(Config{Addr: s.Addr, TLS: intruder, Timeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.CreateKEK(ctx); err == nil {
		t.Fatal("a client certificate of another CA created a KEK")
	}
}

// TestRewrapBetweenProviders moves a data key from the key file to the KMS
// (a shallow rekey that changes provider).
func TestRewrapBetweenProviders(t *testing.T) {
	ctx := context.Background()
	s := kmiptest.Start(t)
	kf, err := keyfile.Open(filepath.Join(t.TempDir(), "keks.json"))
	if err != nil {
		t.Fatal(err)
	}
	dk, w, err := crypt.NewVMKey(ctx, kf)
	if err != nil {
		t.Fatal(err)
	}
	p := provider(t, s)
	kek, err := p.CreateKEK(ctx)
	if err != nil {
		t.Fatal(err)
	}
	nw, err := crypt.Rewrap(ctx, kf, w, p, kek)
	if err != nil {
		t.Fatal(err)
	}
	if nw.Provider != Name || nw.KeyID != kek {
		t.Fatalf("rewrapped as %+v", nw)
	}
	got, err := p.Unwrap(ctx, nw)
	if err != nil || !got.Equal(dk) {
		t.Fatalf("unwrap in the KMS: %v", err)
	}
}

// TestUnreachable: no server at the address gives ErrUnreachable and a
// message that names the server.
func TestUnreachable(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	_ = l.Close()
	p, err := New(Config{Addr: addr, TLS: &tls.Config{MinVersion: tls.VersionTLS12}, Timeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	_, err = p.CreateKEK(context.Background())
	if !errors.Is(err, crypt.ErrUnreachable) || !strings.Contains(err.Error(), addr) {
		t.Fatalf("create KEK with no server: %v, want ErrUnreachable naming %s", err, addr)
	}
	w := crypt.WrappedKey{Provider: Name, KeyID: "1", Algorithm: crypt.AlgorithmGCM, Wrapped: make([]byte, nonceSize+crypt.DataKeySize+tagSize)}
	_, err = p.Unwrap(context.Background(), w)
	t.Logf("unreachable: %v", err)
	if !errors.Is(err, crypt.ErrUnreachable) || !strings.Contains(err.Error(), addr) {
		t.Fatalf("unwrap with no server: %v, want ErrUnreachable naming %s", err, addr)
	}
}
