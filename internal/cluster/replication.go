package cluster

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// CopyDegraded is the state of a copy that left the in-sync set: it lacks
// writes acknowledged since, and waits for a resync.
const CopyDegraded = "degraded"

// Target is an in-sync copy a primary writes to: the copy node's NBD
// address (empty while the node is down) and the token of the attachment it
// made for the primary.
type Target struct {
	Node, NBD, Token string
}

// Replication says, for a volume this node is primary of, the term and the
// other in-sync copies; false when this node is not its primary (or the
// volume is not placed, or is being deleted).
func (n *Node) Replication(ctx context.Context, volume string) (term uint64, targets []Target, primary bool, err error) {
	resp, err := n.cli.Txn(ctx).Then(clientv3.OpGet(n.key("volumes", volume)),
		clientv3.OpGet(n.key("copies", volume)+"/", clientv3.WithPrefix()),
		clientv3.OpGet(n.key("alive")+"/", clientv3.WithPrefix())).Commit()
	if err != nil {
		return 0, nil, false, fmt.Errorf("replication of %q: %w", volume, err)
	}
	kvs := resp.Responses[0].GetResponseRange().Kvs
	if len(kvs) == 0 {
		return 0, nil, false, nil
	}
	var rec volumeRecord
	if err := json.Unmarshal(kvs[0].Value, &rec); err != nil {
		return 0, nil, false, fmt.Errorf("etcd key %s: %w", kvs[0].Key, err)
	}
	if rec.Primary != n.cfg.NodeName || rec.State != volumeActive {
		return 0, nil, false, nil
	}
	copies := map[string]copyRecord{}
	for _, kv := range resp.Responses[1].GetResponseRange().Kvs {
		var c copyRecord
		if json.Unmarshal(kv.Value, &c) == nil {
			copies[lastSegment(string(kv.Key))] = c
		}
	}
	nbd := map[string]string{}
	for _, kv := range resp.Responses[2].GetResponseRange().Kvs {
		var a aliveRecord
		if json.Unmarshal(kv.Value, &a) == nil {
			nbd[lastSegment(string(kv.Key))] = a.NBD
		}
	}
	for _, node := range rec.InSync {
		if node != n.cfg.NodeName {
			targets = append(targets, Target{Node: node, NBD: nbd[node], Token: copies[node].Token})
		}
	}
	return rec.Term, targets, true, nil
}

// MarkOutOfSync takes copy node out of the volume's in-sync set, as the
// primary at term, and records the copy degraded. It succeeds only while
// this node is the volume's primary at that term and holds its lease, so a
// primary cut off from etcd cannot drop a copy and go on alone: its caller
// must not acknowledge the request that found the copy failed.
func (n *Node) MarkOutOfSync(volume, node string, term uint64, cause error) error {
	ctx, cancel := context.WithTimeout(context.Background(), n.cfg.LeaseTTL)
	defer cancel()
	s := n.session()
	if s == nil || !n.up.Load() {
		return fmt.Errorf("mark copy %s of %q out of sync: %w", node, volume, ErrNoSession)
	}
	vk, ck, ak := n.key("volumes", volume), n.key("copies", volume, node), n.key("alive", n.cfg.NodeName)
	for {
		resp, err := n.cli.Txn(ctx).Then(clientv3.OpGet(vk), clientv3.OpGet(ck)).Commit()
		if err != nil {
			return fmt.Errorf("mark copy %s of %q out of sync: %w", node, volume, err)
		}
		kvs := resp.Responses[0].GetResponseRange().Kvs
		if len(kvs) == 0 {
			return fmt.Errorf("mark copy %s of %q out of sync: %w", node, volume, ErrVolumeNotFound)
		}
		var rec volumeRecord
		if err := json.Unmarshal(kvs[0].Value, &rec); err != nil {
			return err
		}
		if rec.Primary != n.cfg.NodeName || rec.Term != term {
			return fmt.Errorf("mark copy %s of %q out of sync: this node is no longer primary at term %d (primary %s, term %d): %w",
				node, volume, term, rec.Primary, rec.Term, ErrNoSession)
		}
		if !slices.Contains(rec.InSync, node) {
			return nil // a concurrent request recorded it
		}
		rec.InSync = slices.DeleteFunc(slices.Clone(rec.InSync), func(s string) bool { return s == node })
		var c copyRecord
		if ckvs := resp.Responses[1].GetResponseRange().Kvs; len(ckvs) > 0 {
			_ = json.Unmarshal(ckvs[0].Value, &c)
		}
		c.State, c.Reason, c.UpdatedAt = CopyDegraded, cause.Error(), time.Now().UTC()
		put, err := n.cli.Txn(ctx).If(clientv3.Compare(clientv3.ModRevision(vk), "=", kvs[0].ModRevision),
			clientv3.Compare(clientv3.LeaseValue(ak), "=", s.Lease())).
			Then(clientv3.OpPut(vk, mustJSON(rec)), clientv3.OpPut(ck, mustJSON(c))).Commit()
		if err != nil {
			return fmt.Errorf("mark copy %s of %q out of sync: %w", node, volume, err)
		}
		if put.Succeeded {
			n.log.Warn("copy out of sync: the volume is degraded", "volume", volume, "copy", node, "term", term,
				"inSync", rec.InSync, "err", cause)
			return nil
		}
		// The record changed meanwhile, or the lease is gone: look again.
		if !n.up.Load() {
			return fmt.Errorf("mark copy %s of %q out of sync: %w", node, volume, ErrNoSession)
		}
	}
}
