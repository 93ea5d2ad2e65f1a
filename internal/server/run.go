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
	"syscall"
	"time"

	"github.com/quiverstorage/quiver/internal/api"
	"github.com/quiverstorage/quiver/internal/apiserver"
	"github.com/quiverstorage/quiver/internal/audit"
	"github.com/quiverstorage/quiver/internal/auth"
	"github.com/quiverstorage/quiver/internal/backup"
	"github.com/quiverstorage/quiver/internal/cluster"
	"github.com/quiverstorage/quiver/internal/connlimit"
	"github.com/quiverstorage/quiver/internal/console"
	"github.com/quiverstorage/quiver/internal/dr"
	"github.com/quiverstorage/quiver/internal/job"
	"github.com/quiverstorage/quiver/internal/metrics"
	"github.com/quiverstorage/quiver/internal/nbd"
	"github.com/quiverstorage/quiver/internal/pool"
	"github.com/quiverstorage/quiver/internal/replicated"
)

// Run serves until ctx is cancelled or a listener fails, then stops
// accepting requests, lets running requests finish (up to 10 s), cancels
// running jobs and returns (the listener's error first, if one failed). When
// it cannot start, it closes whatever it opened.
//
// It runs in phases, each on what the ones before built: the configuration
// is settled (defaults, what needs a token, TLS); the pool opens with its
// token store and job runner; the listeners open; the API is built; on a
// cluster the node joins and serves its replicated volumes; then everything
// serves until the end, and shuts down in the reverse order.
func Run(ctx context.Context, cfg Config) error {
	n, err := settle(cfg)
	if err != nil {
		return err
	}
	defer n.close()
	if err := n.openPool(ctx); err != nil {
		return err
	}
	if err := n.listen(); err != nil {
		return err
	}
	n.buildAPI()
	if n.cfg.Cluster.Enabled() {
		if err := n.joinCluster(ctx); err != nil {
			return err
		}
	}
	return n.serve(ctx)
}

// node is one storage node while Run builds and serves it.
type node struct {
	cfg   Config
	log   *slog.Logger
	token string // the admin token of --token-file, if any
	tls   *tlsSetup

	pool    *pool.Pool
	store   *auth.Store
	audit   *audit.Log // nil on a read-only pool
	jobs    *job.Manager
	metrics *metrics.Metrics
	backups *backup.Service // nil without --backup-config
	drSites *dr.Sites       // nil without --dr-config

	apiLn  net.Listener
	nbdLns []net.Listener

	handler *apiserver.Server
	exports nbd.Exports
	// member is the node's cluster membership (nil on a single node):
	// the server stops when it ends (the node was removed).
	member *cluster.Node

	// undo is what close undoes, last first: what the phases opened.
	undo []func()
}

func (n *node) onClose(f func()) { n.undo = append(n.undo, f) }

// drKeep is how many points a DR target keeps of each relationship.
const drKeep = 3

// close undoes the phases, last first.
func (n *node) close() {
	for i := len(n.undo) - 1; i >= 0; i-- {
		n.undo[i]()
	}
}

// settle fills in the defaults and decides what needs a token and TLS.
func settle(cfg Config) (*node, error) {
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
		return nil, err
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
		return nil, err
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
	return &node{cfg: cfg, log: log, token: token, tls: tlsSet}, nil
}

