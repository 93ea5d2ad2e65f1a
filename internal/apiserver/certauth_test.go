package apiserver

import (
	"bufio"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/quiverstorage/quiver/internal/api"
	"github.com/quiverstorage/quiver/internal/auth"
	"github.com/quiverstorage/quiver/internal/tlscert/certtest"
)

// certAPI is the API over HTTPS asking for client certificates of one CA
// (as --api-client-cert on does), with certificate tokens.
type certAPI struct {
	s      *Server
	store  *auth.Store
	srv    *httptest.Server
	roots  *x509.CertPool
	certs  map[string]tls.Certificate // "a/tenant", "a/attach", "b/tenant" (mapped), "none" (not mapped)
	secret map[string]string          // "a/tenant", "b/tenant"
	ids    map[string]string          // token IDs of the certificates' and secrets' tokens, "cert:..." and "..."
}

func startCertAPI(t *testing.T, fileToken string, requireToken bool) *certAPI {
	t.Helper()
	s, p := newTestAPI(t, fileToken)
	store, err := auth.Open(p.FS(), false)
	if err != nil {
		t.Fatal(err)
	}
	s.Auth, s.RequireToken = store, requireToken
	ca := certtest.NewCA(t, "clients")
	cas := x509.NewCertPool()
	cas.AddCert(ca.Cert)
	c := &certAPI{s: s, store: store, certs: map[string]tls.Certificate{}, secret: map[string]string{}, ids: map[string]string{}}
	for _, k := range []string{"a/tenant", "a/attach", "b/tenant", "none"} {
		pair := ca.Client(t, strings.ReplaceAll(k, "/", "-"))
		kp, err := tls.X509KeyPair(pair.Cert, pair.Key)
		if err != nil {
			t.Fatal(err)
		}
		c.certs[k] = kp
		if k == "none" {
			continue
		}
		tenant, role, _ := strings.Cut(k, "/")
		tok, err := store.CreateForCertificate(tenant, auth.Role(role), "cert "+k, kp.Certificate[0])
		if err != nil {
			t.Fatal(err)
		}
		c.ids["cert:"+k] = tok.ID
	}
	for _, k := range []string{"a/tenant", "b/tenant"} {
		tenant, role, _ := strings.Cut(k, "/")
		tok, secret, err := store.Create(tenant, auth.Role(role), k)
		if err != nil {
			t.Fatal(err)
		}
		c.secret[k], c.ids[k] = secret, tok.ID
	}
	c.srv = httptest.NewUnstartedServer(s)
	c.srv.TLS = &tls.Config{ClientAuth: tls.VerifyClientCertIfGiven, ClientCAs: cas}
	c.srv.Config.ConnContext, c.srv.Config.ConnState = s.ConnContext, s.ConnState
	c.srv.StartTLS()
	t.Cleanup(c.srv.Close)
	c.roots = x509.NewCertPool()
	c.roots.AddCert(c.srv.Certificate())
	return c
}

// client returns an HTTP client presenting the certificate k ("" none).
func (c *certAPI) client(k string) *http.Client {
	cfg := &tls.Config{RootCAs: c.roots}
	if k != "" {
		cfg.Certificates = []tls.Certificate{c.certs[k]}
	}
	return &http.Client{Transport: &http.Transport{TLSClientConfig: cfg}, Timeout: 30 * time.Second}
}

