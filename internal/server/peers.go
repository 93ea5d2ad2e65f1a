package server

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"os"

	"github.com/quiverstorage/quiver/internal/apiserver"
)

// peers is what a cluster node needs to carry API requests to the primary
// of a volume (apiserver.Peers, docs/cluster.md "Any node's API"): the hop
// key from the cluster token, and, when the API is served over HTTPS, the
// roots the peers' certificates are checked against: the system's, and
// every certificate of this node's own --tls-cert file (its leaf and the
// chain it carries), so that nodes whose certificates share a CA, or share
// one certificate, trust each other with no flag more.
func peers(cfg Config, node string) (*apiserver.Peers, error) {
	key, err := cfg.Cluster.PeerKey()
	if err != nil {
		return nil, err
	}
	p := &apiserver.Peers{Node: node, Key: key, Scheme: "http"}
	var tc *tls.Config
	if cfg.TLS.CertFile != "" {
		roots, err := x509.SystemCertPool()
		if err != nil || roots == nil {
			roots = x509.NewCertPool()
		}
		b, err := os.ReadFile(cfg.TLS.CertFile)
		if err != nil {
			return nil, fmt.Errorf("peer roots: %w", err)
		}
		for blk, rest := pem.Decode(b); blk != nil; blk, rest = pem.Decode(rest) {
			if blk.Type != "CERTIFICATE" {
				continue
			}
			c, err := x509.ParseCertificate(blk.Bytes)
			if err != nil {
				return nil, fmt.Errorf("peer roots: %s: %w", cfg.TLS.CertFile, err)
			}
			roots.AddCert(c)
		}
		tc = &tls.Config{RootCAs: roots, MinVersion: tls.VersionTLS12}
		p.Scheme = "https"
	}
	p.Client = apiserver.PeerClient(tc)
	return p, nil
}
