package cluster

import (
	"fmt"
	"log/slog"
	"net/url"
	"os"
	"strings"
	"time"

	"google.golang.org/grpc"
)

// Config is what `quiver server` passes to Join, from its cluster flags.
type Config struct {
	NodeName    string // --node-name: a DNS label, unique in the cluster
	ClusterName string // --cluster-name: a DNS label
	TokenFile   string // --cluster-token-file: at least 16 characters
	// EtcdEndpoints are external etcd client URLs (--etcd-endpoints).
	EtcdEndpoints []string
	// InitialCluster (--initial-cluster n1=http://a:2380,n2=...) starts an
	// embedded etcd member named NodeName with the peer URL given for it.
	InitialCluster string
	// InitialClusterState (--initial-cluster-state) is "new" (or ""):
	// the members of InitialCluster bootstrap a new etcd cluster, or
	// ClusterStateExisting: this node's member joins a running one, which
	// `quiver node add` added it to (membership.go).
	InitialClusterState string
	// EtcdClientURLs are the client URLs the embedded member listens on
	// (--etcd-listen-client; default http://127.0.0.1:2379).
	EtcdClientURLs []string
	EtcdDataDir    string // embedded member's data (default <StateDir>/etcd)
	// EtcdCertFile, EtcdKeyFile and EtcdCAFile (--etcd-cert, --etcd-key,
	// --etcd-ca) put etcd on TLS (etcdsec.go): the node's client presents
	// the certificate and trusts the CA, and the embedded member serves
	// its client and peer URLs with the certificate and requires one of
	// the CA from every client and peer. Every etcd URL is then https.
	EtcdCertFile, EtcdKeyFile, EtcdCAFile string
	// EtcdUsername and EtcdPasswordFile log the client in to an external
	// etcd with authentication on.
	EtcdUsername, EtcdPasswordFile string
	// EtcdInsecure (--etcd-insecure) accepts plaintext etcd beyond
	// loopback, which is refused otherwise.
	EtcdInsecure bool
	// StateDir holds the node's identity (node.json); the server sets it to
	// <pool>/cluster.
	StateDir      string
	FailureDomain string // --failure-domain: a zone or rack label ("" none)
	Prefix        string // --etcd-prefix (default /quiver/)

	LeaseTTL time.Duration // node lease (default 10 s)
	// EtcdHeartbeat and EtcdElection are the embedded member's raft
	// heartbeat interval and election timeout (--etcd-heartbeat-interval,
	// --etcd-election-timeout; etcd's defaults 100 ms and 1 s). When the
	// node that leads etcd dies, a new leader is elected one to two
	// election timeouts later and extends every lease by one: a primary
	// that also led etcd fails over about L + 2 to 3 election timeouts
	// after its death, L + 1 to 2 for a primary that did not lead.
	EtcdHeartbeat, EtcdElection time.Duration
	DialTimeout                 time.Duration // first answer from etcd (default 10 s)
	StartTimeout                time.Duration // embedded member ready, peers included (default 5 min)
	ReportInterval              time.Duration // free-space updates (default 5 s)
	OpTimeout                   time.Duration // copies made or deleted (default 60 s)
	// ResyncRate limits each resync and rebuild a primary runs, in bytes
	// per second (--resync-rate; 0: unlimited).
	ResyncRate int64
	// RebuildAfter is how long the node of an out-of-sync copy may be down
	// before its primary rebuilds the copy on another node
	// (--rebuild-after, default 10 min; 0: never).
	RebuildAfter time.Duration
	// electEvery is the election ticker (default electInterval); tests
	// set it to show that the watch of primary/ alone promotes.
	electEvery time.Duration

	// APIAddr and NBDAddr are the addresses other nodes and clients use to
	// reach this node, recorded in its alive key.
	APIAddr, NBDAddr string
	Logger           *slog.Logger
	// EtcdDialOptions are added to the etcd client's gRPC options (no
	// flag sets them; tests pass an interceptor that injects etcd
	// faults). Add interceptors with grpc.WithChainUnaryInterceptor: a
	// WithUnaryInterceptor would replace the client's own retries.
	EtcdDialOptions []grpc.DialOption
}

// Enabled says whether any cluster flag is set: without one the server is a
// single node.
func (c Config) Enabled() bool {
	return c.ClusterName != "" || c.NodeName != "" || len(c.EtcdEndpoints) > 0 || c.InitialCluster != "" ||
		c.TokenFile != ""
}

