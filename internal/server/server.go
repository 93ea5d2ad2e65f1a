// Package server assembles a storage node: it opens the pool, starts the job
// runner and serves the HTTP API until its context is cancelled. It is
// wiring only; the domain lives in pool, the transport in api.
package server

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/quiverstorage/quiver/internal/api"
	"github.com/quiverstorage/quiver/internal/apiserver"
	"github.com/quiverstorage/quiver/internal/job"
	"github.com/quiverstorage/quiver/internal/pool"
)

// DefaultPoolDir is the pool directory `quiver server` uses with no flags.
const DefaultPoolDir = "./quiver-data"

// Config is everything `quiver server` needs, parsed from flags by the CLI.
type Config struct {
	PoolDir   string       // pool directory; created on first start
	APIAddr   string       // host:port of the HTTP API
	TokenFile string       // bearer token file; required for a non-loopback APIAddr
	Logger    *slog.Logger // nil: slog.Default()
	// Ready, if set, is called with the API's listening address once the
	// pool is open and requests are served.
	Ready func(addr net.Addr)
}

// ErrInsecure refuses a non-loopback listener without authentication.
var ErrInsecure = errors.New("refusing to listen on a non-loopback address without authentication: pass --token-file")

// Run serves until ctx is cancelled, then stops accepting requests, lets
// running requests finish (up to 10 s), cancels running jobs and returns.
func Run(ctx context.Context, cfg Config) error {
	log := cfg.Logger
	if log == nil {
		log = slog.Default()
	}
	if cfg.PoolDir == "" {
		cfg.PoolDir = DefaultPoolDir
	}
	if cfg.APIAddr == "" {
		cfg.APIAddr = api.DefaultAddr
	}
	token, err := readToken(cfg.TokenFile)
	if err != nil {
		return err
	}
	if token == "" && !IsLoopback(cfg.APIAddr) {
		return fmt.Errorf("listen %s: %w", cfg.APIAddr, ErrInsecure)
	}
	p, err := pool.Open(ctx, cfg.PoolDir, log)
	if err != nil {
		return err
	}
	jobs := job.NewManager()
	ln, err := net.Listen("tcp", cfg.APIAddr)
	if err != nil {
		return fmt.Errorf("listen %s: %w (is another quiver server running? pick another address with --listen)", cfg.APIAddr, err)
	}
	srv := &http.Server{
		Handler:           apiserver.NewServer(p, jobs, token, log),
		ReadHeaderTimeout: 10 * time.Second,
		IdleTimeout:       2 * time.Minute,
	}
	log.Info("serving API", "addr", ln.Addr().String(), "auth", token != "")
	if cfg.Ready != nil {
		cfg.Ready(ln.Addr())
	}
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	log.Info("shutting down")
	sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	err = srv.Shutdown(sctx)
	if jerr := jobs.Shutdown(sctx); err == nil {
		err = jerr
	}
	return err
}

func readToken(path string) (string, error) {
	if path == "" {
		return "", nil
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return "", fmt.Errorf("read token file: %w", err)
	}
	t := strings.TrimSpace(string(b))
	if len(t) < 16 {
		return "", fmt.Errorf("token file %s: the token must be at least 16 characters", path)
	}
	return t, nil
}

// IsLoopback reports whether a host:port listen address only accepts
// connections from this machine. An empty host (all interfaces) is not.
func IsLoopback(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}
