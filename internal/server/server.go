// Package server assembles a storage node: it opens the pool, starts the job
// runner and serves the HTTP API (with /metrics) and NBD until its context is
// cancelled. It is wiring only: the domain lives in pool and, on a cluster,
// replicated, the transports in apiserver and nbd, the wire types in api.
//
// With cluster flags it joins the cluster (internal/cluster) before serving,
// and serves the replicated volumes (internal/replicated).
//
// Imports from quiver: api, apiserver, auth, cluster, connlimit, durable, job, metrics, nbd, pool, replicated, storage, tlscert.
package server

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/quiverstorage/quiver/internal/api"
	"github.com/quiverstorage/quiver/internal/apiserver"
	"github.com/quiverstorage/quiver/internal/auth"
	"github.com/quiverstorage/quiver/internal/cluster"
	"github.com/quiverstorage/quiver/internal/connlimit"
	"github.com/quiverstorage/quiver/internal/metrics"
	"github.com/quiverstorage/quiver/internal/nbd"
	"github.com/quiverstorage/quiver/internal/pool"
	"github.com/quiverstorage/quiver/internal/replicated"
)

// DefaultPoolDir is the pool directory `quiver server` uses with no flags.
const DefaultPoolDir = "./quiver-data"

// Config is everything `quiver server` needs, parsed from flags by the CLI.
type Config struct {
	PoolDir string // pool directory; a new pool is made only in an empty or absent one
	// ExpectMount refuses a pool directory that is not a mount point: its
	// filesystem is not mounted.
	ExpectMount bool
	// NoIOUring makes the NBD readers try their batches of small reads and
	// writes with one system call each instead of io_uring
	// (storage.IOUring).
	NoIOUring bool
	APIAddr   string // host:port of the HTTP API
	TokenFile string // bearer token file; required for a non-loopback APIAddr
	NBDAddr   string // host:port of the NBD server; empty: no TCP listener
	NBDSocket string // unix socket path for NBD; empty: none
	// NBDRequireToken refuses NBD exports without an attachment token (no
	// implicit attachments, no LIST). Always on for a non-loopback NBDAddr.
	NBDRequireToken bool
	// RequireToken refuses API requests without a token on loopback too,
	// when there is no TokenFile: the admin token is then the one made at
	// first start in the pool (auth.AdminTokenFile). Always on for a
	// non-loopback APIAddr.
	RequireToken bool
	// APISocket, when set, also serves the API on this unix socket, without
	// the token: the socket file's permissions decide who may connect (0600,
	// or 0660 with APISocketGroup). NBDSocket gets the same permissions.
	APISocket      string
	APISocketGroup string
	API            APILimits  // zero values take the defaults
	NBD            nbd.Config // limits of the NBD server; Logger and Observer are set by Run
	TLS            TLSConfig  // certificates of the API and NBD (tls.go); zero: plain
	// Reload, if set, makes Run read the certificate files again each time
	// it receives (the CLI sends on SIGHUP): new connections get the new
	// certificates, established ones keep theirs.
	Reload <-chan struct{}
	Pprof  bool // serve /debug/pprof/ on the API port (behind the same auth)
	// MaxOvercommit refuses what would provision more than this many times
	// the pool's size (apiserver.Server.MaxOvercommit); 0: no limit.
	MaxOvercommit float64
	Logger        *slog.Logger // nil: slog.Default()
	// Ready, if set, is called with the API's and the NBD TCP listener's
	// addresses (nil when there is none) once requests are served.
	Ready func(api, nbd net.Addr)
	// WrapListener, if set, wraps every listener Run opens (tests use it to
	// make one fail).
	WrapListener func(net.Listener) net.Listener
	// Cluster makes the node a member of a cluster (docs/cluster.md) when
	// any of its flags is set; its addresses, state directory and logger are
	// filled in by Run. The zero value: a single node, as before.
	Cluster cluster.Config
	// TestCrashPointFile is for test/cluster only (the hidden flag
	// --test-crash-point-file): a file whose content names a step of a
	// change at the cut where this process kills itself (crashPoint).
	// Empty: none.
	TestCrashPointFile string
}

// ErrInsecure refuses a non-loopback listener without authentication.
var ErrInsecure = errors.New("refusing to listen on a non-loopback address without authentication: pass --token-file")

