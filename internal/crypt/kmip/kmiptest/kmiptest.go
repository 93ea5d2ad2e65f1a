// Package kmiptest runs a PyKMIP server (Debian's python3-pykmip) on
// loopback for tests: with a CA of its own, a server certificate, TLS client
// authentication and an SQLite database that outlives a restart. The
// client's certificate, key and the CA are written as PEM files too, for
// tests that hand them to a `quiver server` process.
//
// Imports from quiver: tlscert/certtest, testfs.
package kmiptest

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/quiverstorage/quiver/internal/testfs"
	"github.com/quiverstorage/quiver/internal/tlscert/certtest"
)

// Server is a PyKMIP server run by a test.
type Server struct {
	// Addr is the server's 127.0.0.1:port.
	Addr string
	// CAFile is the PEM CA of the server's certificate (and of the
	// client's); CertFile and KeyFile are the client's certificate and key.
	CAFile, CertFile, KeyFile string
	// TLS is the client's configuration made of those files.
	TLS *tls.Config
	// CA issued the server's and the client's certificates.
	CA *certtest.CA

	t   testing.TB
	dir string
	bin string
	cmd *exec.Cmd
}

// Start starts a PyKMIP server for t and stops it at t's cleanup. Without
// pykmip-server the test skips, or fails when CI is set.
func Start(t testing.TB) *Server {
	t.Helper()
	testfs.RequireTool(t, "pykmip-server")
	bin, err := exec.LookPath("pykmip-server")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	for _, d := range []string{"server", "client", "policies"} {
		if err := os.Mkdir(filepath.Join(dir, d), 0o700); err != nil {
			t.Fatal(err)
		}
	}
	ca := certtest.NewCA(t, "quiver test KMS CA")
	serverCert, serverKey := ca.Server(t, false, "127.0.0.1").Write(t, filepath.Join(dir, "server"))
	client := ca.Client(t, "quiver-node")
	certFile, keyFile := client.Write(t, filepath.Join(dir, "client"))
	caFile := filepath.Join(dir, "ca.pem")
	certtest.WriteFile(t, caFile, ca.PEM)

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
`, host, port, serverCert, serverKey, caFile, filepath.Join(dir, "policies"), filepath.Join(dir, "pykmip.db"))
	certtest.WriteFile(t, filepath.Join(dir, "server.conf"), []byte(conf))

	roots := x509.NewCertPool()
	roots.AddCert(ca.Cert)
	cert, err := tls.X509KeyPair(client.Cert, client.Key)
	if err != nil {
		t.Fatal(err)
	}
	s := &Server{Addr: addr, CAFile: caFile, CertFile: certFile, KeyFile: keyFile, CA: ca,
		TLS: &tls.Config{RootCAs: roots, Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12},
		t:   t, dir: dir, bin: bin}
	s.Start()
	t.Cleanup(s.Stop)
	return s
}

// Start starts the server again after Stop, on the same address and
// database, and returns once it accepts connections.
func (s *Server) Start() {
	s.t.Helper()
	if s.cmd != nil {
		s.t.Fatal("kmiptest: the server runs already")
	}
	s.cmd = exec.Command(s.bin, "-f", filepath.Join(s.dir, "server.conf"), "-l", filepath.Join(s.dir, "server.log"))
	// pykmip-server forks a child (its policy monitor) that a kill of the
	// server alone leaves running: the server gets a process group of its
	// own, which Stop kills whole.
	s.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := s.cmd.Start(); err != nil {
		s.t.Fatal(err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		c, err := net.DialTimeout("tcp", s.Addr, time.Second)
		if err == nil {
			_ = c.Close()
			return
		}
		if time.Now().After(deadline) {
			s.t.Fatalf("pykmip-server not listening on %s after 30 s: %v\n%s", s.Addr, err, s.Log())
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// Stop kills the server (its SIGTERM waits up to 10 s for its accept loop):
// what it stored is in its database already, committed per operation. A
// stopped server stays stopped.
func (s *Server) Stop() {
	if s.cmd == nil {
		return
	}
	_ = syscall.Kill(-s.cmd.Process.Pid, syscall.SIGKILL)
	_ = s.cmd.Wait()
	s.cmd = nil
}

// Restart stops the server and starts it again.
func (s *Server) Restart() {
	s.t.Helper()
	s.Stop()
	s.Start()
}

// Log returns the tail of the server's log.
func (s *Server) Log() string {
	b, _ := os.ReadFile(filepath.Join(s.dir, "server.log"))
	if len(b) > 4000 {
		b = b[len(b)-4000:]
	}
	return string(b)
}
