package cluster

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// The drained/<node> marks (docs/cluster.md, "Drain"): a node's membership
// state, set by its drain and cleared by an undrain on any node; placement
// skips a marked node (drain.go).

// SetDrain records node as draining or drained (DrainRunning, DrainDone):
// placement skips it from then on.
func (n *Node) SetDrain(ctx context.Context, node, state string) error {
	k := n.key("drained", node)
	rec := drainRecord{State: state, Since: time.Now().UTC()}
	if resp, err := n.cli.Get(ctx, k); err == nil && len(resp.Kvs) > 0 {
		var have drainRecord
		if json.Unmarshal(resp.Kvs[0].Value, &have) == nil && !have.Since.IsZero() {
			rec.Since = have.Since
		}
	}
	mk := n.key("members", node)
	// An unknown outcome (ErrUnknownOutcome) fails the drain with the mark
	// set or not; setting it again is no change.
	resp, err := n.commit(ctx, txnSpec{If: []clientv3.Cmp{clientv3.Compare(clientv3.CreateRevision(mk), ">", 0)},
		Then: []clientv3.Op{clientv3.OpPut(k, mustJSON(rec))}})
	if err != nil {
		return fmt.Errorf("mark node %s %s: %w", node, state, err)
	}
	if !resp.Succeeded {
		return fmt.Errorf("mark node %s %s: no such node in the cluster: %w", node, state, ErrNodeNotFound)
	}
	return nil
}

// Drained reports node's drain state: "" when it is not drained.
func (n *Node) Drained(ctx context.Context, node string) (string, error) {
	resp, err := n.cli.Get(ctx, n.key("drained", node))
	if err != nil {
		return "", fmt.Errorf("drain state of %s: %w", node, err)
	}
	if len(resp.Kvs) == 0 {
		return "", nil
	}
	var rec drainRecord
	if err := json.Unmarshal(resp.Kvs[0].Value, &rec); err != nil {
		return "", fmt.Errorf("etcd key %s: %w", resp.Kvs[0].Key, err)
	}
	return rec.State, nil
}

// Undrain clears node's drain mark: placement may use it again. The
// copies moved away stay where they are. It reports whether it was marked.
func (n *Node) Undrain(ctx context.Context, node string) (bool, error) {
	resp, err := n.cli.Delete(ctx, n.key("drained", node))
	if err != nil {
		return false, fmt.Errorf("undrain %s: %w", node, err)
	}
	return resp.Deleted > 0, nil
}
