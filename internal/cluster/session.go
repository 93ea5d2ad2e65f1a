package cluster

import (
	"cmp"
	"context"
	"crypto/hmac"
	"encoding/json"
	"fmt"
	"slices"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
)

func hmacEqual(a, b string) bool { return hmac.Equal([]byte(a), []byte(b)) }

// startSession grants this node's lease and creates alive/<node> under it.
// An alive key left by this node's previous process (same node id, its
// lease not yet expired) is waited out for one lease TTL; one that is still
// there then belongs to a live twin and is refused.
func (n *Node) startSession(ctx context.Context) error {
	ttl := max(int(n.cfg.LeaseTTL/time.Second), 1)
	granted := time.Now()
	sess, err := concurrency.NewSession(n.cli, concurrency.WithTTL(ttl))
	if err != nil {
		return fmt.Errorf("etcd lease for node %q: %w", n.cfg.NodeName, err)
	}
	k := n.key("alive", n.cfg.NodeName)
	deadline := time.Now().Add(n.cfg.LeaseTTL + 2*time.Second)
	for {
		usage := n.aliveRecord()
		// An unknown outcome (ErrUnknownOutcome) fails the registration
		// like any error and leaves nothing behind: the key would live
		// under this session's lease, which Close revokes (or which
		// expires), and the next registration waits a key of this node id
		// out as it does a previous process's.
		resp, err := n.commit(ctx, txnSpec{If: []clientv3.Cmp{clientv3.Compare(clientv3.CreateRevision(k), "=", 0)},
			Then: []clientv3.Op{clientv3.OpPut(k, mustJSON(usage), clientv3.WithLease(sess.Lease()))},
			Else: []clientv3.Op{clientv3.OpGet(k)}})
		if err != nil {
			_ = sess.Close()
			return fmt.Errorf("register node %q as up: %w", n.cfg.NodeName, err)
		}
		if resp.Succeeded {
			break
		}
		var have aliveRecord
		_ = json.Unmarshal(resp.Responses[0].GetResponseRange().Kvs[0].Value, &have)
		if have.NodeID != n.id.NodeID {
			_ = sess.Close()
			return fmt.Errorf("node name %q is up as node id %s at %s: pick another --node-name: %w",
				n.cfg.NodeName, have.NodeID, have.API, ErrNameTaken)
		}
		if time.Now().After(deadline) {
			_ = sess.Close()
			return fmt.Errorf("node %q (id %s) is up already at %s, started %s: is another process serving a copy of this pool? %w",
				n.cfg.NodeName, have.NodeID, have.API, have.StartedAt.Format(time.RFC3339), ErrNameTaken)
		}
		n.log.Info("this node's previous process is still registered; waiting for its lease to expire",
			"api", have.API, "ttl", n.cfg.LeaseTTL)
		select {
		case <-time.After(500 * time.Millisecond):
		case <-ctx.Done():
			_ = sess.Close()
			return ctx.Err()
		}
	}
	n.renewedAt(sess.Lease(), granted)
	n.sessMu.Lock()
	n.sess = sess
	n.sessMu.Unlock()
	n.up.Store(true)
	return nil
}

func (n *Node) session() *concurrency.Session {
	n.sessMu.Lock()
	defer n.sessMu.Unlock()
	return n.sess
}

func (n *Node) aliveRecord() aliveRecord {
	total, free, err := n.store.Usage()
	if err != nil {
		n.log.Warn("pool usage", "err", err)
	}
	return aliveRecord{NodeID: n.id.NodeID, API: n.cfg.APIAddr, NBD: n.cfg.NBDAddr, FailureDomain: n.cfg.FailureDomain,
		TotalBytes: total, FreeBytes: free, StartedAt: n.started, Instance: n.instance}
}

// keepAlive watches the session: when its lease is lost (partitioned from
// etcd, or etcd without quorum for longer than the TTL) the node is down
// and registers again, as soon as etcd answers.
func (n *Node) keepAlive(ctx context.Context) {
	for {
		s := n.session()
		select {
		case <-ctx.Done():
			return
		case <-s.Done():
		}
		n.up.Store(false)
		n.log.Error("lost the etcd session: this node is down for the cluster until it registers again")
		for backoff := time.Second; ; backoff = min(2*backoff, 10*time.Second) {
			select {
			case <-ctx.Done():
				return
			case <-time.After(backoff):
			}
			if err := n.startSession(ctx); err != nil {
				n.log.Warn("register again", "err", err)
				continue
			}
			n.log.Info("registered again: this node is up")
			break
		}
	}
}

