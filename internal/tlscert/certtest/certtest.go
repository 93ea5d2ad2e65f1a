// Package certtest makes X.509 certificates for tests: a CA, server
// certificates for chosen host names (valid, expired), and client
// certificates, written as PEM files in the layouts that quiver, QEMU's
// tls-creds-x509 and libnbd read.
//
// Imports from quiver: nothing.
package certtest

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// CA is a certificate authority.
type CA struct {
	Cert *x509.Certificate
	PEM  []byte
	key  *ecdsa.PrivateKey
}

// Pair is a PEM certificate and its PEM key.
type Pair struct{ Cert, Key []byte }

// NewCA makes a self-signed CA named name.
func NewCA(t testing.TB, name string) *CA {
	t.Helper()
	key := newKey(t)
	tmpl := &x509.Certificate{
		SerialNumber:          serial(t),
		Subject:               pkix.Name{CommonName: name},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(24 * time.Hour),
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return &CA{Cert: cert, PEM: pemBlock("CERTIFICATE", der), key: key}
}

// Server issues a server certificate for hosts (IP addresses or DNS
// names), valid from now for a day, or expired an hour ago.
func (ca *CA) Server(t testing.TB, expired bool, hosts ...string) Pair {
	t.Helper()
	tmpl := ca.template(t, hosts[0], expired)
	tmpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}
	for _, h := range hosts {
		if ip := net.ParseIP(h); ip != nil {
			tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
		} else {
			tmpl.DNSNames = append(tmpl.DNSNames, h)
		}
	}
	return ca.issue(t, tmpl)
}

// Client issues a client certificate named name, valid from now for a day.
func (ca *CA) Client(t testing.TB, name string) Pair {
	t.Helper()
	return ca.client(t, name, false)
}

// ExpiredClient issues a client certificate named name that expired an
// hour ago.
func (ca *CA) ExpiredClient(t testing.TB, name string) Pair {
	t.Helper()
	return ca.client(t, name, true)
}

func (ca *CA) client(t testing.TB, name string, expired bool) Pair {
	t.Helper()
	tmpl := ca.template(t, name, expired)
	tmpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}
	return ca.issue(t, tmpl)
}

func (ca *CA) template(t testing.TB, cn string, expired bool) *x509.Certificate {
	notBefore, notAfter := time.Now().Add(-time.Hour), time.Now().Add(24*time.Hour)
	if expired {
		notBefore, notAfter = time.Now().Add(-48*time.Hour), time.Now().Add(-time.Hour)
	}
	return &x509.Certificate{
		SerialNumber: serial(t),
		Subject:      pkix.Name{CommonName: cn},
		NotBefore:    notBefore,
		NotAfter:     notAfter,
		KeyUsage:     x509.KeyUsageDigitalSignature,
	}
}

func (ca *CA) issue(t testing.TB, tmpl *x509.Certificate) Pair {
	t.Helper()
	key := newKey(t)
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.Cert, &key.PublicKey, ca.key)
	if err != nil {
		t.Fatal(err)
	}
	kder, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	return Pair{Cert: pemBlock("CERTIFICATE", der), Key: pemBlock("PRIVATE KEY", kder)}
}

// Write writes the pair as dir/cert.pem and dir/key.pem (replacing them
// with a rename each, as a rotation would) and returns their paths.
func (p Pair) Write(t testing.TB, dir string) (certFile, keyFile string) {
	t.Helper()
	certFile, keyFile = filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	WriteFile(t, keyFile, p.Key)
	WriteFile(t, certFile, p.Cert)
	return certFile, keyFile
}

// ClientDir makes a directory in the layout of QEMU's tls-creds-x509
// (endpoint=client) and libnbd's tls-certificates: ca-cert.pem (ca and
// more), and with a client pair client-cert.pem and client-key.pem. QEMU
// checks its own client certificate against ca-cert.pem too: pass the
// client's CA in more.
func ClientDir(t testing.TB, ca *CA, client *Pair, more ...*CA) string {
	t.Helper()
	dir := t.TempDir()
	cas := bytes.Clone(ca.PEM)
	for _, m := range more {
		cas = append(cas, m.PEM...)
	}
	WriteFile(t, filepath.Join(dir, "ca-cert.pem"), cas)
	if client != nil {
		WriteFile(t, filepath.Join(dir, "client-cert.pem"), client.Cert)
		WriteFile(t, filepath.Join(dir, "client-key.pem"), client.Key)
	}
	return dir
}

// WriteFile writes b to path through a temporary file and a rename.
func WriteFile(t testing.TB, path string, b []byte) {
	t.Helper()
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

func newKey(t testing.TB) *ecdsa.PrivateKey {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return key
}

func serial(t testing.TB) *big.Int {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 120))
	if err != nil {
		t.Fatal(err)
	}
	return n
}

func pemBlock(typ string, der []byte) []byte {
	return pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der})
}
