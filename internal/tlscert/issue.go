package tlscert

import (
	"bytes"
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"time"
)

// ErrNotCA is returned by LoadAuthority for a certificate that cannot sign
// others, or a key that is not the certificate's.
var ErrNotCA = errors.New("not a CA certificate with its key")

// Authority is a certificate authority that issues the certificates of a
// quiver cluster's etcd (quiver cluster certs): ECDSA P-256 keys, PEM
// encoded, the keys in PKCS #8.
type Authority struct {
	Cert    *x509.Certificate
	CertPEM []byte
	key     crypto.Signer
}

// NewAuthority makes a self-signed CA named name, valid from now for
// validFor, and returns it with its PEM key.
func NewAuthority(name string, validFor time.Duration) (*Authority, []byte, error) {
	key, keyPEM, err := newKeyPEM()
	if err != nil {
		return nil, nil, err
	}
	tmpl, err := template(name, validFor)
	if err != nil {
		return nil, nil, err
	}
	tmpl.IsCA, tmpl.BasicConstraintsValid = true, true
	tmpl.MaxPathLenZero = true // it signs leaves only
	tmpl.KeyUsage = x509.KeyUsageCertSign | x509.KeyUsageCRLSign | x509.KeyUsageDigitalSignature
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		return nil, nil, fmt.Errorf("make CA certificate: %w", err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, nil, err
	}
	return &Authority{Cert: cert, CertPEM: pemBlock("CERTIFICATE", der), key: key}, keyPEM, nil
}

// LoadAuthority reads a CA from its PEM certificate and PEM key (as
// NewAuthority made them), to issue more certificates of it.
func LoadAuthority(certPEM, keyPEM []byte) (*Authority, error) {
	cb, _ := pem.Decode(certPEM)
	kb, _ := pem.Decode(keyPEM)
	if cb == nil || cb.Type != "CERTIFICATE" || kb == nil {
		return nil, fmt.Errorf("CA: want a PEM certificate and a PEM key: %w", ErrNotCA)
	}
	cert, err := x509.ParseCertificate(cb.Bytes)
	if err != nil {
		return nil, fmt.Errorf("CA certificate: %w", err)
	}
	k, err := x509.ParsePKCS8PrivateKey(kb.Bytes)
	if err != nil {
		return nil, fmt.Errorf("CA key: %w", err)
	}
	key, ok := k.(crypto.Signer)
	if !ok || !cert.IsCA || cert.KeyUsage&x509.KeyUsageCertSign == 0 {
		return nil, fmt.Errorf("CA %q: %w", cert.Subject.CommonName, ErrNotCA)
	}
	if pub, ok := key.Public().(interface{ Equal(crypto.PublicKey) bool }); !ok || !pub.Equal(cert.PublicKey) {
		return nil, fmt.Errorf("CA %q: the key is not the certificate's: %w", cert.Subject.CommonName, ErrNotCA)
	}
	return &Authority{Cert: cert, CertPEM: bytes.Clone(certPEM), key: key}, nil
}

// Usage says what an issued certificate is for.
type Usage int

const (
	// ServerAuth: a TLS server (etcd's client and peer listeners).
	ServerAuth Usage = 1 << iota
	// ClientAuth: a TLS client (a node's etcd client, an etcd member
	// dialing its peers, an admin's etcdctl).
	ClientAuth
)

// Issue makes a certificate named name for usage, valid from now for
// validFor (never past the CA's own end), with hosts (IP addresses or DNS
// names) as its subject alternative names, and returns it and its key in
// PEM.
func (a *Authority) Issue(name string, hosts []string, usage Usage, validFor time.Duration) (certPEM, keyPEM []byte, err error) {
	key, keyPEM, err := newKeyPEM()
	if err != nil {
		return nil, nil, err
	}
	tmpl, err := template(name, validFor)
	if err != nil {
		return nil, nil, err
	}
	if tmpl.NotAfter.After(a.Cert.NotAfter) {
		tmpl.NotAfter = a.Cert.NotAfter
	}
	tmpl.KeyUsage = x509.KeyUsageDigitalSignature
	if usage&ServerAuth != 0 {
		tmpl.ExtKeyUsage = append(tmpl.ExtKeyUsage, x509.ExtKeyUsageServerAuth)
	}
	if usage&ClientAuth != 0 {
		tmpl.ExtKeyUsage = append(tmpl.ExtKeyUsage, x509.ExtKeyUsageClientAuth)
	}
	for _, h := range hosts {
		if ip := net.ParseIP(h); ip != nil {
			tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
		} else {
			tmpl.DNSNames = append(tmpl.DNSNames, h)
		}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, a.Cert, key.Public(), a.key)
	if err != nil {
		return nil, nil, fmt.Errorf("issue certificate %q: %w", name, err)
	}
	return pemBlock("CERTIFICATE", der), keyPEM, nil
}

// template is a certificate named name, valid from a few minutes ago (for
// clocks a little behind) for validFor, with a random serial number.
func template(name string, validFor time.Duration) (*x509.Certificate, error) {
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		return nil, fmt.Errorf("serial number: %w", err)
	}
	now := time.Now()
	return &x509.Certificate{SerialNumber: serial, Subject: pkix.Name{CommonName: name},
		NotBefore: now.Add(-5 * time.Minute), NotAfter: now.Add(validFor)}, nil
}

func newKeyPEM() (crypto.Signer, []byte, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, fmt.Errorf("make key: %w", err)
	}
	der, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, nil, err
	}
	return key, pemBlock("PRIVATE KEY", der), nil
}

func pemBlock(typ string, der []byte) []byte {
	return pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der})
}
