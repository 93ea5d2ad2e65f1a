package tlscert

import (
	"crypto/x509"
	"encoding/pem"
	"errors"
	"testing"
	"time"
)

// TestLoadAuthority reads back a CA that NewAuthority made, and refuses a
// CA with another CA's key and a leaf certificate as a CA.
func TestLoadAuthority(t *testing.T) {
	ca, key, err := NewAuthority("a", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	_, otherKey, err := NewAuthority("b", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	again, err := LoadAuthority(ca.CertPEM, key)
	if err != nil {
		t.Fatal(err)
	}
	leaf, leafKey, err := again.Issue("n1", []string{"10.0.0.1"}, ServerAuth|ClientAuth, 48*time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	blk, _ := pem.Decode(leaf)
	cert, err := x509.ParseCertificate(blk.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	roots.AddCert(ca.Cert)
	if _, err := cert.Verify(x509.VerifyOptions{Roots: roots, DNSName: "10.0.0.1"}); err != nil {
		t.Errorf("a certificate of the loaded CA: %v", err)
	}
	if cert.NotAfter.After(ca.Cert.NotAfter) {
		t.Errorf("the certificate outlives its CA: %v > %v", cert.NotAfter, ca.Cert.NotAfter)
	}
	for _, c := range []struct {
		name      string
		cert, key []byte
	}{
		{"another CA's key", ca.CertPEM, otherKey},
		{"a leaf", leaf, leafKey},
		{"no PEM", []byte("x"), key},
	} {
		if _, err := LoadAuthority(c.cert, c.key); !errors.Is(err, ErrNotCA) {
			t.Errorf("%s: %v, want ErrNotCA", c.name, err)
		}
	}
}
