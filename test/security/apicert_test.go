package security

import (
	"bufio"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/quiverstorage/quiver/internal/api"
	"github.com/quiverstorage/quiver/internal/client"
	"github.com/quiverstorage/quiver/internal/testfs"
	"github.com/quiverstorage/quiver/internal/tlscert/certtest"
)

// forcedCert is a client configuration that sends pair whatever CAs the
// server asks for (Go's client would otherwise send no certificate the
// server's CAs did not issue), so the server has to refuse it itself.
func (n *tenantNode) forcedCert(t *testing.T, pair certtest.Pair) *tls.Config {
	t.Helper()
	kp, err := tls.X509KeyPair(pair.Cert, pair.Key)
	if err != nil {
		t.Fatal(err)
	}
	return &tls.Config{RootCAs: n.roots, GetClientCertificate: func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
		return &kp, nil
	}}
}

// mapCert makes a certificate token of tenant a with role for pair.
func (n *tenantNode) mapCert(t *testing.T, pair certtest.Pair, role, description string) {
	t.Helper()
	if _, err := n.admin.CreateToken(context.Background(), api.TokenSpec{Tenant: "a", Role: role, Description: description,
		Certificate: string(pair.Cert)}); err != nil {
		t.Fatalf("map %s: %v", description, err)
	}
}

