package cluster

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// Draining a node (docs/cluster.md, "Drain"): every copy on the node is
// moved to another eligible node, and the volumes it is the primary of are
// handed over to an in-sync copy elsewhere, as a job on the drained node.
// drained/<node> marks it, so that placement (CreateVolume, ReplaceCopy and
// the drain's own moves) skips it until it is undrained.

// Drain states (NodeInfo.Drain, api.Node.Drain).
const (
	DrainRunning = "draining"
	DrainDone    = "drained"
)

// CopyRemoving is the state of a copy taken out of its volume's placement
// (a drained node's): its node deletes it and then the key.
const CopyRemoving = "removing"

// drainRecord is "drained/<node>".
type drainRecord struct {
	State string    `json:"state"`
	Since time.Time `json:"since"`
}

// Move is one copy a drain moves: the volume's copy on the drained node
// goes to To, rebuilt there before the drained one is removed.
type Move struct {
	Volume string
	To     string
	// Primary: the drained node is the volume's primary; it hands the
	// volume over to an in-sync copy once the new copy is in sync.
	Primary  bool
	Capacity int64
}

// PlanDrain says where each copy on node would go, without changing
// anything: one eligible node per copy (up, not drained, without a copy of
// the volume, with free bytes for its capacity after the moves planned
// before it; a failure domain the volume's other copies do not use first,
// then the most free bytes, then the name). A copy with nowhere to go is
// ErrNotEnoughNodes naming the volume and why each node is not eligible; a
// volume of one copy is ErrNotSupported (it has no copy to hand over to).
func (vs Volumes) PlanDrain(ctx context.Context, node string) ([]Move, error) {
	nodes, err := vs.n.Nodes(ctx)
	if err != nil {
		return nil, err
	}
	i := slices.IndexFunc(nodes, func(ni NodeInfo) bool { return ni.Name == node })
	if i < 0 {
		return nil, fmt.Errorf("drain %s: no such node in the cluster: %w", node, ErrNodeNotFound)
	}
	if !nodes[i].Up {
		return nil, fmt.Errorf("drain %s: the node is down (its copies are rebuilt elsewhere after --rebuild-after); "+
			"a drain needs it up: %w", node, ErrNotEnoughNodes)
	}
	pls, err := vs.Placements(ctx)
	if err != nil {
		return nil, err
	}
	names := make([]string, 0, len(pls))
	for name, p := range pls {
		if !p.Deleting && slices.ContainsFunc(p.Copies, func(c CopyInfo) bool { return c.Node == node }) {
			names = append(names, name)
		}
	}
	slices.Sort(names)
	domainOf := map[string]string{}
	for _, ni := range nodes {
		domainOf[ni.Name] = ni.FailureDomain
	}
	reserved := map[string]int64{}
	var moves []Move
	for _, name := range names {
		p := pls[name]
		if p.Replicas <= 1 || len(p.Copies) <= 1 {
			return nil, fmt.Errorf("drain %s: volume %q has a single copy (replicas %d), on this node: a drain moves "+
				"the copies of replicated volumes only; delete it or copy it elsewhere first: %w", node, name, p.Replicas, ErrNotSupported)
		}
		used := map[string]bool{}
		for _, c := range p.Copies {
			if c.Node != node && domainOf[c.Node] != "" {
				used[domainOf[c.Node]] = true
			}
		}
		var cand []NodeInfo
		var why []string
		for _, ni := range nodes {
			switch {
			case ni.Name == node:
			case !ni.Up:
				why = append(why, ni.Name+" is down")
			case ni.Drain != "":
				why = append(why, ni.Name+" is "+ni.Drain)
			case slices.ContainsFunc(p.Copies, func(c CopyInfo) bool { return c.Node == ni.Name }):
				why = append(why, ni.Name+" holds a copy already")
			case ni.FreeBytes-reserved[ni.Name] < p.Spec.Capacity:
				why = append(why, fmt.Sprintf("%s has %d bytes free of the %d needed", ni.Name,
					ni.FreeBytes-reserved[ni.Name], p.Spec.Capacity))
			default:
				cand = append(cand, ni)
			}
		}
		if len(cand) == 0 {
			if len(why) == 0 {
				why = append(why, "the cluster has no other node")
			}
			return nil, fmt.Errorf("drain %s: no eligible node for the copy of volume %q (%s); nothing was changed: %w",
				node, name, strings.Join(why, "; "), ErrNotEnoughNodes)
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
			if c := cmp.Compare(b.FreeBytes-reserved[b.Name], a.FreeBytes-reserved[a.Name]); c != 0 {
				return c
			}
			return cmp.Compare(a.Name, b.Name)
		})
		to := cand[0].Name
		reserved[to] += p.Spec.Capacity
		moves = append(moves, Move{Volume: name, To: to, Primary: p.Primary == node, Capacity: p.Spec.Capacity})
	}
	return moves, nil
}