// openPool opens the pool, its token store (making the admin token at
// first start) and the job runner.
func (n *node) openPool(ctx context.Context) error {
	cfg, log := n.cfg, n.log
	keys, newKeys, err := keyring(cfg)
	if err != nil {
		return err
	}
	if keys != nil {
		logCipher(log)
	}
	p, err := pool.OpenWith(ctx, cfg.PoolDir, pool.Options{Logger: log, ExpectMount: cfg.ExpectMount, Keyring: keys, NewKeys: newKeys})
	if err != nil {
		return err
	}
	n.pool = p
	n.onClose(func() { _ = p.Close() })
	store, err := auth.Open(p.FS(), p.ReadOnly())
	if err != nil {
		return err
	}
	n.store = store
	if n.token == "" {
		rel, made, err := store.Bootstrap()
		if err != nil {
			return err
		}
		if made {
			log.Info("made the admin token", "file", filepath.Join(p.Dir(), rel))
		}
	}
	if cfg.RequireToken && n.token == "" && p.ReadOnly() && len(store.List()) == 0 {
		return fmt.Errorf("listen %s: %w (a read-only pool has no admin token to make)", cfg.APIAddr, ErrInsecure)
	}
	if !p.ReadOnly() {
		// Every change asked of the API, and every refused credential
		// (docs/security.md, "Audit log").
		al, err := audit.Open(p.FS(), audit.Options{})
		if err != nil {
			return err
		}
		n.audit = al
		n.onClose(func() { _ = al.Close() })
	}
	n.jobs = newJobs(p, log)
	n.metrics = metrics.NewWith(p, metrics.Options{PerDisk: cfg.MetricsPerDisk})
	if cfg.BackupConfig != "" {
		bc, err := backup.LoadConfig(cfg.BackupConfig)
		if err != nil {
			return err
		}
		if n.backups, err = backup.NewService(p, bc, log); err != nil {
			return err
		}
	}
	if cfg.DRConfig != "" {
		dc, err := dr.LoadConfig(cfg.DRConfig)
		if err != nil {
			return err
		}
		if n.drSites, err = dr.NewSites(dc); err != nil {
			return err
		}
	}
	return nil
}

// listen opens the API's and NBD's listeners, each bounded in connections.
func (n *node) listen() (err error) {
	cfg := n.cfg
	var opened []net.Listener
	defer func() {
		if err != nil {
			for _, l := range opened {
				_ = l.Close()
			}
		}
	}()
	ln, err := net.Listen("tcp", cfg.APIAddr)
	if err != nil {
		return fmt.Errorf("listen %s: %w (is another quiver server running? pick another address with --listen)", cfg.APIAddr, err)
	}
	opened = append(opened, ln)
	apiLn := net.Listener(&connlimit.Listener{Listener: ln, Limiter: connlimit.New(cfg.API.MaxConns, cfg.API.MaxConnsPerPeer),
		Rejected: n.metrics.APIConnRejected})
	var nbdLns []net.Listener
	if cfg.NBDAddr != "" {
		l, err := net.Listen("tcp", cfg.NBDAddr)
		if err != nil {
			return fmt.Errorf("nbd listen %s: %w (pick another address with --nbd-listen)", cfg.NBDAddr, err)
		}
		opened = append(opened, l)
		nbdLns = append(nbdLns, l)
	}
	if cfg.NBDSocket != "" {
		l, err := ListenUnix(cfg.NBDSocket, cfg.APISocketGroup)
		if err != nil {
			return fmt.Errorf("nbd socket %s: %w", cfg.NBDSocket, err)
		}
		opened = append(opened, l)
		nbdLns = append(nbdLns, l)
	}
	if w := cfg.WrapListener; w != nil {
		apiLn = w(apiLn)
		for i, l := range nbdLns {
			nbdLns[i] = w(l)
		}
	}
	n.apiLn, n.nbdLns = apiLn, nbdLns
	// A Serve goroutine that had not started when Shutdown ran closes its
	// listener only once it starts: they close here too, so that the ports
	// are free when Run returns.
	n.onClose(func() {
		for _, l := range append(nbdLns, apiLn) {
			_ = l.Close()
		}
	})
	return nil
}