// refusedCert wants a GET of path with cfg refused: at the handshake, or
// with 401.
func (n *tenantNode) refusedCert(cfg *tls.Config, path string) error {
	hc := &http.Client{Transport: &http.Transport{TLSClientConfig: cfg}, Timeout: 30 * time.Second}
	defer hc.CloseIdleConnections()
	resp, err := hc.Get("https://" + n.srv.APIAddr + path)
	if err != nil {
		var cv *tls.CertificateVerificationError
		if strings.Contains(err.Error(), "tls: ") || errors.As(err, &cv) {
			return nil // refused at the handshake
		}
		return fmt.Errorf("GET %s: %v, want a refused handshake or 401", path, err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusUnauthorized {
		return fmt.Errorf("GET %s: %d %s, want a refused handshake or 401", path, resp.StatusCode, body)
	}
	return nil
}

// TestAPIClientCertificates: the API takes a client certificate mapped to
// a token as that token (issue 17, TLS and tenants): certificates of
// another CA and expired ones, both mapped to tokens, are refused; the CLI
// works with --cert-file and --key-file and no token, and so does curl
// --cert; a new client CA, reloaded on SIGHUP, applies to the API.
func TestAPIClientCertificates(t *testing.T) {
	n := startTenantNode(t)
	ctx := context.Background()
	if _, err := n.as["a/tenant"].CreateVolume(ctx, volume1("va")); err != nil {
		t.Fatal(err)
	}
	if _, err := n.as["b/tenant"].CreateVolume(ctx, volume1("vb")); err != nil {
		t.Fatal(err)
	}

	t.Run("wrong CA and expired", func(t *testing.T) {
		other := certtest.NewCA(t, "other CA").Client(t, "other")
		expired := n.clientCA.ExpiredClient(t, "expired")
		n.mapCert(t, other, "tenant", "other CA's")
		n.mapCert(t, expired, "tenant", "expired")
		for what, pair := range map[string]certtest.Pair{"another CA's certificate": other, "an expired certificate": expired} {
			if err := n.refusedCert(n.forcedCert(t, pair), "/v1/volumes/va"); err != nil {
				t.Errorf("%s (mapped to a's tenant token): %v", what, err)
			}
		}
		// A good one, forced the same way, gets in: the refusals are the
		// certificates', not the way they were sent.
		good := n.clientCA.Client(t, "good")
		n.mapCert(t, good, "monitor", "good")
		hc := &http.Client{Transport: &http.Transport{TLSClientConfig: n.forcedCert(t, good)}, Timeout: 30 * time.Second}
		resp, err := hc.Get("https://" + n.srv.APIAddr + "/v1/volumes/va")
		if err != nil || resp.StatusCode != http.StatusOK {
			t.Fatalf("a good certificate sent the same way: %v %v", resp, err)
		}
		resp.Body.Close()
	})

	dir := n.certDirs["cert:a/tenant"] // ca-cert.pem holds the server's CA
	caFile, certFile, keyFile := filepath.Join(dir, "ca-cert.pem"), filepath.Join(dir, "client-cert.pem"), filepath.Join(dir, "client-key.pem")
	t.Run("CLI", func(t *testing.T) {
		quiver := func(args ...string) (string, error) {
			cmd := exec.Command(quiverBin, append([]string{"--server", "https://" + n.srv.APIAddr, "--ca-file", caFile}, args...)...)
			cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "HOME=" + t.TempDir()} // no QUIVER_TOKEN_FILE
			out, err := cmd.CombinedOutput()
			return string(out), err
		}
		withCert := func(args ...string) string {
			t.Helper()
			out, err := quiver(append([]string{"--cert-file", certFile, "--key-file", keyFile}, args...)...)
			if err != nil {
				t.Fatalf("quiver %s with a's certificate: %v\n%s", strings.Join(args, " "), err, out)
			}
			return out
		}
		withCert("volume", "create", "cli", "--capacity", "1Mi", "--disk", "root=1Mi")
		withCert("snapshot", "create", "cli", "s1")
		if out := withCert("volume", "list"); !strings.Contains(out, "cli") || !strings.Contains(out, "va") || strings.Contains(out, "vb") {
			t.Errorf("quiver volume list with a's certificate: want cli and va, not b's vb:\n%s", out)
		}
		var v api.Volume
		if err := json.Unmarshal([]byte(withCert("volume", "get", "cli", "-o", "json")), &v); err != nil || v.Name != "cli" || v.Tenant != "a" {
			t.Errorf("quiver volume get cli with a's certificate: %+v %v, want a's cli", v, err)
		}
		if out, err := quiver("--cert-file", certFile, "--key-file", keyFile, "volume", "delete", "vb", "--recursive"); err == nil ||
			!strings.Contains(out, "not found") {
			t.Errorf("quiver volume delete vb with a's certificate: %v, want not found\n%s", err, out)
		}
		withCert("volume", "delete", "cli", "--recursive")
		if v, err := n.admin.GetVolume(ctx, "a--cli"); !client.IsNotFound(err) {
			t.Errorf("a--cli after the CLI deleted it: %+v %v", v, err)
		}
		out, err := quiver("volume", "list")
		if err == nil || !strings.Contains(out, "--cert-file") {
			t.Errorf("quiver volume list without a credential: %v, want a 401 with a hint naming --cert-file\n%s", err, out)
		}
		if out, err := quiver("--cert-file", certFile, "volume", "list"); err == nil || !strings.Contains(out, "--key-file") {
			t.Errorf("--cert-file without --key-file: %v\n%s", err, out)
		}
	})

	t.Run("curl", func(t *testing.T) {
		testfs.RequireTool(t, "curl")
		curl := func(k string, path string) (string, error) {
			d := n.certDirs[k]
			out, err := exec.Command("curl", "-sS", "--fail-with-body", "--cacert", filepath.Join(d, "ca-cert.pem"),
				"--cert", filepath.Join(d, "client-cert.pem"), "--key", filepath.Join(d, "client-key.pem"),
				"https://"+n.srv.APIAddr+path).CombinedOutput()
			return string(out), err
		}
		out, err := curl("cert:a/attach", "/v1/volumes")
		if err != nil {
			t.Fatalf("curl --cert with a's attach certificate: %v\n%s", err, out)
		}
		var list struct {
			Items []api.Volume `json:"items"`
		}
		err = json.Unmarshal([]byte(out), &list)
		if vs := list.Items; err != nil || len(vs) != 1 || vs[0].Name != "va" || vs[0].Tenant != "a" {
			t.Errorf("curl --cert lists %s (%v), want a's va alone", out, err)
		}
		if out, err := curl("cert:none", "/v1/volumes"); err == nil || !strings.Contains(out, api.CodeUnauthorized) {
			t.Errorf("curl --cert with a certificate of no token: %v, want 401\n%s", err, out)
		}
	})

	t.Run("revocation closes a kept-alive connection", func(t *testing.T) {
		conn, err := tls.Dial("tcp", n.srv.APIAddr, n.certs["cert:a/attach"])
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		r := bufio.NewReader(conn)
		fmt.Fprint(conn, "GET /v1/volumes/va HTTP/1.1\r\nHost: x\r\n\r\n")
		resp, err := http.ReadResponse(r, nil)
		if err != nil || resp.StatusCode != http.StatusOK {
			t.Fatalf("GET with the certificate: %v %v", resp, err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		closed := make(chan time.Time, 1)
		go func() {
			_ = conn.SetReadDeadline(time.Now().Add(30 * time.Second))
			_, _ = io.Copy(io.Discard, r) // ends when the server closes
			closed <- time.Now()
		}()
		if err := n.admin.RevokeToken(ctx, n.tokenID(t, "cert:a/attach")); err != nil {
			t.Fatal(err)
		}
		revoked := time.Now()
		took := max(0, (<-closed).Sub(revoked))
		t.Logf("the certificate's API connection closed %v after the revocation returned", took)
		if took > time.Second {
			t.Errorf("closed %v after the revocation, want within 1 s", took)
		}
		if _, err := n.certAs["cert:a/attach"].GetVolume(ctx, "va"); !client.IsUnauthorized(err) {
			t.Errorf("the certificate's next request: %v, want 401", err)
		}
	})

	t.Run("client CA reload", func(t *testing.T) {
		newCA := certtest.NewCA(t, "new clients CA")
		fresh := newCA.Client(t, "fresh")
		n.mapCert(t, fresh, "tenant", "fresh")
		freshCfg := n.forcedCert(t, fresh)
		if err := n.refusedCert(freshCfg, "/v1/volumes/va"); err != nil {
			t.Fatalf("a certificate of a CA not yet in the file: %v", err)
		}
		certtest.WriteFile(t, n.clientCAFile, newCA.PEM)
		before := strings.Count(n.srv.Log.String(), "TLS certificate reloaded")
		if err := n.srv.Signal(syscall.SIGHUP); err != nil {
			t.Fatal(err)
		}
		for deadline := time.Now().Add(10 * time.Second); strings.Count(n.srv.Log.String(), "TLS certificate reloaded") < before+3; {
			if time.Now().After(deadline) {
				t.Fatalf("no reload logged:\n%s", n.srv.Log.String())
			}
			time.Sleep(10 * time.Millisecond)
		}
		c, err := client.New("https://"+n.srv.APIAddr, client.WithTLSConfig(freshCfg))
		if err != nil {
			t.Fatal(err)
		}
		if v, err := c.GetVolume(ctx, "va"); err != nil || v.Tenant != "a" {
			t.Errorf("a certificate of the new CA after the reload: %+v %v", v, err)
		}
		if err := n.refusedCert(n.forcedCert(t, filePair(t, n.certDirs["cert:a/tenant"])), "/v1/volumes/va"); err != nil {
			t.Errorf("a certificate of the removed CA after the reload: %v", err)
		}
	})
}

// filePair reads the client pair of a certtest.ClientDir.
func filePair(t *testing.T, dir string) certtest.Pair {
	t.Helper()
	c, err := os.ReadFile(filepath.Join(dir, "client-cert.pem"))
	if err != nil {
		t.Fatal(err)
	}
	k, err := os.ReadFile(filepath.Join(dir, "client-key.pem"))
	if err != nil {
		t.Fatal(err)
	}
	return certtest.Pair{Cert: c, Key: k}
}

// TestAPIClientCertRequired: a server process with --api-client-cert
// require refuses, at the TLS handshake, a client without a certificate
// (with a good token too) and one whose certificate another CA issued
// (mapped to a token), and serves a client whose certificate of the client
// CA is mapped to a tenant's token, as that tenant.
func TestAPIClientCertRequired(t *testing.T) {
	n := startTenantNodeWith(t, "require")
	ctx := context.Background()
	if _, err := n.as["a/tenant"].CreateVolume(ctx, volume1("va")); err != nil {
		t.Fatalf("a's token with a certificate of no token: %v", err)
	}
	// refusedAtHandshake wants a GET with cfg (and token, if any) to fail
	// in the handshake: no HTTP answer at all, not even a 401.
	refusedAtHandshake := func(what string, cfg *tls.Config, token string) {
		t.Helper()
		hc := &http.Client{Transport: &http.Transport{TLSClientConfig: cfg}, Timeout: 30 * time.Second}
		defer hc.CloseIdleConnections()
		req, err := http.NewRequest(http.MethodGet, "https://"+n.srv.APIAddr+"/v1/volumes/va", nil)
		if err != nil {
			t.Fatal(err)
		}
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		resp, err := hc.Do(req)
		if err == nil {
			resp.Body.Close()
			t.Errorf("%s: %d, want a refused handshake", what, resp.StatusCode)
			return
		}
		if !strings.Contains(err.Error(), "tls: ") {
			t.Errorf("%s: %v, want a refused handshake", what, err)
			return
		}
		t.Logf("%s: %v", what, err)
	}
	refusedAtHandshake("no certificate", &tls.Config{RootCAs: n.roots}, "")
	refusedAtHandshake("no certificate with a's token", &tls.Config{RootCAs: n.roots}, n.secret["a/tenant"])
	other := certtest.NewCA(t, "other CA").Client(t, "other")
	n.mapCert(t, other, "tenant", "other CA's")
	refusedAtHandshake("another CA's certificate mapped to a's token", n.forcedCert(t, other), "")

	v, err := n.certAs["cert:a/tenant"].GetVolume(ctx, "va")
	if err != nil || v.Tenant != "a" || v.Name != "va" {
		t.Fatalf("a's mapped certificate: %+v %v, want a's va", v, err)
	}
	if _, err := n.certAs["cert:b/attach"].GetVolume(ctx, "va"); !client.IsNotFound(err) {
		t.Errorf("b's mapped certificate gets a's va: %v, want not found", err)
	}
}