// readVolume reads volumes/<volume> with its revision.
func (vs Volumes) readVolume(ctx context.Context, volume string) (volumeRecord, int64, error) {
	vk := vs.n.key("volumes", volume)
	resp, err := vs.n.cli.Get(ctx, vk)
	if err != nil {
		return volumeRecord{}, 0, err
	}
	if len(resp.Kvs) == 0 {
		return volumeRecord{}, 0, fmt.Errorf("volume %q: %w", volume, ErrVolumeNotFound)
	}
	var rec volumeRecord
	if err := json.Unmarshal(resp.Kvs[0].Value, &rec); err != nil {
		return volumeRecord{}, 0, fmt.Errorf("etcd key %s: %w", vk, err)
	}
	return rec, resp.Kvs[0].ModRevision, nil
}

// AddCopy places one more copy of volume on node to, recorded rebuilding
// (one Txn comparing the volume record's revision): to makes it, and the
// volume's primary rebuilds it whole, as for ReplaceCopy. The volume has a
// copy more than its replicas until the drained one is removed. Adding a
// copy placed already is no error.
func (vs Volumes) AddCopy(ctx context.Context, volume, to, reason string) error {
	for {
		rec, rev, err := vs.readVolume(ctx, volume)
		if err != nil {
			return fmt.Errorf("add a copy of %q on %s: %w", volume, to, err)
		}
		if slices.Contains(rec.Copies, to) {
			return nil
		}
		if rec.State != volumeActive {
			return fmt.Errorf("add a copy of %q on %s: the volume is being deleted: %w", volume, to, ErrVolumeNotFound)
		}
		rec.Copies = append(slices.Clone(rec.Copies), to)
		vk, ck := vs.n.key("volumes", volume), vs.n.key("copies", volume, to)
		c := copyRecord{State: CopyRebuilding, Reason: reason, UpdatedAt: time.Now().UTC()}
		// An unknown outcome (ErrUnknownOutcome) fails the drain; run
		// again, it finds the copy added (no error) or adds it.
		resp, err := vs.n.commit(ctx, txnSpec{
			If: []clientv3.Cmp{clientv3.Compare(clientv3.ModRevision(vk), "=", rev),
				clientv3.Compare(clientv3.CreateRevision(ck), "=", 0)},
			Then: []clientv3.Op{clientv3.OpPut(vk, mustJSON(rec)), clientv3.OpPut(ck, mustJSON(c))}})
		if err != nil {
			return fmt.Errorf("add a copy of %q on %s: %w", volume, to, err)
		}
		if resp.Succeeded {
			vs.n.log.Info("copy added; its primary rebuilds it", "volume", volume, "copy", to, "reason", reason)
			return nil
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		sleep(ctx, 20*time.Millisecond)
	}
}

// RemoveCopy takes node's copy of volume out of its placement, for a drain:
// one Txn comparing the volume record's revision that drops node from the
// copies and the in-sync set and records its copy CopyRemoving. node must
// not be the primary, and the in-sync set without it must still hold the
// primary. The primary stops writing the copy when it sees it gone (its Sets forget
// it); node deletes it (RemovedCopy then clears the record).
func (vs Volumes) RemoveCopy(ctx context.Context, volume, node string) error {
	for {
		rec, rev, err := vs.readVolume(ctx, volume)
		if err != nil {
			return fmt.Errorf("remove the copy of %q on %s: %w", volume, node, err)
		}
		if !slices.Contains(rec.Copies, node) {
			return nil
		}
		if rec.Primary == node {
			return fmt.Errorf("remove the copy of %q on %s: it is the primary: %w", volume, node, ErrNotPrimary)
		}
		inSync := slices.DeleteFunc(slices.Clone(rec.InSync), func(c string) bool { return c == node })
		if !slices.Contains(inSync, rec.Primary) {
			return fmt.Errorf("remove the copy of %q on %s: the primary %s is out of sync: %w", volume, node, rec.Primary, ErrDegraded)
		}
		ck := vs.n.key("copies", volume, node)
		cresp, err := vs.n.cli.Get(ctx, ck)
		if err != nil {
			return fmt.Errorf("remove the copy of %q on %s: %w", volume, node, err)
		}
		var c copyRecord
		if len(cresp.Kvs) > 0 {
			_ = json.Unmarshal(cresp.Kvs[0].Value, &c)
		}
		c = copyRecord{State: CopyRemoving, Reason: "drained", LocalUID: c.LocalUID, UpdatedAt: time.Now().UTC()}
		rec.InSync = inSync
		rec.Copies = slices.DeleteFunc(slices.Clone(rec.Copies), func(c string) bool { return c == node })
		if !slices.Contains(rec.Removing, node) {
			rec.Removing = append(slices.Clone(rec.Removing), node)
		}
		vk := vs.n.key("volumes", volume)
		// An unknown outcome (ErrUnknownOutcome) fails the drain; run
		// again, it finds the copy out of the placement (no error) or
		// takes it out.
		resp, err := vs.n.commit(ctx, txnSpec{If: []clientv3.Cmp{clientv3.Compare(clientv3.ModRevision(vk), "=", rev)},
			Then: []clientv3.Op{clientv3.OpPut(vk, mustJSON(rec)), clientv3.OpPut(ck, mustJSON(c))}})
		if err != nil {
			return fmt.Errorf("remove the copy of %q on %s: %w", volume, node, err)
		}
		if resp.Succeeded {
			vs.n.log.Info("copy taken out of the placement (drain)", "volume", volume, "copy", node)
			return nil
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		sleep(ctx, 20*time.Millisecond)
	}
}

// RemovingUID is the local UID of this node's copy of volume that is
// being removed (CopyRemoving), or "" when there is none.
func (vs Volumes) RemovingUID(ctx context.Context, volume string) (string, error) {
	resp, err := vs.n.cli.Get(ctx, vs.n.key("copies", volume, vs.n.cfg.NodeName))
	if err != nil {
		return "", err
	}
	if len(resp.Kvs) == 0 {
		return "", nil
	}
	var c copyRecord
	if json.Unmarshal(resp.Kvs[0].Value, &c) != nil || c.State != CopyRemoving {
		return "", nil
	}
	return c.LocalUID, nil
}

// RemovedCopy records that this node deleted its removed copy of volume:
// the copy key goes, and the node leaves the record's Removing list.
func (vs Volumes) RemovedCopy(ctx context.Context, volume string) error {
	me := vs.n.cfg.NodeName
	for {
		rec, rev, err := vs.readVolume(ctx, volume)
		if err != nil {
			return err
		}
		ck, vk := vs.n.key("copies", volume, me), vs.n.key("volumes", volume)
		ops := []clientv3.Op{}
		if !slices.Contains(rec.Copies, me) {
			ops = append(ops, clientv3.OpDelete(ck))
		}
		if slices.Contains(rec.Removing, me) {
			rec.Removing = slices.DeleteFunc(slices.Clone(rec.Removing), func(c string) bool { return c == me })
			ops = append(ops, clientv3.OpPut(vk, mustJSON(rec)))
		}
		if len(ops) == 0 {
			return nil
		}
		// An unknown outcome (ErrUnknownOutcome) is an error to the
		// caller, which records the removal again later (finishRemoval on
		// reconcile's next full read): that round finds this node off the
		// Removing list if this one applied, and deletes the copy key
		// again, which changes nothing.
		resp, err := vs.n.commit(ctx, txnSpec{If: []clientv3.Cmp{clientv3.Compare(clientv3.ModRevision(vk), "=", rev)},
			Then: ops})
		if err != nil {
			return err
		}
		if resp.Succeeded {
			return nil
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		sleep(ctx, 20*time.Millisecond)
	}
}
