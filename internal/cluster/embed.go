package cluster

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"syscall"
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
	cfg.TickMs, cfg.ElectionMs = uint(c.EtcdHeartbeat.Milliseconds()), uint(c.EtcdElection.Milliseconds())
	// etcd's cluster token makes the members of two quiver clusters with
	// the same peers refuse each other.
	cfg.InitialClusterToken = "quiver-" + c.ClusterName
	// Ignored once the data directory holds a member.
	cfg.ClusterState = embed.ClusterStateFlagNew
	if c.InitialClusterState == ClusterStateExisting {
		cfg.ClusterState = embed.ClusterStateFlagExisting
	}
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
		if cfg.ClusterState == embed.ClusterStateFlagExisting {
			return nil, nil, fmt.Errorf("start embedded etcd member %q (data %s) in the running cluster of --initial-cluster: %w; "+
				"was it added first (quiver node add %s --peer-url %s), and is --initial-cluster what that printed?",
				c.NodeName, dir, err, c.NodeName, peer)
		}
		if errors.Is(err, syscall.EADDRINUSE) {
			return nil, nil, fmt.Errorf("start embedded etcd member %q (data %s): %w (%s)", c.NodeName, dir, err, addrInUseHint(err, peer, clientURLs))
		}
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
			if err := promoteSelf(ctx, c, e, timeout.C); err != nil {
				closeUnready(e)
				return nil, nil, err
			}
			eps := make([]string, len(clientURLs))
			for i, u := range clientURLs {
				eps[i] = u.String()
			}
			return e, eps, nil
		case <-e.Server.StopNotify():
			// etcd stops a member by itself before it is ready only when
			// its peers answer that it was removed from the cluster.
			closeUnready(e)
			return nil, nil, errRemovedMember(c, dir)
		case err := <-e.Err():
			select {
			case <-e.Server.StoppingNotify():
				// Its servers fail because the member stops: removed.
				closeUnready(e)
				return nil, nil, errRemovedMember(c, dir)
			default:
			}
			closeUnready(e)
			return nil, nil, fmt.Errorf("embedded etcd member %q: %w", c.NodeName, err)
		case <-tick.C:
			c.Logger.Info("still waiting for the etcd peers of --initial-cluster", "initialCluster", c.InitialCluster)
		case <-timeout.C:
			state := memberState(e)
			closeUnready(e)
			return nil, nil, fmt.Errorf("embedded etcd member %q not ready within %s, %s (are the peers of --initial-cluster %s up and reachable?): %w",
				c.NodeName, c.StartTimeout, state, c.InitialCluster, ErrUnreachable)
		case <-ctx.Done():
			closeUnready(e)
			return nil, nil, fmt.Errorf("embedded etcd member %q stopped while waiting for the peers of --initial-cluster: %w",
				c.NodeName, context.Cause(ctx))
		}
	}
}

// addrInUseHint says which flag gives the address that etcd could not
// listen on (err is EADDRINUSE): this node's peer URL in --initial-cluster,
// or a URL of --etcd-listen-client; both when the address matches neither
// as given (a name that resolved to it).
func addrInUseHint(err error, peer *url.URL, clients []url.URL) string {
	var op *net.OpError
	addr := ""
	if errors.As(err, &op) && op.Addr != nil {
		addr = op.Addr.String()
	}
	const client = "is another etcd, or another node on this machine, using it? give this node other client URLs with --etcd-listen-client"
	const peerHint = "is another etcd, or another node on this machine, using it? give this node another peer URL in --initial-cluster, the same on every node"
	if addr == peer.Host {
		return peerHint
	}
	for _, u := range clients {
		if addr == u.Host {
			return client
		}
	}
	return "is another etcd, or another node on this machine, using it? give this node other client URLs with --etcd-listen-client, " +
		"or another peer URL in --initial-cluster (the same on every node)"
}

// errRemovedMember: the member stopped by itself before it was ready,
// which etcd does only when its peers answer that it was removed.
func errRemovedMember(c *Config, dir string) error {
	return fmt.Errorf("embedded etcd member %q (data %s) stopped: its peers refuse it, as they refuse a member "+
		"removed from the cluster (quiver node remove); a removed node cannot join again: start it on a new pool "+
		"and etcd data directory, and add it with quiver node add %s: %w", c.NodeName, dir, c.NodeName, ErrNodeRemoved)
}

// errNotYetApplied: the promotion is committed, and this member has not
// applied it yet.
var errNotYetApplied = errors.New("promoted; not applied here yet")

// promoteSelf makes this node's member, when it is a learner (a node that
// `quiver node add` added), a voting member once it has caught up with the
// leader: etcd refuses the promotion until then (ErrLearnerNotReady), so it
// is tried again every half second until timeout or ctx ends. The node's
// client talks to its own member, which serves clients only once promoted.
func promoteSelf(ctx context.Context, c *Config, e *embed.Etcd, timeout <-chan time.Time) error {
	id := uint64(e.Server.MemberID())
	var last error
	logged := time.Now()
	for e.Server.IsLearner() {
		if last == nil || !errors.Is(last, errNotYetApplied) {
			if _, err := e.Server.PromoteMember(ctx, id); err != nil {
				last = err
			} else {
				// Promoted: this member serves clients once it has
				// applied its promotion too.
				c.Logger.Info("embedded etcd member promoted from learner to voting member", "member", c.NodeName)
				last = errNotYetApplied
			}
		}
		if time.Since(logged) > 10*time.Second {
			c.Logger.Info("waiting for the embedded etcd learner to catch up before its promotion", "member", c.NodeName, "err", last)
			logged = time.Now()
		}
		select {
		case <-time.After(500 * time.Millisecond):
		case <-timeout:
			return fmt.Errorf("embedded etcd member %q: still a learner after --etcd-start-timeout %s (last refusal: %v): "+
				"is the leader reachable? %w", c.NodeName, c.StartTimeout, last, ErrUnreachable)
		case <-ctx.Done():
			return fmt.Errorf("embedded etcd member %q stopped while waiting for its promotion: %w", c.NodeName, context.Cause(ctx))
		}
	}
	return nil
}

// memberState says how far a member that is not ready got: whether it
// knows a leader, and its raft term and indexes, which tell a member that
// hears no peer from one that hears the leader and cannot commit.
func memberState(e *embed.Etcd) string {
	s := e.Server
	lead := "no leader known"
	if id := s.Leader(); id != 0 {
		lead = "leader " + id.String()
		if m := s.Cluster().Member(id); m != nil && m.Name != "" {
			lead = "leader " + m.Name
		}
	}
	return fmt.Sprintf("%s at term %d, committed index %d, applied %d", lead, s.Term(), s.CommittedIndex(), s.AppliedIndex())
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