// report updates the alive record's free space every ReportInterval.
func (n *Node) report(ctx context.Context) {
	t := time.NewTicker(n.cfg.ReportInterval)
	defer t.Stop()
	k := n.key("alive", n.cfg.NodeName)
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		s := n.session()
		if !n.up.Load() || s == nil {
			continue
		}
		rctx, cancel := context.WithTimeout(ctx, n.cfg.ReportInterval)
		// A report: after an unknown outcome (ErrUnknownOutcome, logged)
		// the record shows the old free space or this one, and the next
		// report writes over it.
		_, err := n.commit(rctx, txnSpec{If: []clientv3.Cmp{clientv3.Compare(clientv3.LeaseValue(k), "=", s.Lease())},
			Then: []clientv3.Op{clientv3.OpPut(k, mustJSON(n.aliveRecord()), clientv3.WithLease(s.Lease()))}})
		cancel()
		if err != nil && ctx.Err() == nil {
			n.log.Warn("report free space to etcd", "err", err)
		}
	}
}

// NodeInfo is one member of the cluster, up or down.
type NodeInfo struct {
	Name          string
	NodeID        string
	API, NBD      string // empty while down
	FailureDomain string
	Up            bool
	TotalBytes    int64 // as last reported; 0 while down
	FreeBytes     int64
	Volumes       int // copies placed on it
	// Drain is DrainRunning or DrainDone while the node is drained
	// (placement skips it), else "".
	Drain string
}

// Nodes lists every member, sorted by name.
func (n *Node) Nodes(ctx context.Context) ([]NodeInfo, error) {
	resp, err := n.cli.Txn(ctx).Then(clientv3.OpGet(n.key("members")+"/", clientv3.WithPrefix()),
		clientv3.OpGet(n.key("alive")+"/", clientv3.WithPrefix()),
		clientv3.OpGet(n.key("volumes")+"/", clientv3.WithPrefix()),
		clientv3.OpGet(n.key("drained")+"/", clientv3.WithPrefix())).Commit()
	if err != nil {
		return nil, fmt.Errorf("list nodes: %w", err)
	}
	byName := map[string]*NodeInfo{}
	for _, kv := range resp.Responses[0].GetResponseRange().Kvs {
		var m memberRecord
		if json.Unmarshal(kv.Value, &m) != nil {
			continue
		}
		name := lastSegment(string(kv.Key))
		byName[name] = &NodeInfo{Name: name, NodeID: m.NodeID, FailureDomain: m.FailureDomain}
	}
	for _, kv := range resp.Responses[1].GetResponseRange().Kvs {
		var a aliveRecord
		ni := byName[lastSegment(string(kv.Key))]
		if ni == nil || json.Unmarshal(kv.Value, &a) != nil || a.NodeID != ni.NodeID {
			continue
		}
		ni.Up, ni.API, ni.NBD, ni.TotalBytes, ni.FreeBytes = true, a.API, a.NBD, a.TotalBytes, a.FreeBytes
		ni.FailureDomain = a.FailureDomain
	}
	for _, kv := range resp.Responses[2].GetResponseRange().Kvs {
		var v volumeRecord
		if json.Unmarshal(kv.Value, &v) != nil {
			continue
		}
		for _, c := range v.Copies {
			if ni := byName[c]; ni != nil {
				ni.Volumes++
			}
		}
	}
	for _, kv := range resp.Responses[3].GetResponseRange().Kvs {
		var d drainRecord
		if ni := byName[lastSegment(string(kv.Key))]; ni != nil && json.Unmarshal(kv.Value, &d) == nil {
			ni.Drain = d.State
		}
	}
	out := make([]NodeInfo, 0, len(byName))
	for _, ni := range byName {
		out = append(out, *ni)
	}
	slices.SortFunc(out, func(a, b NodeInfo) int { return cmp.Compare(a.Name, b.Name) })
	return out, nil
}
