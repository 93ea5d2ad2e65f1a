package cluster

import (
	"context"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"time"

	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"
)

// startEmbedded starts this node's etcd member and waits until it serves,
// which needs a quorum of the members of --initial-cluster. It returns the
// member and the client URLs this node's own client uses.
func startEmbedded(ctx context.Context, c *Config) (*embed.Etcd, zap.AtomicLevel, []string, error) {
	level := zap.NewAtomicLevelAt(zap.ErrorLevel)
	e, eps, err := startMember(ctx, c, level)
	return e, level, eps, err
}

// startMember starts the member with its log (etcd's own, JSON on stderr)
// at level, which Close raises to silence the member's shutdown.
func startMember(ctx context.Context, c *Config, level zap.AtomicLevel) (*embed.Etcd, []string, error) {
	peer, err := c.peerURL()
	if err != nil {
		return nil, nil, err
	}
	var clientURLs []url.URL
	for _, raw := range c.EtcdClientURLs {
		u, err := url.Parse(raw)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return nil, nil, fmt.Errorf("--etcd-listen-client %q: want http://HOST:PORT or https://HOST:PORT: %w", raw, ErrConfig)
		}
		clientURLs = append(clientURLs, *u)
	}
	dir := c.EtcdDataDir
	if dir == "" {
		dir = filepath.Join(c.StateDir, "etcd")
	}
	if err := os.MkdirAll(filepath.Dir(dir), 0o700); err != nil {
		return nil, nil, fmt.Errorf("etcd data directory: %w", err)
	}
	cfg := embed.NewConfig()
	cfg.Name = c.NodeName
	cfg.Dir = dir
	cfg.ListenPeerUrls, cfg.AdvertisePeerUrls = []url.URL{*peer}, []url.URL{*peer}
	cfg.ListenClientUrls, cfg.AdvertiseClientUrls = clientURLs, clientURLs
	cfg.InitialCluster = c.InitialCluster
	// etcd's cluster token makes the members of two quiver clusters with
	// the same peers refuse each other.
	cfg.InitialClusterToken = "quiver-" + c.ClusterName
	cfg.ClusterState = embed.ClusterStateFlagNew // ignored once the data directory holds a member
	c.memberTLS(cfg)
	zc := zap.NewProductionConfig()
	zc.Level, zc.OutputPaths, zc.ErrorOutputPaths, zc.Sampling = level, []string{"stderr"}, []string{"stderr"}, nil
	lg, err := zc.Build()
	if err != nil {
		return nil, nil, fmt.Errorf("etcd logger: %w", err)
	}
	cfg.ZapLoggerBuilder = embed.NewZapLoggerBuilder(lg)
	e, err := embed.StartEtcd(cfg)
	if err != nil {
		return nil, nil, fmt.Errorf("start embedded etcd member %q (data %s): %w", c.NodeName, dir, err)
	}
	c.Logger.Info("embedded etcd member started; waiting for a quorum of --initial-cluster",
		"member", c.NodeName, "peer", peer.String(), "data", dir)
	timeout := time.NewTimer(c.StartTimeout)
	defer timeout.Stop()
	tick := time.NewTicker(10 * time.Second)
	defer tick.Stop()
	for {
		select {
		case <-e.Server.ReadyNotify():
			eps := make([]string, len(clientURLs))
			for i, u := range clientURLs {
				eps[i] = u.String()
			}
			return e, eps, nil
		case err := <-e.Err():
			closeUnready(e)
			return nil, nil, fmt.Errorf("embedded etcd member %q: %w", c.NodeName, err)
		case <-tick.C:
			c.Logger.Info("still waiting for the etcd peers of --initial-cluster", "initialCluster", c.InitialCluster)
		case <-timeout.C:
			closeUnready(e)
			return nil, nil, fmt.Errorf("embedded etcd member %q not ready within %s (are the peers of --initial-cluster %s up and reachable?): %w",
				c.NodeName, c.StartTimeout, c.InitialCluster, ErrUnreachable)
		case <-ctx.Done():
			closeUnready(e)
			return nil, nil, fmt.Errorf("embedded etcd member %q stopped while waiting for the peers of --initial-cluster: %w",
				c.NodeName, context.Cause(ctx))
		}
	}
}

// closeUnready closes a member that may not be ready. etcd's Close waits
// for the client listeners' servers, which start only once the member is
// ready or its server stops, and stops the server only after that wait:
// a member still waiting for a quorum would block Close for ever. Stopping
// the server first (HardStop: no leadership to hand over before a quorum)
// ends that wait; Close then stops the rest.
func closeUnready(e *embed.Etcd) {
	e.Server.HardStop()
	e.Close()
}