// do sends method path with the certificate k and the bearer token (none
// when ""), and returns the status and the decoded body (into out unless
// it failed).
func (c *certAPI) do(t *testing.T, k, token, method, path string, in, out any) (int, api.Error) {
	t.Helper()
	var body io.Reader
	if in != nil {
		b, _ := json.Marshal(in)
		body = strings.NewReader(string(b))
	}
	req, err := http.NewRequest(method, c.srv.URL+path, body)
	if err != nil {
		t.Fatal(err)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	hc := c.client(k)
	defer hc.CloseIdleConnections()
	resp, err := hc.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode >= 300 {
		var eb api.ErrorBody
		_ = json.NewDecoder(resp.Body).Decode(&eb)
		return resp.StatusCode, eb.Error
	}
	if out != nil {
		if err := json.NewDecoder(resp.Body).Decode(out); err != nil {
			t.Fatal(err)
		}
	}
	return resp.StatusCode, api.Error{}
}

// TestClientCertificateCredential: a verified client certificate mapped to
// a certificate token acts for exactly that token; one mapped to nothing
// is no credential; a certificate and a bearer token must agree.
func TestClientCertificateCredential(t *testing.T) {
	c := startCertAPI(t, "file-token-0123456789", true)
	whoami := func(k, token string) (api.WhoAmI, int, api.Error) {
		var w api.WhoAmI
		status, e := c.do(t, k, token, "GET", "/v1/whoami", nil, &w)
		return w, status, e
	}
	if w, status, e := whoami("a/attach", ""); status != http.StatusOK || w.Tenant != "a" || w.Role != "attach" ||
		w.TokenID != c.ids["cert:a/attach"] {
		t.Fatalf("whoami with a's attach certificate: %d %+v %+v", status, w, e)
	}
	// The certificate's role decides: an attach certificate cannot
	// create, a tenant one creates in its tenant.
	spec := api.VolumeSpec{Name: "web", Capacity: mib, Disks: []api.DiskSpec{{Name: "root", Size: mib}}}
	if status, e := c.do(t, "a/attach", "", "POST", "/v1/volumes", spec, nil); status != http.StatusForbidden {
		t.Errorf("create with an attach certificate: %d %+v, want 403", status, e)
	}
	var v api.Volume
	if status, e := c.do(t, "a/tenant", "", "POST", "/v1/volumes", spec, &v); status != http.StatusCreated || v.Name != "web" || v.Tenant != "a" {
		t.Fatalf("create with a's tenant certificate: %d %+v %+v", status, v, e)
	}
	if _, err := c.s.pool.Volume("a--web"); err != nil {
		t.Fatalf("a's web is not the pool's a--web: %v", err)
	}
	// b's certificate does not see a's volume, by either name.
	for _, name := range []string{"web", "a--web"} {
		if status, e := c.do(t, "b/tenant", "", "GET", "/v1/volumes/"+name, nil, nil); status != http.StatusNotFound {
			t.Errorf("b's certificate gets a's %s: %d %+v, want 404", name, status, e)
		}
	}
	for _, tc := range []struct {
		name, cert, token string
		status            int
		role, tenant      string
	}{
		{"no credential", "", "", http.StatusUnauthorized, "", ""},
		{"a certificate of no token", "none", "", http.StatusUnauthorized, "", ""},
		{"a certificate of no token and a's secret", "none", c.secret["a/tenant"], http.StatusOK, "tenant", "a"},
		{"a's certificate and a's secret of the same role", "a/tenant", c.secret["a/tenant"], http.StatusOK, "tenant", "a"},
		{"a's certificate and a's secret of another role", "a/attach", c.secret["a/tenant"], http.StatusUnauthorized, "", ""},
		{"a's certificate and b's secret", "a/tenant", c.secret["b/tenant"], http.StatusUnauthorized, "", ""},
		{"a's certificate and the admin's file token", "a/tenant", "file-token-0123456789", http.StatusUnauthorized, "", ""},
		{"a's certificate and an unknown token", "a/tenant", "nope", http.StatusUnauthorized, "", ""},
		{"a's certificate and a revoked-looking secret", "a/tenant", "qvt_AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA", http.StatusUnauthorized, "", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w, status, e := whoami(tc.cert, tc.token)
			if status != tc.status || (status == http.StatusOK && (w.Role != tc.role || w.Tenant != tc.tenant)) {
				t.Fatalf("%d %+v %+v, want %d as %s of %q", status, w, e, tc.status, tc.role, tc.tenant)
			}
			if status == http.StatusUnauthorized && e.Code != api.CodeUnauthorized {
				t.Errorf("error %+v", e)
			}
			if strings.Contains(e.Message, "qvt_") || (tc.token != "" && strings.Contains(e.Message, tc.token)) {
				t.Errorf("the message shows the token: %q", e.Message)
			}
		})
	}
}

// TestClientCertificateOnTokenlessNode: on a node that requires no token
// (loopback without --token-file), a request without a credential is the
// admin, but a mapped certificate stays its token: it never falls back.
func TestClientCertificateOnTokenlessNode(t *testing.T) {
	c := startCertAPI(t, "", false)
	var w api.WhoAmI
	if status, e := c.do(t, "", "", "GET", "/v1/whoami", nil, &w); status != http.StatusOK || w.Role != "admin" {
		t.Fatalf("no credential on a tokenless node: %d %+v %+v, want the admin", status, w, e)
	}
	if status, e := c.do(t, "a/attach", "", "GET", "/v1/whoami", nil, &w); status != http.StatusOK || w.Role != "attach" || w.Tenant != "a" {
		t.Fatalf("a's attach certificate on a tokenless node: %d %+v %+v", status, w, e)
	}
	if status, e := c.do(t, "a/attach", "", "GET", "/v1/tokens", nil, nil); status != http.StatusForbidden {
		t.Errorf("a's attach certificate lists tokens on a tokenless node: %d %+v, want 403", status, e)
	}
}

// TestClientCertificateRevocation: revoking a certificate's token closes
// the keep-alive connection that certificate holds, and its next request
// on a new connection is refused; revoking the bearer token sent with an
// agreeing certificate closes that connection too.
func TestClientCertificateRevocation(t *testing.T) {
	c := startCertAPI(t, "file-token-0123456789", true)
	for _, tc := range []struct{ name, cert, token, revoke string }{
		{"the certificate's token", "a/tenant", "", "cert:a/tenant"},
		{"the agreeing bearer token", "b/tenant", c.secret["b/tenant"], "b/tenant"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := &tls.Config{RootCAs: c.roots, Certificates: []tls.Certificate{c.certs[tc.cert]}}
			conn, err := tls.Dial("tcp", strings.TrimPrefix(c.srv.URL, "https://"), cfg)
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			auth := ""
			if tc.token != "" {
				auth = "Authorization: Bearer " + tc.token + "\r\n"
			}
			fmt.Fprintf(conn, "GET /v1/whoami HTTP/1.1\r\nHost: x\r\n%s\r\n", auth)
			r := bufio.NewReader(conn)
			resp, err := http.ReadResponse(r, nil)
			if err != nil || resp.StatusCode != http.StatusOK {
				t.Fatalf("whoami on the kept-alive connection: %v %v", resp, err)
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			if err := c.store.Revoke(c.ids[tc.revoke]); err != nil {
				t.Fatal(err)
			}
			_ = conn.SetReadDeadline(time.Now().Add(10 * time.Second))
			if n, err := r.Read(make([]byte, 1)); n > 0 || err == nil || strings.Contains(err.Error(), "timeout") {
				t.Fatalf("the connection after the revocation: %d bytes, %v; want it closed", n, err)
			}
			if status, _ := c.do(t, tc.cert, tc.token, "GET", "/v1/whoami", nil, nil); status != http.StatusUnauthorized {
				t.Errorf("a new request after the revocation: %d, want 401", status)
			}
		})
	}
}
