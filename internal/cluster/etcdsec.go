package cluster

import (
	"crypto/tls"
	"fmt"
	"net"
	"net/url"
	"os"
	"slices"
	"strings"

	"go.etcd.io/etcd/server/v3/embed"

	"github.com/quiverstorage/quiver/internal/tlscert"
)

// How a node talks to etcd (docs/cluster.md, "Securing etcd"): with
// --etcd-cert, --etcd-key and --etcd-ca every etcd URL is https, the node's
// client presents its certificate and trusts the CA, and the embedded
// member serves clients and peers over TLS and requires from both a
// certificate of that CA. Without them etcd is plaintext, which a node
// accepts on loopback only, unless --etcd-insecure.

// etcdTLS says whether the flags ask for TLS to etcd.
func (c *Config) etcdTLS() bool {
	return c.EtcdCertFile != "" || c.EtcdKeyFile != "" || c.EtcdCAFile != ""
}

// secureEtcd checks the etcd security flags against the etcd URLs and,
// with TLS, makes every http:// URL of etcd an https:// one. It refuses
// plaintext beyond loopback unless EtcdInsecure.
func (c *Config) secureEtcd() error {
	if (c.EtcdCertFile == "") != (c.EtcdKeyFile == "") {
		return fmt.Errorf("--etcd-cert and --etcd-key go together: %w", ErrConfig)
	}
	if (c.EtcdUsername == "") != (c.EtcdPasswordFile == "") {
		return fmt.Errorf("--etcd-username and --etcd-password-file go together: %w", ErrConfig)
	}
	if c.InitialCluster != "" {
		if c.EtcdUsername != "" {
			return fmt.Errorf("--etcd-username is for an external etcd with authentication (--etcd-endpoints); "+
				"the embedded member authenticates by certificate (--etcd-cert): %w", ErrConfig)
		}
		if c.etcdTLS() && (c.EtcdCertFile == "" || c.EtcdCAFile == "") {
			return fmt.Errorf("the embedded etcd member needs --etcd-cert, --etcd-key and --etcd-ca together "+
				"(its certificate, and the CA its clients' and peers' certificates must come from): %w", ErrConfig)
		}
	}
	var plain []string // plaintext URLs beyond loopback
	fix := func(flag, raw string) (string, error) {
		if !strings.Contains(raw, "://") {
			raw = "http://" + raw // clientv3 takes HOST:PORT as plaintext
		}
		u, err := url.Parse(raw)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return "", fmt.Errorf("%s %q: want http://HOST:PORT or https://HOST:PORT: %w", flag, raw, ErrConfig)
		}
		switch {
		case c.etcdTLS():
			u.Scheme = "https"
		case u.Scheme == "https" && flag != "--etcd-endpoints":
			return "", fmt.Errorf("%s %q: the embedded member serves https only with --etcd-cert, --etcd-key and --etcd-ca: %w",
				flag, raw, ErrConfig)
		case u.Scheme == "http" && !isLoopback(u.Hostname()):
			plain = append(plain, flag+" "+u.String())
		}
		return u.String(), nil
	}
	// The URLs are rewritten in copies: the caller's Config keeps its own.
	c.EtcdClientURLs, c.EtcdEndpoints = slices.Clone(c.EtcdClientURLs), slices.Clone(c.EtcdEndpoints)
	var err error
	if c.InitialCluster != "" {
		var items []string
		for item := range strings.SplitSeq(c.InitialCluster, ",") {
			name, raw, ok := strings.Cut(strings.TrimSpace(item), "=")
			if !ok || name == "" {
				return fmt.Errorf("--initial-cluster item %q: want NAME=URL: %w", item, ErrConfig)
			}
			if raw, err = fix("--initial-cluster", raw); err != nil {
				return err
			}
			items = append(items, name+"="+raw)
		}
		c.InitialCluster = strings.Join(items, ",")
		for i := range c.EtcdClientURLs {
			if c.EtcdClientURLs[i], err = fix("--etcd-listen-client", c.EtcdClientURLs[i]); err != nil {
				return err
			}
		}
	}
	for i := range c.EtcdEndpoints {
		if c.EtcdEndpoints[i], err = fix("--etcd-endpoints", c.EtcdEndpoints[i]); err != nil {
			return err
		}
	}
	if len(plain) > 0 && !c.EtcdInsecure {
		return fmt.Errorf("etcd in plaintext beyond loopback (%s): anyone who reaches it could read and change the "+
			"cluster's state; give --etcd-cert, --etcd-key and --etcd-ca (quiver cluster certs makes them), "+
			"or --etcd-insecure to run without TLS anyway: %w: %w", strings.Join(plain, ", "), ErrPlaintextEtcd, ErrConfig)
	}
	return nil
}

// isLoopback says whether host is a loopback address or localhost.
func isLoopback(host string) bool {
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// clientTLS is the node's etcd client's TLS: nil for plaintext endpoints;
// for https ones the CA of --etcd-ca (the system's roots without it) and,
// with --etcd-cert, that client certificate.
func (c *Config) clientTLS(endpoints []string) (*tls.Config, error) {
	secure := c.etcdTLS()
	for _, ep := range endpoints {
		secure = secure || strings.HasPrefix(ep, "https://")
	}
	if !secure {
		return nil, nil
	}
	cfg, err := tlscert.ClientConfig(c.EtcdCAFile, c.EtcdCertFile, c.EtcdKeyFile)
	if err != nil {
		return nil, fmt.Errorf("etcd client TLS (--etcd-ca, --etcd-cert, --etcd-key): %w", err)
	}
	return cfg, nil
}

// etcdPassword reads --etcd-password-file ("" without --etcd-username).
func (c *Config) etcdPassword() (string, error) {
	if c.EtcdPasswordFile == "" {
		return "", nil
	}
	b, err := os.ReadFile(c.EtcdPasswordFile)
	if err != nil {
		return "", fmt.Errorf("read --etcd-password-file: %w", err)
	}
	pw := strings.TrimRight(string(b), "\r\n")
	if pw == "" {
		return "", fmt.Errorf("--etcd-password-file %s is empty: %w", c.EtcdPasswordFile, ErrConfig)
	}
	return pw, nil
}

// memberTLS sets the embedded member's client and peer TLS: its
// certificate on both listeners, and a certificate of --etcd-ca required of
// every client and peer. Without TLS flags the member is plaintext.
func (c *Config) memberTLS(cfg *embed.Config) {
	if !c.etcdTLS() {
		return
	}
	ti := &cfg.ClientTLSInfo
	ti.CertFile, ti.KeyFile, ti.TrustedCAFile, ti.ClientCertAuth = c.EtcdCertFile, c.EtcdKeyFile, c.EtcdCAFile, true
	cfg.PeerTLSInfo = cfg.ClientTLSInfo
}
