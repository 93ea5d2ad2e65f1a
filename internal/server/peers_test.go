package server

import (
	"bytes"
	"crypto/tls"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"testing"

	"github.com/quiverstorage/quiver/internal/cluster"
	"github.com/quiverstorage/quiver/internal/tlscert/certtest"
)

// TestPeers: a node's hops use HTTPS when its API does, trusting a peer
// whose certificate chains to a CA its own --tls-cert file carries, and no
// other; the hop key comes from the cluster token and name, never equal to
// the token.
func TestPeers(t *testing.T) {
	dir := t.TempDir()
	tokenFile := filepath.Join(dir, "token")
	if err := os.WriteFile(tokenFile, []byte("cluster-token-0123456789\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cc := cluster.Config{TokenFile: tokenFile, ClusterName: "alpha"}
	plain, err := peers(Config{Cluster: cc}, "n1")
	if err != nil {
		t.Fatal(err)
	}
	if plain.Scheme != "http" || len(plain.Key) != 32 || bytes.Contains([]byte("cluster-token-0123456789"), plain.Key) {
		t.Fatalf("plain peers: scheme %s, key %x", plain.Scheme, plain.Key)
	}
	other, _ := peers(Config{Cluster: cluster.Config{TokenFile: tokenFile, ClusterName: "beta"}}, "n1")
	if bytes.Equal(other.Key, plain.Key) {
		t.Fatal("two clusters with one token share the hop key")
	}

	ca, stranger := certtest.NewCA(t, "cluster CA"), certtest.NewCA(t, "another CA")
	peer := ca.Server(t, false, "127.0.0.1")
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	pair, err := tls.X509KeyPair(peer.Cert, peer.Key)
	if err != nil {
		t.Fatal(err)
	}
	srv.TLS = &tls.Config{Certificates: []tls.Certificate{pair}}
	srv.StartTLS()
	defer srv.Close()
	for _, tc := range []struct {
		name  string
		chain []byte // this node's --tls-cert file
		trust bool
	}{
		{"own leaf and the cluster's CA", append(ca.Server(t, false, "10.0.0.1").Cert, ca.PEM...), true},
		{"own leaf of another CA", append(stranger.Server(t, false, "10.0.0.1").Cert, stranger.PEM...), false},
	} {
		certFile := filepath.Join(t.TempDir(), "cert.pem")
		if err := os.WriteFile(certFile, tc.chain, 0o600); err != nil {
			t.Fatal(err)
		}
		p, err := peers(Config{Cluster: cc, TLS: TLSConfig{CertFile: certFile}}, "n1")
		if err != nil {
			t.Fatal(err)
		}
		if p.Scheme != "https" {
			t.Fatalf("%s: scheme %s", tc.name, p.Scheme)
		}
		resp, err := p.Client.Get(srv.URL)
		if err == nil {
			resp.Body.Close()
		}
		if (err == nil) != tc.trust {
			t.Errorf("%s: a peer with a certificate of the cluster's CA: %v, want trusted %v", tc.name, err, tc.trust)
		}
	}
}
