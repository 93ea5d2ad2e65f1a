package cluster

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// CopyRebuilding is the state of a new copy placed to replace one whose
// node was gone too long: empty, out of the in-sync set, copied whole by
// the primary (a rebuild job).
const CopyRebuilding = "rebuilding"

// ReplaceCopy moves the copy of volume on node gone to another eligible
// node (up, not drained, without a copy of the volume, with free bytes for its
// capacity): prefer when it is eligible (a node replace names the new node),
// else a failure domain the other copies do not use first, then the
// most free bytes, then the name. It runs as the primary at term: one
// transaction, holding while gone is down (no alive/ key) and this node
// holds its lease, that rewrites the placement (gone out of the copies and
// the in-sync set: a copy in sync on a node that is gone, which no write
// has found failed yet, is replaced as well), drops gone's copy key and
// records the new copy rebuilding. The new node makes its copy (reconcile)
// and the primary rebuilds it. It returns the new node.
func (cs Copies) ReplaceCopy(ctx context.Context, volume, gone, prefer string, term uint64) (string, error) {
	s := cs.n.session()
	if s == nil || !cs.n.up.Load() {
		return "", fmt.Errorf("replace copy %s of %q: %w", gone, volume, ErrNoSession)
	}
	nodes, err := cs.n.Nodes(ctx)
	if err != nil {
		return "", err
	}
	vk, ak := cs.n.key("volumes", volume), cs.n.key("alive", cs.n.cfg.NodeName)
	resp, err := cs.n.cli.Get(ctx, vk)
	if err != nil {
		return "", fmt.Errorf("replace copy %s of %q: %w", gone, volume, err)
	}
	if len(resp.Kvs) == 0 {
		return "", fmt.Errorf("replace copy %s of %q: %w", gone, volume, ErrVolumeNotFound)
	}
	var rec volumeRecord
	if err := json.Unmarshal(resp.Kvs[0].Value, &rec); err != nil {
		return "", err
	}
	if rec.Primary != cs.n.cfg.NodeName || rec.Term != term {
		return "", fmt.Errorf("replace copy %s of %q: this node is not the primary at term %d (primary %s, term %d): %w",
			gone, volume, term, rec.Primary, rec.Term, ErrNotPrimary)
	}
	if rec.State != volumeActive || !slices.Contains(rec.Copies, gone) || gone == rec.Primary {
		return "", fmt.Errorf("replace copy %s of %q: not a copy of the volume other than its primary's", gone, volume)
	}
	if !slices.ContainsFunc(rec.InSync, func(c string) bool { return c != gone }) {
		return "", fmt.Errorf("replace copy %s of %q: no other copy is in sync to rebuild it from: %w", gone, volume, ErrDegraded)
	}
	used := map[string]bool{}
	for _, ni := range nodes {
		if slices.Contains(rec.Copies, ni.Name) && ni.Name != gone && ni.FailureDomain != "" {
			used[ni.FailureDomain] = true
		}
	}
	var cand []NodeInfo
	for _, ni := range nodes {
		if ni.Up && ni.Drain == "" && !slices.Contains(rec.Copies, ni.Name) && ni.FreeBytes >= rec.Spec.Capacity {
			cand = append(cand, ni)
		}
	}
	if len(cand) == 0 {
		return "", fmt.Errorf("replace copy %s of %q: no other node is up with %d free bytes and no copy of it: %w",
			gone, volume, rec.Spec.Capacity, ErrNotEnoughNodes)
	}
	rank := func(ni NodeInfo) int {
		if ni.FailureDomain != "" && used[ni.FailureDomain] {
			return 1
		}
		return 0
	}
	slices.SortFunc(cand, func(a, b NodeInfo) int {
		if c := cmp.Compare(rank(a), rank(b)); c != 0 {
			return c
		}
		if c := cmp.Compare(b.FreeBytes, a.FreeBytes); c != 0 {
			return c
		}
		return cmp.Compare(a.Name, b.Name)
	})
	next := cand[0].Name
	if i := slices.IndexFunc(cand, func(ni NodeInfo) bool { return ni.Name == prefer }); i >= 0 {
		next = cand[i].Name
	}
	rec.Copies = slices.Clone(rec.Copies)
	rec.Copies[slices.Index(rec.Copies, gone)] = next
	rec.InSync = slices.DeleteFunc(slices.Clone(rec.InSync), func(c string) bool { return c == gone })
	c := copyRecord{State: CopyRebuilding, Reason: "replaces the copy on " + gone, UpdatedAt: time.Now().UTC()}
	// After an unknown outcome (ErrUnknownOutcome, an error to the caller)
	// the copy is replaced or not; the rebuild loop looks at the placement
	// again, and ReplaceCopy refuses a copy that is no longer placed.
	put, err := cs.n.commit(ctx, txnSpec{
		If: []clientv3.Cmp{clientv3.Compare(clientv3.ModRevision(vk), "=", resp.Kvs[0].ModRevision),
			clientv3.Compare(clientv3.LeaseValue(ak), "=", s.Lease()),
			clientv3.Compare(clientv3.CreateRevision(cs.n.key("alive", gone)), "=", 0)},
		Then: []clientv3.Op{clientv3.OpPut(vk, mustJSON(rec)), clientv3.OpDelete(cs.n.key("copies", volume, gone)),
			clientv3.OpPut(cs.n.key("copies", volume, next), mustJSON(c))}})
	if err != nil {
		return "", fmt.Errorf("replace copy %s of %q: %w", gone, volume, err)
	}
	if !put.Succeeded {
		return "", fmt.Errorf("replace copy %s of %q: the volume record changed meanwhile, %s is back, or this node lost its lease",
			gone, volume, gone)
	}
	cs.n.log.Warn("copy replaced: its node was gone too long; the new copy is rebuilt", "volume", volume, "gone", gone,
		"new", next, "term", term)
	return next, nil
}
