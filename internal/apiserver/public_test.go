package apiserver

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// TestMountPublic: what MountPublic serves needs no credential, for GET
// and HEAD under its prefix only; everything else still does.
func TestMountPublic(t *testing.T) {
	s, _ := newTestAPI(t, "secret")
	s.MountPublic("/ui/", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, "page "+r.URL.Path)
	}))
	srv := httptest.NewServer(s)
	t.Cleanup(srv.Close)
	noRedirect := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	for _, tc := range []struct {
		method, path string
		status       int
		body         string
	}{
		{"GET", "/ui/", http.StatusOK, "page /ui/"},
		{"GET", "/ui/assets/x.js", http.StatusOK, "page /ui/assets/x.js"},
		{"HEAD", "/ui/", http.StatusOK, ""},
		{"GET", "/ui", http.StatusMovedPermanently, ""},
		{"POST", "/ui/", http.StatusUnauthorized, ""},
		{"GET", "/uix", http.StatusUnauthorized, ""},
		{"GET", "/v1/volumes", http.StatusUnauthorized, ""},
		{"GET", "/v1/ui/", http.StatusUnauthorized, ""},
	} {
		req, err := http.NewRequest(tc.method, srv.URL+tc.path, nil)
		if err != nil {
			t.Fatal(err)
		}
		resp, err := noRedirect.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != tc.status || (tc.body != "" && string(body) != tc.body) {
			t.Errorf("%s %s: %d %q, want %d %q", tc.method, tc.path, resp.StatusCode, body, tc.status, tc.body)
		}
		if tc.status == http.StatusMovedPermanently && !strings.HasSuffix(resp.Header.Get("Location"), "/ui/") {
			t.Errorf("%s %s: Location %q", tc.method, tc.path, resp.Header.Get("Location"))
		}
	}
}
