package cluster

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/quiverstorage/quiver/internal/api"
	"github.com/quiverstorage/quiver/internal/tlscert"
)

// TestEtcdSecurityFlags checks the etcd URLs against the TLS flags: plaintext
// beyond loopback refused unless --etcd-insecure, loopback plaintext
// allowed, every URL https with TLS.
func TestEtcdSecurityFlags(t *testing.T) {
	dir := t.TempDir()
	token := writeToken(t, dir, "0123456789abcdef-secret")
	pw := filepath.Join(dir, "pw")
	if err := os.WriteFile(pw, []byte("secret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	external := func(eps ...string) Config { return Config{EtcdEndpoints: eps} }
	embedded := func(initial string, clients ...string) Config {
		return Config{InitialCluster: initial, EtcdClientURLs: clients}
	}
	withTLS := func(c Config) Config {
		c.EtcdCertFile, c.EtcdKeyFile, c.EtcdCAFile = "n1.crt", "n1.key", "ca.crt"
		return c
	}
	insecure := func(c Config) Config { c.EtcdInsecure = true; return c }
	for _, c := range []struct {
		name string
		cfg  Config
		want error // nil: accepted
		// urls are the etcd URLs after validation (external endpoints,
		// or --initial-cluster then the client URLs).
		urls string
	}{
		{"external loopback plaintext", external("http://127.0.0.1:2379", "localhost:2379", "http://[::1]:2379"), nil,
			"http://127.0.0.1:2379 http://localhost:2379 http://[::1]:2379"},
		{"external plaintext beyond loopback", external("http://127.0.0.1:2379", "http://10.0.0.5:2379"), ErrPlaintextEtcd, ""},
		{"external HOST:PORT beyond loopback", external("10.0.0.5:2379"), ErrPlaintextEtcd, ""},
		{"external plaintext, insecure", insecure(external("http://10.0.0.5:2379")), nil, "http://10.0.0.5:2379"},
		{"external https without a client certificate", external("https://etcd.example:2379"), nil, "https://etcd.example:2379"},
		{"external with TLS", withTLS(external("http://10.0.0.5:2379", "10.0.0.6:2379")), nil,
			"https://10.0.0.5:2379 https://10.0.0.6:2379"},
		{"external with a password", func() Config {
			c := withTLS(external("10.0.0.5:2379"))
			c.EtcdUsername, c.EtcdPasswordFile = "quiver", pw
			return c
		}(), nil, "https://10.0.0.5:2379"},
		{"a username without a password", func() Config {
			c := external("http://127.0.0.1:2379")
			c.EtcdUsername = "quiver"
			return c
		}(), ErrConfig, ""},
		{"a certificate without its key", func() Config {
			c := external("http://127.0.0.1:2379")
			c.EtcdCertFile = "n1.crt"
			return c
		}(), ErrConfig, ""},
		{"embedded on loopback", embedded("n1=http://127.0.0.1:2380,n2=http://127.0.0.2:2380", "http://127.0.0.1:2379"), nil,
			"n1=http://127.0.0.1:2380,n2=http://127.0.0.2:2380 http://127.0.0.1:2379"},
		{"embedded client URL beyond loopback", embedded("n1=http://127.0.0.1:2380", "http://10.0.0.1:2379", "http://127.0.0.1:2379"),
			ErrPlaintextEtcd, ""},
		{"embedded peer beyond loopback", embedded("n1=http://127.0.0.1:2380,n2=http://10.0.0.2:2380", "http://127.0.0.1:2379"),
			ErrPlaintextEtcd, ""},
		{"embedded beyond loopback, insecure", insecure(embedded("n1=http://10.0.0.1:2380", "http://10.0.0.1:2379")), nil,
			"n1=http://10.0.0.1:2380 http://10.0.0.1:2379"},
		{"embedded with TLS", withTLS(embedded("n1=http://10.0.0.1:2380,n2=https://10.0.0.2:2380", "http://10.0.0.1:2379")), nil,
			"n1=https://10.0.0.1:2380,n2=https://10.0.0.2:2380 https://10.0.0.1:2379"},
		{"embedded https without TLS", embedded("n1=https://127.0.0.1:2380", "http://127.0.0.1:2379"), ErrConfig, ""},
		{"embedded without a CA", func() Config {
			c := withTLS(embedded("n1=http://10.0.0.1:2380", "http://10.0.0.1:2379"))
			c.EtcdCAFile = ""
			return c
		}(), ErrConfig, ""},
		{"embedded with a username", func() Config {
			c := withTLS(embedded("n1=http://10.0.0.1:2380", "http://10.0.0.1:2379"))
			c.EtcdUsername, c.EtcdPasswordFile = "quiver", pw
			return c
		}(), ErrConfig, ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			cfg := c.cfg
			cfg.NodeName, cfg.ClusterName, cfg.TokenFile, cfg.StateDir = "n1", "alpha", token, dir
			before := strings.Join(cfg.EtcdClientURLs, " ") + strings.Join(cfg.EtcdEndpoints, " ")
			// The caller's slices: validate must rewrite copies.
			callers, callerEPs := cfg.EtcdClientURLs, cfg.EtcdEndpoints
			_, err := cfg.validate()
			if c.want == nil {
				if err != nil {
					t.Fatalf("refused: %v", err)
				}
			} else {
				if !errors.Is(err, c.want) || !errors.Is(err, ErrConfig) {
					t.Fatalf("err = %v, want %v", err, c.want)
				}
				t.Logf("refused: %v", err)
				if errors.Is(err, ErrPlaintextEtcd) {
					for _, flag := range []string{"--etcd-cert", "--etcd-ca", "--etcd-insecure"} {
						if !strings.Contains(err.Error(), flag) {
							t.Errorf("the refusal names no %s", flag)
						}
					}
				}
				return
			}
			got := strings.Join(cfg.EtcdEndpoints, " ")
			if cfg.InitialCluster != "" {
				got = cfg.InitialCluster + " " + strings.Join(cfg.EtcdClientURLs, " ")
			}
			if got != c.urls {
				t.Errorf("URLs %q, want %q", got, c.urls)
			}
			if after := strings.Join(callers, " ") + strings.Join(callerEPs, " "); after != before {
				t.Errorf("the caller's URLs changed: %q, were %q", after, before)
			}
		})
	}
}

// tlsFiles are a node's --etcd-cert, --etcd-key and --etcd-ca.
type tlsFiles struct{ cert, key, ca string }

// issue writes a certificate of ca named name for hosts with usage, and the
// CA's certificate, into dir.
func issue(t *testing.T, ca *tlscert.Authority, dir, name string, usage tlscert.Usage, hosts ...string) tlsFiles {
	t.Helper()
	cert, key, err := ca.Issue(name, hosts, usage, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	f := tlsFiles{filepath.Join(dir, name+".crt"), filepath.Join(dir, name+".key"), filepath.Join(dir, "ca-"+name+".crt")}
	for file, b := range map[string][]byte{f.cert: cert, f.key: key, f.ca: ca.CertPEM} {
		if err := os.WriteFile(file, b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return f
}

// freeAddr returns host:port with a port nothing listens on now at ip.
func freeAddr(t *testing.T, ip string) string {
	t.Helper()
	l, err := net.Listen("tcp", ip+":0")
	if err != nil {
		t.Skipf("no %s on this host's loopback: %v", ip, err)
	}
	defer l.Close()
	return l.Addr().String()
}

// TestEmbeddedClusterOverTLS forms a cluster of three embedded members on
// 127.0.0.1-3 over TLS with client certificates (certificates of the CA that
// quiver cluster certs uses), places a volume on the three nodes through
// it, and checks that etcd refuses a client without a certificate and one
// with a certificate of another CA.
func TestEmbeddedClusterOverTLS(t *testing.T) {
	dir := t.TempDir()
	ca, _, err := tlscert.NewAuthority("test etcd CA", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	token := writeToken(t, dir, "0123456789abcdef-secret")
	names, ips := []string{"n1", "n2", "n3"}, []string{"127.0.0.1", "127.0.0.2", "127.0.0.3"}
	peers, clients := make([]string, 3), make([]string, 3)
	var initial []string
	for i, ip := range ips {
		peers[i], clients[i] = freeAddr(t, ip), freeAddr(t, ip)
		// http: with the TLS flags the node makes them https.
		initial = append(initial, fmt.Sprintf("%s=http://%s", names[i], peers[i]))
	}
	nodes, stores := make([]*Node, 3), make([]*memStore, 3)
	errs := make([]error, 3)
	var wg sync.WaitGroup
	for i, name := range names {
		f := issue(t, ca, dir, name, tlscert.ServerAuth|tlscert.ClientAuth, ips[i])
		cfg := Config{NodeName: name, ClusterName: "alpha", TokenFile: token, InitialCluster: strings.Join(initial, ","),
			EtcdClientURLs: []string{"http://" + clients[i]}, StateDir: filepath.Join(dir, name),
			EtcdCertFile: f.cert, EtcdKeyFile: f.key, EtcdCAFile: f.ca, APIAddr: ips[i] + ":1",
			LeaseTTL: 2 * time.Second, StartTimeout: 3 * time.Minute, OpTimeout: 20 * time.Second, Logger: testLogger(t)}
		stores[i] = newMemStore()
		wg.Go(func() { nodes[i], errs[i] = Join(context.Background(), cfg, stores[i]) })
	}
	wg.Wait()
	// Every member that joined is closed before the temporary directory
	// goes, also when another failed to join: a member left running
	// purges its WAL in a removed directory and etcd exits the process.
	for _, n := range nodes {
		if n != nil {
			t.Cleanup(func() { _ = n.Close() })
		}
	}
	for i := range nodes {
		if errs[i] != nil {
			t.Fatalf("join %s: %v", names[i], errs[i])
		}
	}
	ctx := context.Background()
	spec := api.VolumeSpec{Name: "web01", Capacity: 1 << 30, Replicas: 3}
	p, _, err := nodes[1].Volumes().CreateVolume(ctx, spec, "", func(bool, string) bool { return false })
	if err != nil {
		t.Fatalf("create through the TLS cluster: %v", err)
	}
	for i, s := range stores {
		if !s.has("web01") {
			t.Errorf("%s holds no copy of web01 (placement %+v)", names[i], p)
		}
	}

	other, _, err := tlscert.NewAuthority("another CA", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	admin := issue(t, ca, dir, "admin", tlscert.ClientAuth)
	stranger := issue(t, other, dir, "stranger", tlscert.ClientAuth)
	for _, c := range []struct {
		name      string
		cert, key string
		canRead   bool
	}{
		{"a certificate of the cluster's CA", admin.cert, admin.key, true},
		{"no certificate", "", "", false},
		{"a certificate of another CA", stranger.cert, stranger.key, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			// The client trusts the cluster's CA: only its own
			// certificate can make it fail.
			tc, err := tlscert.ClientConfig(admin.ca, c.cert, c.key)
			if err != nil {
				t.Fatal(err)
			}
			cli, err := clientv3.New(clientv3.Config{Endpoints: []string{"https://" + clients[0]}, TLS: tc,
				DialTimeout: 3 * time.Second, Logger: zap.NewNop()})
			if err == nil {
				defer cli.Close()
				rctx, cancel := context.WithTimeout(ctx, 3*time.Second)
				defer cancel()
				var resp *clientv3.GetResponse
				if resp, err = cli.Get(rctx, "/quiver/cluster"); err == nil && len(resp.Kvs) != 1 {
					t.Fatalf("read /quiver/cluster: %d keys", len(resp.Kvs))
				}
			}
			if (err == nil) != c.canRead {
				t.Fatalf("read a key: %v; want it read: %v", err, c.canRead)
			}
			t.Logf("read a key: %v", err)
		})
	}
}

// TestRaftTimingFlags: --etcd-heartbeat-interval and --etcd-election-timeout
// tune the embedded member only, by etcd's rules, and leave the node lease
// room; etcd's defaults pass everywhere.
func TestRaftTimingFlags(t *testing.T) {
	dir := t.TempDir()
	token := writeToken(t, dir, "0123456789abcdef-secret")
	const initial = "n1=http://127.0.0.1:2380"
	for _, c := range []struct {
		name          string
		external      bool
		hb, el, lease time.Duration
		refused       string // a substring of the refusal, "" accepted
	}{
		{name: "defaults, embedded"},
		{name: "defaults, external", external: true},
		{name: "etcd's defaults given, external", external: true, hb: 100 * time.Millisecond, el: time.Second},
		{name: "a LAN's 50ms/500ms", hb: 50 * time.Millisecond, el: 500 * time.Millisecond, lease: 3 * time.Second},
		{name: "tuned, external", external: true, el: 500 * time.Millisecond, refused: "embedded etcd member"},
		{name: "heartbeat under 10ms", hb: 5 * time.Millisecond, el: 500 * time.Millisecond, refused: "at least 10ms"},
		{name: "heartbeat not whole ms", hb: 50*time.Millisecond + 500*time.Microsecond, el: time.Second, refused: "whole milliseconds"},
		{name: "election under five heartbeats", hb: 200 * time.Millisecond, el: 900 * time.Millisecond, refused: "five heartbeats"},
		{name: "election over 50s", hb: time.Second, el: 51 * time.Second, lease: 5 * time.Minute, refused: "at most 50s"},
		{name: "election over half the lease", el: 2 * time.Second, lease: 3 * time.Second, refused: "half of --node-lease-ttl"},
	} {
		t.Run(c.name, func(t *testing.T) {
			cfg := Config{NodeName: "n1", ClusterName: "alpha", TokenFile: token, StateDir: dir,
				EtcdHeartbeat: c.hb, EtcdElection: c.el, LeaseTTL: c.lease}
			if c.external {
				cfg.EtcdEndpoints = []string{"http://127.0.0.1:2379"}
			} else {
				cfg.InitialCluster, cfg.EtcdClientURLs = initial, []string{"http://127.0.0.1:2379"}
			}
			_, err := cfg.validate()
			switch {
			case c.refused == "" && err != nil:
				t.Fatalf("refused: %v", err)
			case c.refused != "" && (!errors.Is(err, ErrConfig) || !strings.Contains(err.Error(), c.refused)):
				t.Fatalf("err = %v, want a refusal mentioning %q", err, c.refused)
			}
		})
	}
}