// buildAPI makes the API handler and the NBD exports of a single node.
func (n *node) buildAPI() {
	cfg, p := n.cfg, n.pool
	n.cfg.NBD.Logger, n.cfg.NBD.Observer = n.log, n.metrics
	te := newTenantExports(nbd.PoolExports{Pool: p, Metrics: n.metrics, RequireToken: cfg.NBDRequireToken}, p, n.metrics, n.store)
	te.cluster = cfg.Cluster.Enabled()
	n.exports = te
	if n.backups != nil {
		n.exports = backupExports{next: te, svc: n.backups, requireToken: cfg.NBDRequireToken}
	}
	h := apiserver.NewServer(p, n.jobs, n.token, n.log)
	h.BodyTimeout = cfg.API.BodyTimeout
	h.Auth, h.RequireToken = n.store, cfg.RequireToken
	h.MaxOvercommit = cfg.MaxOvercommit
	h.Audit = n.audit
	h.IO = n.metrics
	h.Backups = n.backups
	h.DRSites = n.drSites
	if n.drSites != nil && !p.ReadOnly() {
		// The volumes' DR policies, checked every second (the shortest
		// RPO is 10 s, a cycle starts at half of it).
		h.DR = dr.NewScheduler(p, n.drSites.Target, n.log)
		n.metrics.Register(h.DR)
		dctx, dcancel := context.WithCancel(context.Background())
		ddone := make(chan struct{})
		go func() { defer close(ddone); h.DR.Run(dctx, time.Second) }()
		n.onClose(func() { dcancel(); <-ddone })
	}
	if !p.ReadOnly() {
		h.DRTargets = dr.NewTargets(p, drKeep)
	}
	if n.backups != nil {
		n.metrics.Register(n.backups)
		// Scheduled backups (volume policies), checked every 30 s.
		bctx, bcancel := context.WithCancel(context.Background())
		bdone := make(chan struct{})
		go func() { defer close(bdone); n.backups.Run(bctx, 30*time.Second) }()
		n.onClose(func() { bcancel(); <-bdone; n.backups.Close() })
	}
	endpoint := apiserver.NBDEndpoint{Socket: cfg.NBDSocket, TLS: n.cfg.NBD.TLS != nil && n.cfg.NBD.RequireTLS}
	for _, l := range n.nbdLns {
		if l.Addr().Network() == "tcp" {
			endpoint.Addr = l.Addr().String()
		}
	}
	h.SetNBD(endpoint)
	h.Mount("GET /metrics", n.metrics.Handler())
	h.MountPublic(console.Prefix, console.Handler())
	if cfg.Pprof {
		h.Mount("GET /debug/pprof/", http.HandlerFunc(pprof.Index))
		h.Mount("GET /debug/pprof/profile", http.HandlerFunc(pprof.Profile))
		h.Mount("GET /debug/pprof/heap", pprof.Handler("heap"))
		h.Mount("GET /debug/pprof/allocs", pprof.Handler("allocs"))
	}
	n.handler = h
}

// joinCluster joins the cluster, shares the token store through etcd and
// serves the node's replicated volumes: their exports in front of the
// pool's, their resyncs and rebuilds in the background.
func (n *node) joinCluster(ctx context.Context) error {
	cfg, log, h := n.cfg, n.log, n.handler
	cn, err := join(ctx, cfg, n.pool, n.apiLn.Addr(), n.nbdLns, log)
	if err != nil {
		return err
	}
	n.onClose(func() { _ = cn.Close() })
	n.member = cn
	// Tokens and tenants live in etcd, the same on every node
	// (docs/security.md, "Tenants on a cluster").
	sctx, scancel := context.WithCancel(context.Background())
	n.onClose(scancel)
	if err := n.store.Share(sctx, cn.TokenStore(), log); err != nil {
		return err
	}
	if err := n.shareAdminToken(sctx, cn.TokenStore()); err != nil {
		return fmt.Errorf("admin token: %w", err)
	}
	h.Cluster = apiserver.NodeCluster(cn)
	if h.Peers, err = peers(cfg, cn.Name()); err != nil {
		return err
	}
	n.metrics.Register(cn.Collector())
	vols := replicated.New(cn, n.pool, replicated.Options{Config: cfg.Cluster, Jobs: n.jobs, Log: log,
		AtStep: crashAt(cfg.TestCrashPointFile, log)})
	n.metrics.Register(vols.Collectors()...)
	rctx, rcancel := context.WithCancel(context.Background())
	resyncDone := make(chan struct{})
	go func() { defer close(resyncDone); vols.Run(rctx) }()
	n.onClose(func() { rcancel(); <-resyncDone })
	n.exports = replicated.NewExports(n.exports, vols)
	// Opens another node forwards for its client: refused at once, that
	// node holds the refusal (docs/cluster.md, "Refusals").
	n.cfg.NBD.Forwarded = cn.OpenHop
	h.Replicated = vols
	h.Drainer = vols
	if n.backups != nil {
		n.backups.SetSnapshots(clusterSnapshots{node: cn, vols: vols, local: backup.PoolSnapshots(n.pool)})
	}
	h.Membership = cn
	return nil
}

