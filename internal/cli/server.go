package cli

import (
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/quiverstorage/quiver/internal/api"
	"github.com/quiverstorage/quiver/internal/cluster"
	"github.com/quiverstorage/quiver/internal/durable"
	"github.com/quiverstorage/quiver/internal/nbd"
	"github.com/quiverstorage/quiver/internal/quantity"
	"github.com/quiverstorage/quiver/internal/server"
)

func (a *app) serverCommand() *cobra.Command {
	cfg := server.Config{}
	var logLevel, readyFile, configFile string
	cmd := &cobra.Command{
		Use:   "server",
		Short: "Run a storage node: open the pool, serve the API and the disks over NBD",
		Long: `Run a storage node: open the pool directory, serve the HTTP API and every
disk over NBD until interrupted.

One server at a time opens a pool: the second one fails, naming the PID of
the first. A new pool is made only in an empty (or absent) directory, or by
'quiver pool init DIR'; a directory that holds anything else but no
pool.json is refused, as is, with --expect-mount, a directory that is not a
mount point (the pool's filesystem is not mounted). A pool the server cannot
write (a read-only mount, or no write permission on the pool directory) is
served read-only. A volume whose files are damaged or lead outside the pool
is quarantined: listed as broken, not served, not touched.

NBD exports are <volume>/<disk> (read-write) and <volume>@<snapshot>/<disk>
(read-only), e.g. nbd://127.0.0.1:10809/web01/root. Clients of an attachment
(quiver attach create) add its token: <volume>/<disk>/<token>.

Everything listens on loopback by default. At its first start the server
makes an admin API token, POOL/admin.token (0600), unless --token-file gives
one. On another address, with --require-token, or with --token-file, every API
request needs a token (clients pass --token-file) and every NBD export name an
attachment or API token, loopback included; otherwise requests without a token
on loopback act as the admin, so any local user can use the API and NBD (the
server warns). NBD on another address requires a token in every export name
(as --nbd-require-token does on loopback). "quiver token" makes tokens of
tenants and roles (docs/security.md, "Tenants").

--tls-cert and --tls-key serve the API over HTTPS (clients pass --ca-file and
an https:// --server). --nbd-tls-cert and --nbd-tls-key let NBD clients
upgrade with NBD_OPT_STARTTLS; --nbd-tls require refuses clients that do not
(the default beyond loopback). SIGHUP reloads every certificate file, and so
does a change of the files (checked every --tls-watch-interval): new
connections get the new certificate, established ones keep theirs.

--api-socket serves the API on a unix socket without the token: the socket is
0600 (0660 with --api-socket-group), so its file permissions decide who may
use it (quiver --server unix:///path ...). The NBD socket gets the same mode.

The --api-* and --nbd-* limits bound what clients can hold; docs/security.md
explains each.

With --cluster-name the server is a node of a cluster whose state is in etcd
(docs/cluster.md): --initial-cluster n1=http://HOST:2380,n2=... runs an etcd
member inside the node (the easy three-node setup), --etcd-endpoints uses an
external etcd. Every node of a cluster needs --node-name (unique) and the
cluster's --cluster-token-file. The server exits at start, naming the
conflict, when etcd does not answer, when etcd holds another cluster, when
the token is wrong, and when the node name is taken. etcd beyond loopback
needs TLS: --etcd-cert, --etcd-key and --etcd-ca (quiver cluster certs makes
them) make every etcd URL https, the node's client present its certificate
and the embedded member require one of that CA from its clients and peers;
plaintext etcd beyond loopback is refused unless --etcd-insecure. Volumes then take
--replicas N: their copies go on N distinct nodes. Without cluster flags the
server is a single node and refuses replicas above 1.

Every flag can also be set in a YAML file, --config (default
/etc/quiver/server.yaml when it exists), by its name without "--":
    listen: 0.0.0.0:7480
    token-file: /etc/quiver/token
A flag on the command line wins over the file.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := applyConfig(cmd.Flags(), configFile); err != nil {
				return err
			}
			var level slog.Level
			if err := level.UnmarshalText([]byte(logLevel)); err != nil {
				return fmt.Errorf("--log-level %q: want debug, info, warn or error", logLevel)
			}
			cfg.TokenFile = a.tokenFile
			cfg.Logger = slog.New(slog.NewTextHandler(a.env.Stderr, &slog.HandlerOptions{Level: level}))
			hup := make(chan os.Signal, 1)
			signal.Notify(hup, syscall.SIGHUP)
			defer signal.Stop(hup)
			reload, done := make(chan struct{}), make(chan struct{})
			defer close(done)
			go func() {
				for {
					select {
					case <-hup:
					case <-done:
						return
					}
					select {
					case reload <- struct{}{}:
					case <-done:
						return
					}
				}
			}()
			cfg.Reload = reload
			if readyFile != "" {
				cfg.Ready = writeReadyFile(readyFile, cfg.NBDSocket, cfg.Logger)
			}
			return server.Run(cmd.Context(), cfg)
		},
	}
	cmd.Flags().StringVar(&cfg.PoolDir, "pool", "./quiver-data", "pool directory (a new pool is made only in an empty or absent one)")
	cmd.Flags().BoolVar(&cfg.ExpectMount, "expect-mount", false,
		"refuse a pool directory that is not a mount point (its filesystem is not mounted)")
	cmd.Flags().BoolVar(&cfg.NoIOUring, "no-io-uring", false,
		"try the NBD readers' batches of small reads and writes with one system call each, not through io_uring")
	cmd.Flags().StringVar(&cfg.APIAddr, "listen", api.DefaultAddr, "host:port of the HTTP API")
	cmd.Flags().StringVar(&cfg.NBDAddr, "nbd-listen", nbd.DefaultAddr, "host:port of the NBD server (empty: no TCP)")
	cmd.Flags().StringVar(&cfg.NBDSocket, "nbd-socket", "", "also serve NBD on this unix socket")
	cmd.Flags().BoolVar(&cfg.RequireToken, "require-token", false,
		"refuse API requests without a token on loopback too; without --token-file the admin token is POOL/admin.token (always on beyond loopback)")
	cmd.Flags().BoolVar(&cfg.NBDRequireToken, "nbd-require-token", false,
		"refuse NBD exports without an attachment token (always on beyond loopback)")
	cmd.Flags().StringVar(&cfg.KeyFile, "key-file", "",
		"key file (0600, made if absent, outside the pool) of the local key provider that wraps encrypted volumes' data keys (docs/encryption.md)")
	cmd.Flags().StringVar(&cfg.KMIP.Addr, "kmip-server", "",
		"host:port of a KMIP server (KMIP 1.4 over TLS, port 5696) whose keys wrap encrypted volumes' data keys; needs --kmip-ca, --kmip-cert and --kmip-key (docs/encryption.md)")
	cmd.Flags().StringVar(&cfg.KMIP.CAFile, "kmip-ca", "", "PEM file of the CA that --kmip-server's certificate must chain to")
	cmd.Flags().StringVar(&cfg.KMIP.CertFile, "kmip-cert", "", "PEM client certificate quiver presents to --kmip-server")
	cmd.Flags().StringVar(&cfg.KMIP.KeyFile, "kmip-key", "", "the PEM key of --kmip-cert")
	cmd.Flags().DurationVar(&cfg.KMIP.Timeout, "kmip-timeout", 5*time.Second,
		"time for one request to --kmip-server, connection included (keep it below --nbd-handshake-timeout, so that an NBD client gets the refusal of an export whose key the KMS does not give)")
	cmd.Flags().StringVar(&cfg.NewKeys, "new-volume-keys", "",
		"key provider of new encrypted volumes: keyfile or kmip (required with both --key-file and --kmip-server; existing volumes keep theirs)")
	cmd.Flags().BoolVar(&cfg.Pprof, "pprof", false, "serve Go profiles at /debug/pprof/ on the API port")
	cmd.Flags().StringVar(&cfg.BackupConfig, "backup-config", "",
		"JSON file naming the backup targets (S3 endpoint, bucket, files with the access key, secret key and repository key; docs/backup.md)")
	cmd.Flags().StringVar(&cfg.DRConfig, "dr-config", "",
		"JSON file naming the DR sites this server ships volumes to (API URL, files with an admin token there and its CA; docs/dr.md)")
	cmd.Flags().BoolVar(&cfg.MetricsPerDisk, "metrics-per-disk", false,
		"also export the data path's metrics per disk at /metrics, latency histograms included (about 100 series a disk; by default they are per volume)")
	cmd.Flags().Float64Var(&cfg.MaxOvercommit, "max-overcommit", 0,
		"refuse creates, clones and disk growth that would provision more than this many times the pool's size, e.g. 3 (0: no limit)")
	f := cmd.Flags()
	// For test/cluster only: a primary kills itself at the step of a change
	// at the cut named in this file (docs/cluster.md, "Intents"). Hidden.
	f.StringVar(&cfg.TestCrashPointFile, "test-crash-point-file", "",
		"TESTING ONLY: kill the server at the crash point named in this file")
	_ = f.MarkHidden("test-crash-point-file")
	// For benchmarks only: the blocking reader against the poller
	// (internal/nbd/socket.go). Hidden.
	f.BoolVar(&cfg.NBD.Polled, "nbd-polled", false, "BENCHMARKS ONLY: keep NBD connections in Go's network poller")
	_ = f.MarkHidden("nbd-polled")
	apiDef, nbdDef := server.DefaultAPILimits(), nbd.DefaultConfig()
	f.StringVar(&cfg.APISocket, "api-socket", "", "also serve the API on this unix socket (mode 0600, no token)")
	f.StringVar(&cfg.APISocketGroup, "api-socket-group", "", "group allowed on the API and NBD sockets (mode 0660)")
	f.IntVar(&cfg.API.MaxConns, "api-max-conns", apiDef.MaxConns, "API connections at once; more are closed at accept")
	f.IntVar(&cfg.API.MaxConnsPerPeer, "api-max-conns-per-peer", apiDef.MaxConnsPerPeer, "API connections at once from one IP address")
	f.DurationVar(&cfg.API.HeaderTimeout, "api-header-timeout", apiDef.HeaderTimeout, "time for a request's headers")
	f.DurationVar(&cfg.API.BodyTimeout, "api-body-timeout", apiDef.BodyTimeout, "time for a request's body")
	f.DurationVar(&cfg.API.IdleTimeout, "api-idle-timeout", apiDef.IdleTimeout, "idle keep-alive API connections are closed after it")
	f.IntVar(&cfg.NBD.MaxConns, "nbd-max-conns", nbdDef.MaxConns, "NBD connections at once; more are closed at accept")
	f.IntVar(&cfg.NBD.MaxConnsPerPeer, "nbd-max-conns-per-peer", nbdDef.MaxConnsPerPeer, "NBD connections at once from one IP address (or the unix socket)")
	f.IntVar(&cfg.NBD.MaxHandshakes, "nbd-max-handshakes", nbdDef.MaxHandshakes, "NBD connections negotiating at once")
	f.IntVar(&cfg.NBD.MaxHandshakesPerPeer, "nbd-max-handshakes-per-peer", nbdDef.MaxHandshakesPerPeer, "NBD connections negotiating at once from one IP address")
	f.DurationVar(&cfg.NBD.GreetingTimeout, "nbd-greeting-timeout", nbdDef.GreetingTimeout, "time for an NBD client's first bytes (its flags)")
	f.DurationVar(&cfg.NBD.HandshakeTimeout, "nbd-handshake-timeout", nbdDef.HandshakeTimeout, "time for a whole NBD negotiation")
	f.DurationVar(&cfg.NBD.SendTimeout, "nbd-send-timeout", nbdDef.SendTimeout, "an NBD client that takes none of a reply for this long is disconnected")
	f.Var(byteSize{&cfg.NBD.MaxConnBytes}, "nbd-max-conn-bytes", "READ/WRITE bytes in flight per NBD connection (default 64Mi)")
	f.Var(byteSize{&cfg.NBD.MaxPeerBytes}, "nbd-max-peer-bytes", "READ/WRITE bytes in flight per NBD peer (default 256Mi)")
	f.Var(byteSize{&cfg.NBD.MaxBytes}, "nbd-max-bytes", "READ/WRITE bytes in flight across all NBD connections (default 1Gi)")
	f.StringVar(&cfg.TLS.CertFile, "tls-cert", "", "serve the API (and /metrics) over HTTPS with this PEM certificate (reloaded on SIGHUP and when the files change)")
	f.StringVar(&cfg.TLS.KeyFile, "tls-key", "", "the PEM key of --tls-cert")
	f.StringVar(&cfg.TLS.NBDCertFile, "nbd-tls-cert", "", "PEM certificate for NBD over TLS (NBD_OPT_STARTTLS; reloaded on SIGHUP and when the files change)")
	f.StringVar(&cfg.TLS.NBDKeyFile, "nbd-tls-key", "", "the PEM key of --nbd-tls-cert")
	f.StringVar(&cfg.TLS.NBDMode, "nbd-tls", "",
		"off, on (clients may upgrade) or require (default with --nbd-tls-cert: require beyond loopback, on on loopback)")
	f.DurationVar(&cfg.TLS.WatchInterval, "tls-watch-interval", 0,
		"how often certificate files are checked for a change and reloaded (0: every 5s; negative: only on SIGHUP)")
	f.StringVar(&cfg.TLS.NBDClientCAFile, "nbd-tls-client-ca", "",
		"PEM file of the CAs of client certificates: NBD clients must present one, the API over HTTPS asks (--api-client-cert); reloaded on SIGHUP and when the file changes")
	f.StringVar(&cfg.TLS.APIClientCert, "api-client-cert", "",
		"client certificates on the API over HTTPS: off, on (asked and verified, not required) or require (default with --tls-cert and --nbd-tls-client-ca: on)")
	addClusterFlags(f, &cfg.Cluster)
	cmd.Flags().StringVar(&logLevel, "log-level", "info", "debug, info, warn or error")
	cmd.Flags().StringVar(&configFile, "config", "", "YAML file of settings, each a flag name without -- (default "+defaultConfig+" when it exists)")
	cmd.Flags().StringVar(&readyFile, "ready-file", "",
		"once serving, write the bound addresses here as JSON (for port 0 in scripts and tests)")
	return cmd
}

// writeReadyFile returns a server.Config.Ready that writes path (api.ReadyFile)
// atomically, so a reader sees no file or a whole one. A failure is logged:
// the server is up and serving either way.
func writeReadyFile(path, socket string, log *slog.Logger) func(apiAddr, nbdAddr net.Addr) {
	return func(apiAddr, nbdAddr net.Addr) {
		r := api.ReadyFile{PID: os.Getpid(), API: apiAddr.String(), NBDSocket: socket}
		if nbdAddr != nil {
			r.NBD = nbdAddr.String()
		}
		if err := durable.WriteJSONPath(path, r); err != nil {
			log.Error("write ready file", "path", path, "err", err)
		}
	}
}

// byteSize is a flag holding a Kubernetes quantity of bytes (64Mi, 1Gi).
type byteSize struct{ v *int64 }

func (b byteSize) String() string {
	if b.v == nil || *b.v == 0 {
		return ""
	}
	return quantity.Format(*b.v)
}

func (b byteSize) Set(s string) error {
	n, err := quantity.Parse(s)
	if err != nil {
		return err
	}
	*b.v = n
	return nil
}

func (byteSize) Type() string { return "quantity" }

// addClusterFlags adds the flags that make the server a node of a cluster
// (docs/cluster.md); with none of them set it is a single node.
func addClusterFlags(f *pflag.FlagSet, c *cluster.Config) {
	f.StringVar(&c.ClusterName, "cluster-name", "", "make this server a node of the cluster of this name (a DNS label)")
	f.StringVar(&c.NodeName, "node-name", "", "this node's name in the cluster (a DNS label, unique)")
	f.StringVar(&c.TokenFile, "cluster-token-file", "", "file holding the cluster's token (at least 16 characters; the same on every node)")
	f.StringSliceVar(&c.EtcdEndpoints, "etcd-endpoints", nil, "client URLs of an external etcd cluster (comma-separated)")
	f.StringVar(&c.InitialCluster, "initial-cluster", "",
		"run an etcd member in this node: every member as NAME=PEER-URL, comma-separated (this node's NAME is --node-name)")
	f.StringVar(&c.InitialClusterState, "initial-cluster-state", "new",
		"new: the members of --initial-cluster start a new cluster; existing: this node's member joins a running one (quiver node add prints the flags)")
	f.StringSliceVar(&c.EtcdClientURLs, "etcd-listen-client", []string{"http://127.0.0.1:2379"},
		"client URLs the embedded etcd member serves (other nodes' --etcd-endpoints may use them)")
	f.StringVar(&c.EtcdCertFile, "etcd-cert", "",
		"PEM certificate of this node for etcd: its client presents it, the embedded member serves and peers with it (every etcd URL is then https)")
	f.StringVar(&c.EtcdKeyFile, "etcd-key", "", "the PEM key of --etcd-cert")
	f.StringVar(&c.EtcdCAFile, "etcd-ca", "",
		"PEM CA file: the etcd servers' certificates must come from it, and the embedded member requires one of it from every client and peer")
	f.StringVar(&c.EtcdUsername, "etcd-username", "", "user name for an external etcd with authentication on")
	f.StringVar(&c.EtcdPasswordFile, "etcd-password-file", "", "file holding the password of --etcd-username")
	f.BoolVar(&c.EtcdInsecure, "etcd-insecure", false,
		"accept etcd in plaintext beyond loopback (refused otherwise: anyone who reaches it could read and change the cluster's state)")
	f.StringVar(&c.EtcdDataDir, "etcd-data-dir", "", "data directory of the embedded etcd member (default POOL/cluster/etcd)")
	f.StringVar(&c.Prefix, "etcd-prefix", "/quiver/", "etcd key prefix of the cluster (one cluster per prefix)")
	f.StringVar(&c.FailureDomain, "failure-domain", "", "this node's failure domain (zone or rack): copies of a volume go to different ones")
	f.DurationVar(&c.LeaseTTL, "node-lease-ttl", 10*time.Second, "the node is down for the cluster this long after it stops renewing its etcd lease")
	f.DurationVar(&c.EtcdHeartbeat, "etcd-heartbeat-interval", 100*time.Millisecond,
		"raft heartbeat interval of the embedded etcd member (etcd's default; the same on every node)")
	f.DurationVar(&c.EtcdElection, "etcd-election-timeout", time.Second,
		"raft election timeout of the embedded etcd member, at least 5 heartbeats; a primary that also led etcd fails over "+
			"about 2-3 election timeouts after --node-lease-ttl (500ms on a quiet LAN halves that; the same on every node)")
	f.DurationVar(&c.DialTimeout, "etcd-dial-timeout", 10*time.Second, "time for etcd's first answer at start; the server exits after it")
	f.DurationVar(&c.StartTimeout, "etcd-start-timeout", 5*time.Minute, "time for the embedded member to find a quorum of --initial-cluster")
	f.DurationVar(&c.ReportInterval, "node-report-interval", 5*time.Second, "how often the node reports its free space")
	f.DurationVar(&c.OpTimeout, "cluster-op-timeout", time.Minute, "time for every copy of a volume to be made or deleted")
	f.DurationVar(&c.RebuildAfter, "rebuild-after", 10*time.Minute, "rebuild a copy on another node when its node is down this long (0: never)")
	f.Var(byteSize{&c.ResyncRate}, "resync-rate", "bytes per second each resync or rebuild of a copy may copy, e.g. 100Mi (default: unlimited)")
}
