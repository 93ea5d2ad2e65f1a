package client

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/quiverstorage/quiver/internal/api"
)

// TestWithTLSConfig: a client trusting the server's CA calls it over
// HTTPS; one without it is refused, as is plain HTTP.
func TestWithTLSConfig(t *testing.T) {
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_ = json.NewEncoder(w).Encode(api.PoolInfo{ID: "p1"})
	}))
	t.Cleanup(srv.Close)
	roots := x509.NewCertPool()
	roots.AddCert(srv.Certificate())

	c, err := New(srv.URL, WithTLSConfig(&tls.Config{RootCAs: roots}))
	if err != nil {
		t.Fatal(err)
	}
	if info, err := c.Pool(t.Context()); err != nil || info.ID != "p1" {
		t.Fatalf("Pool over HTTPS: %+v, %v", info, err)
	}
	// With an HTTP client of its own, the TLS configuration applies to a
	// copy of its transport.
	hc := &http.Client{Transport: &http.Transport{}}
	c, err = New(srv.URL, WithHTTPClient(hc), WithTLSConfig(&tls.Config{RootCAs: roots}))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Pool(t.Context()); err != nil {
		t.Fatalf("Pool over HTTPS with an own HTTP client: %v", err)
	}
	// (Clone may give the caller's transport a TLSClientConfig for HTTP/2,
	// but not the roots.)
	if tc := hc.Transport.(*http.Transport).TLSClientConfig; tc != nil && tc.RootCAs != nil {
		t.Fatal("WithTLSConfig changed the caller's transport")
	}

	untrusting, err := New(srv.URL, WithTLSConfig(&tls.Config{RootCAs: x509.NewCertPool()}))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := untrusting.Pool(t.Context()); err == nil {
		t.Fatal("a client without the server's CA got an answer")
	}
	if _, err := New(srv.URL, WithHTTPClient(&http.Client{Transport: roundTripper(nil)}), WithTLSConfig(&tls.Config{})); err == nil {
		t.Fatal("WithTLSConfig on a transport that is not an *http.Transport: no error")
	}
}

type roundTripper func(*http.Request) (*http.Response, error)

func (f roundTripper) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }
