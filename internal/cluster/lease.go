package cluster

import (
	"context"
	"log/slog"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// Lease fencing (docs/cluster.md, "Lease fencing and failover").
//
// etcd expires a lease no sooner than its TTL after it received the last
// keep-alive, which is after the node sent it. So a node that records, on its
// own monotonic clock, when it sent each keep-alive that etcd answered knows
// a time before which its lease cannot have expired: the send time plus the
// TTL. It acknowledges nothing as a primary after that time less a margin
// (leaseMargin of the TTL, for the rate drift of the two clocks and the
// reply still to be sent). A leader change in etcd only extends leases.

// leaseMargin is the part of the TTL kept as a margin.
const leaseMargin = 5 // TTL/5

// leaseClock is what a node knows of its current lease.
type leaseClock struct {
	mu    sync.Mutex
	id    clientv3.LeaseID
	valid time.Time // with a monotonic reading: before it, the lease is held
}

func (n *Node) leaseTTL() time.Duration {
	return time.Duration(max(int(n.cfg.LeaseTTL/time.Second), 1)) * time.Second
}

// renewedAt records that etcd answered a keep-alive (or the grant) of lease
// id sent at sent.
func (n *Node) renewedAt(id clientv3.LeaseID, sent time.Time) {
	ttl := n.leaseTTL()
	until := sent.Add(ttl - ttl/leaseMargin)
	n.lease.mu.Lock()
	defer n.lease.mu.Unlock()
	if n.lease.id != id {
		n.lease.id, n.lease.valid = id, until
		return
	}
	if until.After(n.lease.valid) {
		n.lease.valid = until
	}
}

// LeaseHeld says whether lease id is this node's current lease and cannot
// have expired in etcd yet, with the margin: what a primary checks before
// it acknowledges a request.
func (n *Node) LeaseHeld(id clientv3.LeaseID) bool {
	n.lease.mu.Lock()
	defer n.lease.mu.Unlock()
	return id != 0 && n.lease.id == id && time.Now().Before(n.lease.valid)
}

// LeaseValidFor is how long the current lease is surely held still (0 when
// it may have expired).
func (n *Node) LeaseValidFor() time.Duration {
	n.lease.mu.Lock()
	defer n.lease.mu.Unlock()
	return max(time.Until(n.lease.valid), 0)
}

// renewLease sends a keep-alive of the current session's lease every
// TTL/5 and records the send time of each that etcd answered. It runs beside
// the session's own keep-alives, whose timing the client does not report.
func (n *Node) renewLease(ctx context.Context) {
	ttl := n.leaseTTL()
	t := time.NewTicker(ttl / 5)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		s := n.session()
		if s == nil || !n.up.Load() {
			continue
		}
		id := s.Lease()
		sent := time.Now()
		kctx, cancel := context.WithTimeout(ctx, ttl/5)
		resp, err := n.cli.KeepAliveOnce(kctx, id)
		cancel()
		if err == nil && resp.TTL > 0 {
			n.renewedAt(id, sent)
			continue
		}
		n.log.Debug("lease keep-alive not answered", "lease", id, "err", err, "validFor", n.LeaseValidFor())
	}
}

// Holds says whether this node may acknowledge a request as the primary of
// p: its lease is still surely held (LeaseHeld).
func (n *Node) Holds(p Primacy) bool { return n.LeaseHeld(p.Lease) }

// LeaseTTL is the node lease's TTL, as granted.
func (n *Node) LeaseTTL() time.Duration { return n.leaseTTL() }

// Logger is the node's logger.
func (n *Node) Logger() *slog.Logger { return n.log }
