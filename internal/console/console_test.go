package console

import (
	"bytes"
	"compress/gzip"
	"io"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"testing"
)

// TestHandler serves the embedded build: the page at Prefix, the assets it
// names (gzipped when asked, the same bytes once unpacked), and 404 for
// anything else.
func TestHandler(t *testing.T) {
	h := Handler()
	get := func(path, enc string) *httptest.ResponseRecorder {
		r := httptest.NewRequest(http.MethodGet, path, nil)
		if enc != "" {
			r.Header.Set("Accept-Encoding", enc)
		}
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		return w
	}
	page := get(Prefix, "")
	if page.Code != http.StatusOK || !strings.Contains(page.Body.String(), `<div id="app">`) {
		t.Fatalf("GET %s: %d %q", Prefix, page.Code, page.Body.String())
	}
	if csp := page.Header().Get("Content-Security-Policy"); !strings.Contains(csp, "script-src 'self'") {
		t.Fatalf("page's CSP: %q", csp)
	}
	assets := regexp.MustCompile(`(?:src|href)="(/ui/assets/[^"]+)"`).FindAllStringSubmatch(page.Body.String(), -1)
	if len(assets) < 2 {
		t.Fatalf("page names %d assets, want the script and the style", len(assets))
	}
	for _, a := range assets {
		plain := get(a[1], "")
		if plain.Code != http.StatusOK || plain.Body.Len() == 0 {
			t.Fatalf("GET %s: %d, %d bytes", a[1], plain.Code, plain.Body.Len())
		}
		if cc := plain.Header().Get("Cache-Control"); !strings.Contains(cc, "immutable") {
			t.Errorf("GET %s: Cache-Control %q", a[1], cc)
		}
		z := get(a[1], "gzip, br")
		if z.Header().Get("Content-Encoding") != "gzip" {
			t.Fatalf("GET %s with gzip: Content-Encoding %q", a[1], z.Header().Get("Content-Encoding"))
		}
		if ct, want := z.Header().Get("Content-Type"), plain.Header().Get("Content-Type"); ct != want {
			t.Errorf("GET %s: gzipped as %q, plain as %q", a[1], ct, want)
		}
		zr, err := gzip.NewReader(z.Body)
		if err != nil {
			t.Fatal(err)
		}
		unpacked, err := io.ReadAll(zr)
		if err != nil || !bytes.Equal(unpacked, plain.Body.Bytes()) {
			t.Fatalf("GET %s: gzipped body does not unpack to the plain one (%v)", a[1], err)
		}
	}
	for _, path := range []string{"/ui/nothing.js", "/ui/assets/", "/ui/../console.go", "/other", "/ui/assets/../index.html"} {
		if w := get(path, ""); w.Code != http.StatusNotFound {
			t.Errorf("GET %s: %d, want 404", path, w.Code)
		}
	}
	w := httptest.NewRecorder()
	h.ServeHTTP(w, httptest.NewRequest(http.MethodPost, Prefix, nil))
	if w.Code != http.StatusMethodNotAllowed {
		t.Errorf("POST %s: %d, want 405", Prefix, w.Code)
	}
}

// TestSize keeps the whole console, compressed, under the 300 KB.
func TestSize(t *testing.T) {
	total := 0
	for name, f := range Handler().(handler).files {
		t.Logf("%s: %d bytes, %d gzipped", name, len(f.plain), len(f.gzipped))
		total += len(f.gzipped)
	}
	if total == 0 || total > 300_000 {
		t.Fatalf("console: %d bytes gzipped, want 1 to 300,000", total)
	}
}
