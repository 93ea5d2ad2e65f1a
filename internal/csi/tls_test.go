package csi

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"testing"

	"github.com/quiverstorage/quiver/internal/api"
	"github.com/quiverstorage/quiver/internal/tlscert/certtest"
)

// TestCAFile: with Config.CAFile the driver's API client trusts that CA
// for an https:// server, and without it the server is not trusted.
func TestCAFile(t *testing.T) {
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_ = json.NewEncoder(w).Encode(api.PoolInfo{ID: "p1"})
	}))
	t.Cleanup(srv.Close)
	caFile := filepath.Join(t.TempDir(), "ca.pem")
	if err := os.WriteFile(caFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw}), 0o600); err != nil {
		t.Fatal(err)
	}
	c, err := newClient(Config{Server: srv.URL, CAFile: caFile, HTTPClient: &http.Client{}}, "")
	if err != nil {
		t.Fatal(err)
	}
	if info, err := c.Pool(t.Context()); err != nil || info.ID != "p1" {
		t.Fatalf("Pool with --ca-file: %+v, %v", info, err)
	}
	c, err = newClient(Config{Server: srv.URL, HTTPClient: &http.Client{}}, "")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Pool(t.Context()); err == nil {
		t.Fatal("Pool without --ca-file trusted the test CA")
	}
	if _, err := newClient(Config{Server: srv.URL, CAFile: filepath.Join(t.TempDir(), "none.pem")}, ""); err == nil {
		t.Fatal("a missing CA file: no error")
	}
}

// TestClientCertificate: with Config.CertFile and KeyFile the driver's API
// client presents that certificate, which a server requiring one of its
// CA sees; without them the handshake fails.
func TestClientCertificate(t *testing.T) {
	clientCA := certtest.NewCA(t, "clients")
	cas := x509.NewCertPool()
	cas.AddCert(clientCA.Cert)
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_ = json.NewEncoder(w).Encode(api.PoolInfo{ID: r.TLS.VerifiedChains[0][0].Subject.CommonName})
	}))
	srv.TLS = &tls.Config{ClientAuth: tls.RequireAndVerifyClientCert, ClientCAs: cas}
	srv.StartTLS()
	t.Cleanup(srv.Close)
	dir := t.TempDir()
	caFile := filepath.Join(dir, "ca.pem")
	certtest.WriteFile(t, caFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw}))
	certFile, keyFile := clientCA.Client(t, "csi-node-1").Write(t, dir)

	c, err := newClient(Config{Server: srv.URL, CAFile: caFile, CertFile: certFile, KeyFile: keyFile, HTTPClient: &http.Client{}}, "")
	if err != nil {
		t.Fatal(err)
	}
	if info, err := c.Pool(t.Context()); err != nil || info.ID != "csi-node-1" {
		t.Fatalf("Pool with a client certificate: %+v, %v", info, err)
	}
	c, err = newClient(Config{Server: srv.URL, CAFile: caFile, HTTPClient: &http.Client{}}, "")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Pool(t.Context()); err == nil {
		t.Fatal("a server requiring a client certificate answered a plugin without one")
	}
	if _, err := newClient(Config{Server: srv.URL, CertFile: certFile}, ""); err == nil {
		t.Fatal("a certificate without its key: no error")
	}
}