// serve serves the API and NBD until ctx ends or a listener fails, then
// shuts them down: requests running finish (up to 10 s), jobs are
// cancelled.
func (n *node) serve(ctx context.Context) error {
	cfg, log, h := n.cfg, n.log, n.handler
	errc := make(chan error, 4) // API, API socket, NBD TCP, NBD socket
	nbdSrv := nbd.NewServer(n.exports, n.cfg.NBD)
	srv := cfg.API.httpServer(h)
	srv.ConnContext, srv.ConnState = h.ConnContext, h.ConnState // revoked tokens' connections
	var localSrv *http.Server
	if cfg.APISocket != "" {
		l, err := ListenUnix(cfg.APISocket, cfg.APISocketGroup)
		if err != nil {
			return fmt.Errorf("api socket %s: %w", cfg.APISocket, err)
		}
		n.onClose(func() { _ = l.Close() })
		localSrv = cfg.API.httpServer(h.Local())
		log.Info("serving API on a unix socket (no token: its file permissions decide)", "path", cfg.APISocket,
			"group", cfg.APISocketGroup)
		go func() { errc <- localSrv.Serve(l) }()
	}
	log.Info("serving API", "addr", n.apiLn.Addr().String(), "auth", n.token != "" || cfg.RequireToken,
		"https", n.tls.api != nil)
	var nbdAddr net.Addr
	for _, l := range n.nbdLns {
		log.Info("serving NBD", "addr", l.Addr().String(), "tls", tlsMode(n.cfg.NBD))
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
		cfg.Ready(n.apiLn.Addr(), nbdAddr)
	}
	go func() {
		if err := n.tls.serveAPI(srv, n.apiLn); !errors.Is(err, http.ErrServerClosed) {
			errc <- err
		}
	}()
	var failed error
	tick, stopWatch := n.tls.watch(cfg.TLS.WatchInterval)
	defer stopWatch()
	var removed <-chan struct{}
	if n.member != nil {
		removed = n.member.Done()
	}
wait:
	for {
		select {
		case failed = <-errc:
			log.Error("a listener failed; shutting down", "err", failed)
			break wait
		case <-removed:
			failed = n.member.Err()
			log.Error("this node left the cluster; shutting down", "err", failed)
			break wait
		case <-cfg.Reload:
			n.tls.reload(log)
		case <-tick:
			n.tls.reloadChanged(log)
		case <-ctx.Done():
			break wait
		}
	}
	log.Info("shutting down")
	h.Drain()
	sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	err := srv.Shutdown(sctx)
	if localSrv != nil {
		if lerr := localSrv.Shutdown(sctx); err == nil {
			err = lerr
		}
	}
	if nerr := nbdSrv.Shutdown(sctx); err == nil {
		err = nerr
	}
	if jerr := n.jobs.Shutdown(sctx); err == nil {
		err = jerr
	}
	if failed != nil {
		return fmt.Errorf("serve: %w", failed)
	}
	return err
}

// crashAt is the hidden test flag --test-crash-point-file (test/cluster
// only): the process kills itself at the step of a change at the cut that
// the file names when it reaches it, the tests' way to stop a primary
// exactly between two steps. nil without the flag.
func crashAt(file string, log *slog.Logger) func(step string) {
	if file == "" {
		return nil
	}
	return func(step string) {
		b, err := os.ReadFile(file)
		if err != nil || strings.TrimSpace(string(b)) != step {
			return
		}
		log.Error("test crash point reached: killing this process", "point", step)
		time.Sleep(50 * time.Millisecond) // the log line out
		_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
		select {}
	}
}