func (c *Config) defaults() {
	if c.Prefix == "" {
		c.Prefix = "/quiver/"
	}
	if !strings.HasSuffix(c.Prefix, "/") {
		c.Prefix += "/"
	}
	if c.LeaseTTL <= 0 {
		c.LeaseTTL = 10 * time.Second
	}
	if c.DialTimeout <= 0 {
		c.DialTimeout = 10 * time.Second
	}
	if c.EtcdHeartbeat <= 0 {
		c.EtcdHeartbeat = defaultEtcdHeartbeat
	}
	if c.EtcdElection <= 0 {
		c.EtcdElection = defaultEtcdElection
	}
	if c.StartTimeout <= 0 {
		c.StartTimeout = 5 * time.Minute
	}
	if c.electEvery <= 0 {
		c.electEvery = electInterval
	}
	if c.ReportInterval <= 0 {
		c.ReportInterval = 5 * time.Second
	}
	if c.OpTimeout <= 0 {
		c.OpTimeout = 60 * time.Second
	}
	if len(c.EtcdClientURLs) == 0 {
		c.EtcdClientURLs = []string{"http://127.0.0.1:2379"}
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
}

// validate checks the flags that need no etcd, and returns the token. With
// TLS it makes the etcd URLs https (secureEtcd).
func (c *Config) validate() (string, error) {
	for flag, v := range map[string]string{"--node-name": c.NodeName, "--cluster-name": c.ClusterName} {
		if v == "" {
			return "", fmt.Errorf("%s is required in a cluster: %w", flag, ErrConfig)
		}
		if !isDNSLabel(v) {
			return "", fmt.Errorf("%s %q: must be a DNS label (lower-case letters, digits and '-', at most 63): %w", flag, v, ErrConfig)
		}
	}
	if c.FailureDomain != "" && !isDNSLabel(c.FailureDomain) {
		return "", fmt.Errorf("--failure-domain %q: must be a DNS label: %w", c.FailureDomain, ErrConfig)
	}
	if (len(c.EtcdEndpoints) > 0) == (c.InitialCluster != "") {
		return "", fmt.Errorf("give exactly one of --etcd-endpoints (external etcd) and --initial-cluster (embedded etcd): %w", ErrConfig)
	}
	switch c.InitialClusterState {
	case "", "new":
	case ClusterStateExisting:
		if c.InitialCluster == "" {
			return "", fmt.Errorf("--initial-cluster-state existing joins an embedded etcd member to a running cluster: "+
				"it needs --initial-cluster (quiver node add prints both): %w", ErrConfig)
		}
	default:
		return "", fmt.Errorf("--initial-cluster-state %q: want new or existing: %w", c.InitialClusterState, ErrConfig)
	}
	if err := c.secureEtcd(); err != nil {
		return "", err
	}
	if err := c.checkRaftTiming(); err != nil {
		return "", err
	}
	if c.InitialCluster != "" {
		if _, err := c.peerURL(); err != nil {
			return "", err
		}
	}
	token, err := c.readToken()
	if err != nil {
		return "", err
	}
	if c.StateDir == "" {
		return "", fmt.Errorf("no state directory for the node's identity: %w", ErrConfig)
	}
	return token, nil
}

// The embedded member's raft timing by default: etcd's own.
const (
	defaultEtcdHeartbeat = 100 * time.Millisecond
	defaultEtcdElection  = time.Second
)

// checkRaftTiming checks --etcd-heartbeat-interval and
// --etcd-election-timeout by etcd's rules (whole milliseconds, an election
// timeout of at least five heartbeats and at most 50 s), and that the
// election timeout leaves the node lease room: a new etcd leader extends
// every lease by one, so an election timeout near L would double every
// failover.
func (c *Config) checkRaftTiming() error {
	hb, el, lease := c.EtcdHeartbeat, c.EtcdElection, c.LeaseTTL
	if hb == 0 {
		hb = defaultEtcdHeartbeat
	}
	if el == 0 {
		el = defaultEtcdElection
	}
	if lease == 0 {
		lease = 10 * time.Second
	}
	if hb == defaultEtcdHeartbeat && el == defaultEtcdElection {
		return nil
	}
	if c.InitialCluster == "" {
		return fmt.Errorf("--etcd-heartbeat-interval and --etcd-election-timeout tune the embedded etcd member (--initial-cluster); "+
			"an external etcd has its own flags of those names: %w", ErrConfig)
	}
	switch {
	case hb < 10*time.Millisecond || hb%time.Millisecond != 0:
		return fmt.Errorf("--etcd-heartbeat-interval %v: want whole milliseconds, at least 10ms: %w", hb, ErrConfig)
	case el%time.Millisecond != 0 || el < 5*hb || el > 50*time.Second:
		return fmt.Errorf("--etcd-election-timeout %v: want whole milliseconds, at least five heartbeats (%v) and at most 50s: %w",
			el, 5*hb, ErrConfig)
	case el*2 > lease:
		return fmt.Errorf("--etcd-election-timeout %v: at most half of --node-lease-ttl %v (a new etcd leader extends every lease by an election timeout): %w",
			el, lease, ErrConfig)
	}
	return nil
}

// peerURL finds this node's peer URL in InitialCluster.
func (c *Config) peerURL() (*url.URL, error) {
	var found *url.URL
	for item := range strings.SplitSeq(c.InitialCluster, ",") {
		name, raw, ok := strings.Cut(strings.TrimSpace(item), "=")
		if !ok || name == "" {
			return nil, fmt.Errorf("--initial-cluster item %q: want NAME=URL: %w", item, ErrConfig)
		}
		u, err := url.Parse(raw)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return nil, fmt.Errorf("--initial-cluster item %q: want NAME=http://HOST:PORT or NAME=https://HOST:PORT: %w", item, ErrConfig)
		}
		if name == c.NodeName {
			found = u
		}
	}
	if found == nil {
		return nil, fmt.Errorf("--initial-cluster %q names no member %q (--node-name): %w", c.InitialCluster, c.NodeName, ErrConfig)
	}
	return found, nil
}

// isDNSLabel reports whether s is an RFC 1123 label.
func isDNSLabel(s string) bool {
	if len(s) == 0 || len(s) > 63 || s[0] == '-' || s[len(s)-1] == '-' {
		return false
	}
	for _, r := range s {
		if (r < 'a' || r > 'z') && (r < '0' || r > '9') && r != '-' {
			return false
		}
	}
	return true
}

// readToken reads and checks the cluster token of --cluster-token-file.
func (c *Config) readToken() (string, error) {
	if c.TokenFile == "" {
		return "", fmt.Errorf("--cluster-token-file is required in a cluster: %w", ErrConfig)
	}
	b, err := os.ReadFile(c.TokenFile)
	if err != nil {
		return "", fmt.Errorf("read cluster token file: %w", err)
	}
	token := strings.TrimSpace(string(b))
	if len(token) < 16 {
		return "", fmt.Errorf("cluster token file %s: the token must be at least 16 characters: %w", c.TokenFile, ErrConfig)
	}
	return token, nil
}
