// Package server assembles a storage node: it opens the pool, starts the job
// runner and serves the HTTP API (with /metrics) and NBD until its context is
// cancelled. It is wiring only: the domain lives in pool and, on a cluster,
// replicated, the transports in apiserver and nbd, the wire types in api.
//
// With cluster flags it joins the cluster (internal/cluster) before serving,
// and serves the replicated volumes (internal/replicated).
//
// Imports from quiver: api, apiserver, auth, backup, cluster, connlimit, console, crypt, crypt/keyfile, crypt/kmip, durable, job, metrics, nbd, pool, replicated, storage, tlscert.
package server

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"strings"

	"github.com/quiverstorage/quiver/internal/cluster"
	"github.com/quiverstorage/quiver/internal/nbd"
	"github.com/quiverstorage/quiver/internal/pool"
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
	// KeyFile is the key file of the local key provider (crypt/keyfile, crypt/kmip)
	// that wraps the data keys of encrypted volumes; it must lie outside
	// the pool. Empty: no key provider, encrypted volumes are refused.
	KeyFile string
	// KMIP is the KMIP key provider (crypt/kmip), when its Addr is set
	// (keys.go). Both it and KeyFile may be set: each volume's wrapped key
	// names its provider.
	KMIP KMIPConfig
	// NewKeys names the key provider that makes the keys of new encrypted
	// volumes ("keyfile" or "kmip"); empty: the only one configured. Both
	// configured and none named is refused at start.
	NewKeys   string
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
	// MetricsPerDisk also exports the data path's metrics per disk, latency
	// histograms included (metrics.Options.PerDisk); by default they are
	// per volume.
	MetricsPerDisk bool
	// BackupConfig, when set, names the backup configuration file: the
	// targets (object stores) that `quiver backup` writes to, with the
	// files holding their secrets (docs/backup.md).
	BackupConfig string
	// DRConfig, when set, names the DR configuration file: the sites this
	// server ships its volumes to, with the files holding their tokens
	// (docs/dr.md).
	DRConfig string
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
	// change at the cut where this process kills itself (crashAt).
	// Empty: none.
	TestCrashPointFile string
}

// ErrInsecure refuses a non-loopback listener without authentication.
var ErrInsecure = errors.New("refusing to listen on a non-loopback address without authentication: pass --token-file")

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