// Run serves until ctx is cancelled or a listener fails, then stops
// accepting requests, lets running requests finish (up to 10 s), cancels
// running jobs and returns (the listener's error first, if one failed). When
// it cannot start, it closes whatever it opened.
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
		// Beyond loopback a token is required; without --token-file the
		// admin's is the one made at first start in the pool.
		cfg.RequireToken = true
	}
	if cfg.NBDAddr != "" && !IsLoopback(cfg.NBDAddr) && !cfg.NBDRequireToken {
		log.Info("NBD listens beyond loopback: every export needs an attachment or API token", "addr", cfg.NBDAddr)
		cfg.NBDRequireToken = true
	}
	if token != "" || cfg.RequireToken {
		cfg.NBDRequireToken = true // loopback included: a token means no local trust
	} else {
		log.Warn("no --token-file: any local user can call the API as admin and read and write every disk over NBD on loopback; " +
			"tenant tokens are confined, but not the callers without a token (--require-token)")
	}
	tlsSet, err := setupTLS(cfg.TLS, cfg.NBDAddr)
	if err != nil {
		return err
	}
	cfg.NBD.TLS, cfg.NBD.RequireTLS = tlsSet.nbd, tlsSet.nbdReq
	cfg.API.defaults()
	if cfg.NoIOUring {
		pool.DisableIOUring()
	}
	if err := pool.IOUring(); err != nil {
		log.Info("NBD file I/O without io_uring: one system call per request", "reason", err)
	} else {
		log.Info("NBD file I/O batched through io_uring")
	}
	p, err := pool.OpenWith(ctx, cfg.PoolDir, pool.Options{Logger: log, ExpectMount: cfg.ExpectMount})
	if err != nil {
		return err
	}
	defer p.Close()
	store, err := auth.Open(p.FS(), p.ReadOnly())
	if err != nil {
		return err
	}
	if token == "" {
		rel, made, err := store.Bootstrap()
		if err != nil {
			return err
		}
		if made {
			log.Info("made the admin token", "file", filepath.Join(p.Dir(), rel))
		}
	}
	if cfg.RequireToken && token == "" && p.ReadOnly() && len(store.List()) == 0 {
		return fmt.Errorf("listen %s: %w (a read-only pool has no admin token to make)", cfg.APIAddr, ErrInsecure)
	}
	jobs := newJobs(p, log)
	ln, err := net.Listen("tcp", cfg.APIAddr)
	if err != nil {
		return fmt.Errorf("listen %s: %w (is another quiver server running? pick another address with --listen)", cfg.APIAddr, err)
	}
	m := metrics.New(p)
	ln = &connlimit.Listener{Listener: ln, Limiter: connlimit.New(cfg.API.MaxConns, cfg.API.MaxConnsPerPeer),
		Rejected: m.APIConnRejected}
	cfg.NBD.Logger, cfg.NBD.Observer = log, m
	te := newTenantExports(nbd.PoolExports{Pool: p, Metrics: m, RequireToken: cfg.NBDRequireToken}, p, m, store)
	te.cluster = cfg.Cluster.Enabled()
	var exports nbd.Exports = te
	var nbdLns []net.Listener
	closeAll := func() {
		for _, l := range append(nbdLns, ln) {
			_ = l.Close()
		}
	}
	errc := make(chan error, 4) // API, API socket, NBD TCP, NBD socket
	if cfg.NBDAddr != "" {
		l, err := net.Listen("tcp", cfg.NBDAddr)
		if err != nil {
			closeAll()
			return fmt.Errorf("nbd listen %s: %w (pick another address with --nbd-listen)", cfg.NBDAddr, err)
		}
		nbdLns = append(nbdLns, l)
	}
	if cfg.NBDSocket != "" {
		l, err := ListenUnix(cfg.NBDSocket, cfg.APISocketGroup)
		if err != nil {
			closeAll()
			return fmt.Errorf("nbd socket %s: %w", cfg.NBDSocket, err)
		}
		nbdLns = append(nbdLns, l)
	}
	if w := cfg.WrapListener; w != nil {
		ln = w(ln)
		for i, l := range nbdLns {
			nbdLns[i] = w(l)
		}
	}
	handler := apiserver.NewServer(p, jobs, token, log)
	handler.BodyTimeout = cfg.API.BodyTimeout
	handler.Auth, handler.RequireToken = store, cfg.RequireToken
	handler.MaxOvercommit = cfg.MaxOvercommit
	endpoint := apiserver.NBDEndpoint{Socket: cfg.NBDSocket, TLS: cfg.NBD.TLS != nil && cfg.NBD.RequireTLS}
	for _, l := range nbdLns {
		if l.Addr().Network() == "tcp" {
			endpoint.Addr = l.Addr().String()
		}
	}
	handler.SetNBD(endpoint)
	if cfg.Cluster.Enabled() {
		node, err := joinCluster(ctx, cfg, p, ln.Addr(), nbdLns, log)
		if err != nil {
			closeAll()
			return err
		}
		defer node.Close()
		// Tokens and tenants live in etcd, the same on every node
		// (docs/security.md, "Tenants on a cluster").
		sctx, scancel := context.WithCancel(context.Background())
		defer scancel()
		if err := store.Share(sctx, node.TokenStore(), log); err != nil {
			closeAll()
			return err
		}
		handler.Cluster = apiserver.NodeCluster(node)
		if handler.Peers, err = peers(cfg, node.Name()); err != nil {
			closeAll()
			return err
		}
		m.Register(node.Collector())
		vols := replicated.New(node, p, replicated.Options{Config: cfg.Cluster, Jobs: jobs, Log: log,
			CrashPointFile: cfg.TestCrashPointFile})
		m.Register(vols.Collectors()...)
		rctx, rcancel := context.WithCancel(context.Background())
		resyncDone := make(chan struct{})
		go func() { defer close(resyncDone); vols.Run(rctx) }()
		defer func() { rcancel(); <-resyncDone }()
		exports = replicated.NewExports(exports, vols)
		handler.Replicated = vols
		handler.Drainer = vols
	}
	nbdSrv := nbd.NewServer(exports, cfg.NBD)
	handler.Mount("GET /metrics", m.Handler())
	if cfg.Pprof {
		handler.Mount("GET /debug/pprof/", http.HandlerFunc(pprof.Index))
		handler.Mount("GET /debug/pprof/profile", http.HandlerFunc(pprof.Profile))
		handler.Mount("GET /debug/pprof/heap", pprof.Handler("heap"))
		handler.Mount("GET /debug/pprof/allocs", pprof.Handler("allocs"))
	}
	srv := cfg.API.httpServer(handler)
	srv.ConnContext, srv.ConnState = handler.ConnContext, handler.ConnState // revoked tokens' connections
	var localSrv *http.Server
	var localLn net.Listener
	if cfg.APISocket != "" {
		l, err := ListenUnix(cfg.APISocket, cfg.APISocketGroup)
		localLn = l
		if err != nil {
			closeAll()
			return fmt.Errorf("api socket %s: %w", cfg.APISocket, err)
		}
		localSrv = cfg.API.httpServer(handler.Local())
		log.Info("serving API on a unix socket (no token: its file permissions decide)", "path", cfg.APISocket,
			"group", cfg.APISocketGroup)
		go func() { errc <- localSrv.Serve(l) }()
	}
	log.Info("serving API", "addr", ln.Addr().String(), "auth", token != "" || cfg.RequireToken, "https", tlsSet.api != nil)
	var nbdAddr net.Addr
	for _, l := range nbdLns {
		log.Info("serving NBD", "addr", l.Addr().String(), "tls", tlsMode(cfg.NBD))
		if l.Addr().Network() == "tcp" {
			nbdAddr = l.Addr()
		}
		go func() {
			if err := nbdSrv.Serve(l); !errors.Is(err, nbd.ErrServerClosed) {
				errc <- err
			}
		}()
	}
	if cfg.Ready != nil {
		cfg.Ready(ln.Addr(), nbdAddr)
	}
	go func() {
		if err := tlsSet.serveAPI(srv, ln); !errors.Is(err, http.ErrServerClosed) {
			errc <- err
		}
	}()
	var failed error
	tick, stopWatch := tlsSet.watch(cfg.TLS.WatchInterval)
	defer stopWatch()
