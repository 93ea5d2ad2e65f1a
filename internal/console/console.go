package console

import (
	"bytes"
	"compress/gzip"
	"embed"
	"io/fs"
	"net/http"
	"path"
	"strings"
	"time"
)

// Prefix is where the console is served on the API's listener.
const Prefix = "/ui/"

//go:embed dist
var dist embed.FS

// csp allows the page its own scripts, styles and API calls only: no inline
// script, no other origin, no framing.
const csp = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; " +
	"connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"

// Handler serves the console's files under Prefix: index.html for Prefix
// itself, the hashed assets below it (cached for good, as their names
// change with their content), and 404 for anything else; gzipped for a
// client that accepts it (compressed once, here). Only GET and HEAD are
// answered.
func Handler() http.Handler {
	h := handler{files: map[string]file{}}
	err := fs.WalkDir(dist, "dist", func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		data, err := dist.ReadFile(p)
		if err != nil {
			return err
		}
		var z bytes.Buffer
		zw, _ := gzip.NewWriterLevel(&z, gzip.BestCompression)
		_, _ = zw.Write(data)
		_ = zw.Close()
		h.files[strings.TrimPrefix(p, "dist/")] = file{plain: data, gzipped: z.Bytes()}
		return nil
	})
	if err != nil {
		panic(err) // dist is embedded at build time: it reads
	}
	return h
}

type file struct{ plain, gzipped []byte }

type handler struct{ files map[string]file }

func (h handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		w.Header().Set("Allow", "GET, HEAD")
		http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
		return
	}
	name, ok := strings.CutPrefix(r.URL.Path, Prefix)
	if !ok {
		http.NotFound(w, r)
		return
	}
	if name == "" {
		name = "index.html"
	}
	f, ok := h.files[name]
	if !ok || name != path.Clean(name) {
		http.NotFound(w, r)
		return
	}
	hd := w.Header()
	hd.Set("Content-Security-Policy", csp)
	hd.Set("X-Content-Type-Options", "nosniff")
	hd.Set("X-Frame-Options", "DENY")
	hd.Set("Referrer-Policy", "no-referrer")
	if strings.HasPrefix(name, "assets/") {
		hd.Set("Cache-Control", "public, max-age=31536000, immutable")
	} else {
		hd.Set("Cache-Control", "no-cache")
	}
	hd.Add("Vary", "Accept-Encoding")
	data := f.plain
	if strings.Contains(r.Header.Get("Accept-Encoding"), "gzip") {
		// The type from the name, before ServeContent would sniff the
		// compressed bytes.
		if ct := mimeOf(name); ct != "" {
			hd.Set("Content-Type", ct)
		}
		hd.Set("Content-Encoding", "gzip")
		data = f.gzipped
	}
	http.ServeContent(w, r, name, time.Time{}, bytes.NewReader(data))
}

func mimeOf(name string) string {
	switch path.Ext(name) {
	case ".html":
		return "text/html; charset=utf-8"
	case ".js":
		return "text/javascript; charset=utf-8"
	case ".css":
		return "text/css; charset=utf-8"
	case ".svg":
		return "image/svg+xml"
	}
	return "application/octet-stream"
}
