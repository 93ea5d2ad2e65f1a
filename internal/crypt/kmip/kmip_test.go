package kmip

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/quiverstorage/quiver/internal/crypt"
	"github.com/quiverstorage/quiver/internal/crypt/keyfile"
	"github.com/quiverstorage/quiver/internal/tlscert/certtest"
)

// pykmip is a PyKMIP server (Debian's python3-pykmip) on loopback, with TLS
// client authentication and an SQLite database that outlives a restart.
type pykmip struct {
	t      *testing.T
	dir    string
	addr   string
	client *tls.Config
	cmd    *exec.Cmd
}

func startPyKMIP(t *testing.T) *pykmip {
	t.Helper()
	bin, err := exec.LookPath("pykmip-server")
	if err != nil {
		if os.Getenv("CI") != "" {
			t.Fatal("pykmip-server missing (Debian package python3-pykmip)")
		}
		t.Skip("pykmip-server missing (Debian package python3-pykmip)")
	}
	dir := t.TempDir()
	if err := os.Mkdir(filepath.Join(dir, "server"), 0o700); err != nil {
		t.Fatal(err)
	}
	ca := certtest.NewCA(t, "quiver test KMS CA")
	serverCert, serverKey := ca.Server(t, false, "127.0.0.1").Write(t, filepath.Join(dir, "server"))
	clientPair := ca.Client(t, "quiver-node")
	caFile := filepath.Join(dir, "ca.pem")
	if err := os.WriteFile(caFile, ca.PEM, 0o600); err != nil {
		t.Fatal(err)
	}
	policies := filepath.Join(dir, "policies")
	if err := os.Mkdir(policies, 0o700); err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	_ = l.Close()
	host, port, _ := net.SplitHostPort(addr)
	conf := fmt.Sprintf(`[server]
hostname=%s
port=%s
certificate_path=%s
key_path=%s
ca_path=%s
auth_suite=TLS1.2
policy_path=%s
enable_tls_client_auth=True
tls_cipher_suites=TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256
logging_level=INFO
database_path=%s
`, host, port, serverCert, serverKey, caFile, policies, filepath.Join(dir, "pykmip.db"))
	if err := os.WriteFile(filepath.Join(dir, "server.conf"), []byte(conf), 0o600); err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	roots.AddCert(ca.Cert)
	cert, err := tls.X509KeyPair(clientPair.Cert, clientPair.Key)
	if err != nil {
		t.Fatal(err)
	}
	s := &pykmip{t: t, dir: dir, addr: addr,
		client: &tls.Config{RootCAs: roots, Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}}
	s.start(bin)
	t.Cleanup(s.stop)
	return s
}

func (s *pykmip) start(bin string) {
	s.t.Helper()
	s.cmd = exec.Command(bin, "-f", filepath.Join(s.dir, "server.conf"), "-l", filepath.Join(s.dir, "server.log"))
	s.cmd.Stdout, s.cmd.Stderr = nil, nil
	if err := s.cmd.Start(); err != nil {
		s.t.Fatal(err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		c, err := net.DialTimeout("tcp", s.addr, time.Second)
		if err == nil {
			_ = c.Close()
			return
		}
		if time.Now().After(deadline) {
			log, _ := os.ReadFile(filepath.Join(s.dir, "server.log"))
			s.t.Fatalf("pykmip-server not listening on %s after 30 s: %v\n%s", s.addr, err, log)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// stop kills the server (its SIGTERM waits up to 10 s for its accept loop):
// what the KMS stored is in its database already, committed per operation.
func (s *pykmip) stop() {
	if s.cmd == nil {
		return
	}
	_ = s.cmd.Process.Kill()
	_ = s.cmd.Wait()
	s.cmd = nil
}

func (s *pykmip) restart() {
	s.stop()
	bin, _ := exec.LookPath("pykmip-server")
	s.start(bin)
}

func (s *pykmip) provider(t *testing.T) *Provider {
	t.Helper()
	p, err := New(Config{Addr: s.addr, TLS: s.client, Timeout: 10 * time.Second})
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
	s := startPyKMIP(t)
	dk, w, err := crypt.NewVMKey(ctx, s.provider(t))
	if err != nil {
		t.Fatalf("new VM key: %v\n%s", err, s.log())
	}
	manifest, err := json.Marshal(w)
	if err != nil {
		t.Fatal(err)
	}

	s.restart()
	var back crypt.WrappedKey
	if err := json.Unmarshal(manifest, &back); err != nil {
		t.Fatal(err)
	}
	p := s.provider(t) // a new client: the node restarted too
	got, err := p.Unwrap(ctx, back)
	if err != nil {
		t.Fatalf("unwrap after restarts: %v\n%s", err, s.log())
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
	s := startPyKMIP(t)
	other := certtest.NewCA(t, "another CA")
	roots := x509.NewCertPool()
	roots.AddCert(other.Cert)
	wrong := s.client.Clone()
	wrong.RootCAs = roots
	p, err := New(Config{Addr: s.addr, TLS: wrong})
	if err != nil {
		t.Fatal(err)
	}
	_, err = p.CreateKEK(ctx)
	if err == nil || errors.Is(err, crypt.ErrUnreachable) || !strings.Contains(err.Error(), s.addr) ||
		!strings.Contains(err.Error(), "TLS") {
		t.Fatalf("untrusted server: %v, want a TLS error naming %s", err, s.addr)
	}
	pair := other.Client(t, "intruder")
	cert, err := tls.X509KeyPair(pair.Cert, pair.Key)
	if err != nil {
		t.Fatal(err)
	}
	intruder := s.client.Clone()
	intruder.Certificates = []tls.Certificate{cert}
	p, err = New(Config{Addr: s.addr, TLS: intruder, Timeout: 5 * time.Second})
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
	s := startPyKMIP(t)
	kf, err := keyfile.Open(filepath.Join(t.TempDir(), "keks.json"))
	if err != nil {
		t.Fatal(err)
	}
	dk, w, err := crypt.NewVMKey(ctx, kf)
	if err != nil {
		t.Fatal(err)
	}
	p := s.provider(t)
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

func (s *pykmip) log() string {
	b, _ := os.ReadFile(filepath.Join(s.dir, "server.log"))
	if len(b) > 4000 {
		b = b[len(b)-4000:]
	}
	return string(b)
}
