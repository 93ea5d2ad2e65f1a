// Package tests3 starts an S3 server for tests: gofakes3 (an S3 protocol
// implementation in Go, from the module proxy) on a loopback port, with
// SigV4 checked against one key pair, and switches to make it fail.
//
// Imports from quiver: objstore.
package tests3

import (
	"context"
	"io"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/johannesboyne/gofakes3"
	"github.com/johannesboyne/gofakes3/backend/s3mem"

	"github.com/quiverstorage/quiver/internal/objstore"
)

// Server is a running S3 server with one bucket.
type Server struct {
	Config objstore.S3Config
	// down, when set, makes every request fail at the TCP level (the
	// connection is closed without an answer).
	down atomic.Bool
	// failAfter > 0: that many more requests are answered, then the
	// server goes down.
	failAfter atomic.Int64
	// delay is added before each GET is answered (a slow store).
	delay    atomic.Int64
	requests atomic.Int64
	backend  *s3mem.Backend
	srv      *http.Server
}

// Start serves a fresh, empty bucket on loopback until the test ends.
func Start(t testing.TB) *Server {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	return StartOn(t, ln)
}

// StartOn is Start on a listener of the caller's (one in a test network's
// namespace).
func StartOn(t testing.TB, ln net.Listener) *Server {
	t.Helper()
	s := &Server{backend: s3mem.New()}
	const bucket, access, secret = "quiver-backups", "quiver-test-access", "quiver-test-secret-key"
	if err := s.backend.CreateBucket(bucket); err != nil {
		t.Fatal(err)
	}
	fake := gofakes3.New(s.backend, gofakes3.WithoutVersioning())
	h := fake.Server()
	s.srv = &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.requests.Add(1)
		if n := s.failAfter.Load(); n > 0 && s.failAfter.Add(-1) == 0 {
			s.down.Store(true)
		}
		if s.down.Load() || !signedBy(r, access) {
			if hj, ok := w.(http.Hijacker); ok && s.down.Load() {
				if c, _, err := hj.Hijack(); err == nil {
					_ = c.Close()
					return
				}
			}
			http.Error(w, `<?xml version="1.0" encoding="UTF-8"?><Error><Code>AccessDenied</Code><Message>Access Denied</Message></Error>`,
				http.StatusForbidden)
			return
		}
		if d := time.Duration(s.delay.Load()); d > 0 && r.Method == http.MethodGet {
			time.Sleep(d)
		}
		h.ServeHTTP(w, r)
	})}
	go func() { _ = s.srv.Serve(ln) }()
	t.Cleanup(func() { _ = s.srv.Shutdown(context.Background()) })
	s.Config = objstore.S3Config{Endpoint: ln.Addr().String(), Bucket: bucket, AccessKey: access, SecretKey: secret,
		Insecure: true, Region: "us-east-1"}
	return s
}

// signedBy reports whether r carries a SigV4 signature by access key id.
// (gofakes3 does not check signatures; the key id is checked here so a
// wrong credential is refused as a real server refuses it.)
func signedBy(r *http.Request, access string) bool {
	auth := r.Header.Get("Authorization")
	return strings.Contains(auth, "Credential="+access+"/")
}

// Down makes the server stop answering (true) or answer again (false).
func (s *Server) Down(on bool) { s.down.Store(on) }

// Serve answers on another listener too (until the test ends), with the
// same bucket; Config keeps the first listener's endpoint.
func (s *Server) Serve(ln net.Listener) { go func() { _ = s.srv.Serve(ln) }() }

// Delay makes every GET wait d before it is answered (0: none), as a
// distant or busy store would.
func (s *Server) Delay(d time.Duration) { s.delay.Store(int64(d)) }

// FailAfter lets n more requests through, then goes down.
func (s *Server) FailAfter(n int64) { s.failAfter.Store(n) }

// Requests counts the requests received.
func (s *Server) Requests() int64 { return s.requests.Load() }

// Corrupt flips a byte in the middle of the object under key (within the
// bucket).
func (s *Server) Corrupt(t testing.TB, key string) {
	t.Helper()
	s.CorruptAt(t, key, -1)
}

// CorruptAt flips the byte at off of the object under key (its middle
// byte when off < 0).
func (s *Server) CorruptAt(t testing.TB, key string, off int64) {
	t.Helper()
	obj, err := s.backend.GetObject(s.Config.Bucket, key, nil)
	if err != nil {
		t.Fatal(err)
	}
	buf, err := io.ReadAll(obj.Contents)
	_ = obj.Contents.Close()
	if err != nil {
		t.Fatal(err)
	}
	if off < 0 {
		off = int64(len(buf) / 2)
	}
	buf[off] ^= 0x40
	if _, err := s.backend.PutObject(s.Config.Bucket, key, obj.Metadata, strings.NewReader(string(buf)), int64(len(buf)), nil); err != nil {
		t.Fatal(err)
	}
}

// List calls fn with every key under prefix in the bucket.
func (s *Server) List(prefix string, fn func(key string)) error {
	res, err := s.backend.ListBucket(s.Config.Bucket, &gofakes3.Prefix{Prefix: prefix, HasPrefix: true}, gofakes3.ListBucketPage{})
	if err != nil {
		return err
	}
	for _, o := range res.Contents {
		fn(o.Key)
	}
	return nil
}