wait:
	for {
		select {
		case failed = <-errc:
			log.Error("a listener failed; shutting down", "err", failed)
			break wait
		case <-cfg.Reload:
			tlsSet.reload(log)
		case <-tick:
			tlsSet.reloadChanged(log)
		case <-ctx.Done():
			break wait
		}
	}
	log.Info("shutting down")
	handler.Drain()
	sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	err = srv.Shutdown(sctx)
	if localSrv != nil {
		if lerr := localSrv.Shutdown(sctx); err == nil {
			err = lerr
		}
	}
	if nerr := nbdSrv.Shutdown(sctx); err == nil {
		err = nerr
	}
	if jerr := jobs.Shutdown(sctx); err == nil {
		err = jerr
	}
	// A Serve goroutine that had not started when Shutdown ran closes its
	// listener only once it starts: close them here, so that the ports
	// are free when Run returns.
	_ = ln.Close()
	if localLn != nil {
		_ = localLn.Close()
	}
	for _, l := range nbdLns {
		_ = l.Close()
	}
	if failed != nil {
		return fmt.Errorf("serve: %w", failed)
	}
	return err
}

func tlsMode(c nbd.Config) string {
	switch {
	case c.TLS == nil:
		return TLSOff
	case c.RequireTLS:
		return TLSRequire
	}
	return TLSOn
}

// InitPool makes a new, empty pool in dir (absent or empty) for `quiver pool
// init`, and returns its ID and directory. It refuses a directory that holds
// a pool or anything else, and one a running server has open.
func InitPool(ctx context.Context, dir string, log *slog.Logger) (id, path string, err error) {
	p, err := pool.Init(ctx, dir, log)
	if err != nil {
		return "", "", err
	}
	defer p.Close()
	info, err := p.Info()
	if err != nil {
		return "", "", err
	}
	return info.ID, info.Dir, nil
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
