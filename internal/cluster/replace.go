package cluster

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"time"

	"go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// Replacing a node that is gone (docs/cluster.md, "Replacing a dead node"):
// `quiver node replace OLD NEW` marks OLD replaced by NEW (replacing/<OLD>);
// each volume's primary sees the mark and, without waiting for
// --rebuild-after, replaces the copy on OLD by a new one on NEW through
// the rebuild machinery (ReplaceCopy, then the primary's rebuild job); the
// replace waits until each of those volumes is whole again, drops what is
// left of OLD in the records, and then forgets OLD as RemoveNode does (its
// records, removed/<its id>, its etcd member). A volume whose only in-sync
// copy is on OLD is never touched: OLD is then not forgotten.

// replacingRecord is "replacing/<node>": the node is gone and its copies go
// to New.
type replacingRecord struct {
	New   string    `json:"new"`
	Since time.Time `json:"since"`
}

// Replacements are the nodes being replaced (a node replace in progress),
// each with the node its copies go to.
func (n *Node) Replacements(ctx context.Context) (map[string]string, error) {
	resp, err := n.cli.Get(ctx, n.key("replacing")+"/", clientv3.WithPrefix())
	if err != nil {
		return nil, fmt.Errorf("list the nodes being replaced: %w", err)
	}
	out := map[string]string{}
	for _, kv := range resp.Kvs {
		var r replacingRecord
		if json.Unmarshal(kv.Value, &r) == nil && r.New != "" {
			out[lastSegment(string(kv.Key))] = r.New
		}
	}
	return out, nil
}

// ReplacePlan is what a node replace does (PlanReplace).
type ReplacePlan struct {
	Old, New string
	// Rebuild are the volumes with a copy on Old that an in-sync copy on
	// another node rebuilds, by name; Bytes is the size of their disks.
	Rebuild []string
	Bytes   int64
	// Stuck are the volumes whose only in-sync copy is on Old, each with
	// why: the replace leaves them as they are, and Old is not forgotten.
	Stuck map[string]string
	// Forgotten: Old's records are gone already (an earlier replace whose
	// etcd member removal failed); only its etcd member is left.
	Forgotten bool
}

// ReplaceProgress is what a node replace reports as it goes (a job).
type ReplaceProgress interface {
	AddTotal(bytes int64)
	Add(bytes int64)
	Done(volume string)
}

// PlanReplace checks a replace of old by new, changing nothing: old is a
// node of the cluster that is down (up: ErrNodeInUse, a live node is taken
// out with a drain), new a node that is up and not drained
// (ErrNodeNotFound, ErrNotEnoughNodes), and removing old's etcd member
// keeps a quorum (ErrQuorum). It lists the volumes to rebuild and those
// stuck on old.
func (n *Node) PlanReplace(ctx context.Context, old, new string) (ReplacePlan, error) {
	plan := ReplacePlan{Old: old, New: new, Stuck: map[string]string{}}
	if old == new {
		return plan, fmt.Errorf("replace node %s by %s: name the node that is gone, then another node, which takes its copies: %w",
			old, new, ErrInvalidMember)
	}
	nodes, err := n.Nodes(ctx)
	if err != nil {
		return plan, fmt.Errorf("replace node %s: %w", old, err)
	}
	list, err := n.cli.MemberList(ctx)
	if err != nil {
		return plan, fmt.Errorf("replace node %s: list the etcd members: %w", old, err)
	}
	up := map[string]bool{}
	var oi, ni *NodeInfo
	for i := range nodes {
		up[nodes[i].Name] = nodes[i].Up
		switch nodes[i].Name {
		case old:
			oi = &nodes[i]
		case new:
			ni = &nodes[i]
		}
	}
	mi := slices.IndexFunc(list.Members, func(m *etcdserverpb.Member) bool { return m.Name == old })
	if oi == nil {
		if mi < 0 {
			return plan, fmt.Errorf("replace node %s: no such node in the cluster, and no etcd member of that name "+
				"(replaced or removed already? quiver node list): %w", old, ErrNodeNotFound)
		}
		plan.Forgotten = true
	} else if oi.Up {
		return plan, fmt.Errorf("replace node %s: the node is up: a replace is for a node that is gone; take a running "+
			"node out with quiver node remove %s --drain: %w", old, old, ErrNodeInUse)
	}
	switch {
	case ni == nil:
		return plan, fmt.Errorf("replace node %s by %s: %s is not a node of the cluster: add it first (quiver node add %s "+
			"--peer-url URL, then start it with the flags printed): %w", old, new, new, new, ErrNodeNotFound)
	case !ni.Up:
		return plan, fmt.Errorf("replace node %s by %s: %s is down: start it first: %w", old, new, new, ErrNotEnoughNodes)
	case ni.Drain != "":
		return plan, fmt.Errorf("replace node %s by %s: %s is %s: undrain it first (quiver node undrain %s): %w",
			old, new, new, ni.Drain, new, ErrNotEnoughNodes)
	}
	if mi >= 0 && !list.Members[mi].IsLearner {
		if err := quorumAfterRemoval(list.Members, list.Members[mi].ID, up); err != nil {
			return plan, fmt.Errorf("replace node %s: %w", old, err)
		}
	}
	if plan.Forgotten {
		return plan, nil
	}
	resp, err := n.cli.Get(ctx, n.key("volumes")+"/", clientv3.WithPrefix())
	if err != nil {
		return plan, fmt.Errorf("replace node %s: %w", old, err)
	}
	for _, kv := range resp.Kvs {
		var rec volumeRecord
		if json.Unmarshal(kv.Value, &rec) != nil || rec.State != volumeActive ||
			(rec.Primary != old && !slices.Contains(rec.Copies, old)) {
			continue
		}
		name := lastSegment(string(kv.Key))
		if why := stuckOn(old, rec); why != "" {
			plan.Stuck[name] = why
			continue
		}
		plan.Rebuild = append(plan.Rebuild, name)
		for _, d := range rec.Spec.Disks {
			plan.Bytes += d.Size
		}
	}
	slices.Sort(plan.Rebuild)
	return plan, nil
}

// stuckOn says why no copy of the volume rec can be rebuilt from a node
// other than old, or "" when one can: an in-sync copy on another node.
func stuckOn(old string, rec volumeRecord) string {
	for _, c := range rec.InSync {
		if c != old && slices.Contains(rec.Copies, c) {
			return ""
		}
	}
	if len(rec.Copies) <= 1 {
		return "its only copy is on " + old
	}
	var others []string
	for _, c := range rec.Copies {
		if c != old {
			others = append(others, c)
		}
	}
	return fmt.Sprintf("its only in-sync copy is on %s (out of sync on %s)", old, strings.Join(others, ", "))
}

// stuckError says which volumes keep old in the cluster, and what to do.
func stuckError(old, new string, stuck map[string]string) error {
	names := make([]string, 0, len(stuck))
	for v := range stuck {
		names = append(names, v)
	}
	slices.Sort(names)
	var parts []string
	for _, v := range names {
		parts = append(parts, fmt.Sprintf("%s: %s", v, stuck[v]))
	}
	return fmt.Errorf("replace node %s: %s is not removed, since it holds the only in-sync data of %d volume(s) (%s); "+
		"the copies of the other volumes are rebuilt on %s; bring %s back up (its copies resync, then "+
		"quiver node remove %s --drain), or delete those volumes, then run quiver node replace %s %s again: %w",
		old, old, len(names), strings.Join(parts, "; "), new, old, old, old, new, ErrDegraded)
}

// ReplaceNode replaces old, a node that is gone, by new (the job of `quiver
// node replace`): PlanReplace (a refusal changes nothing), then
// replacing/<old> = new, written while old is down (compared in the Txn).
// The volumes' primaries then replace their copies on old (on new, or by
// the rebuild rule when new holds a copy of the volume already) and
// rebuild them; ReplaceNode waits, volume by volume, until old is out of
// each volume's copies and every copy on an up node is in sync again,
// reporting the rebuilds' bytes and each volume done to pr. Then what is
// left of old in the records goes (copy keys, the removing lists, its copies
// of volumes being deleted) and old is forgotten: its records, removed/<its
// id> and its etcd member, in the steps and with the checks of RemoveNode,
// in a Txn that holds only while old is down. A volume stuck on old
// (PlanReplace.Stuck, or one whose other in-sync copies went meanwhile) is
// left as it is: the others are rebuilt, and the replace ends with
// ErrDegraded naming it, old still a node. It stops with an error when old
// comes back up or new goes down or is drained; ending with an error it
// takes replacing/<old> away (the primaries place no more copies for it;
// rebuilds placed go on). Run again, it finds what was done done.
func (n *Node) ReplaceNode(ctx context.Context, old, new string, pr ReplaceProgress) (RemovedNode, error) {
	plan, err := n.PlanReplace(ctx, old, new)
	if err != nil {
		return RemovedNode{Name: old}, err
	}
	if !plan.Forgotten {
		if err := n.markReplacing(ctx, old, new); err != nil {
			return RemovedNode{Name: old}, err
		}
		if err := n.replaceCopies(ctx, plan, pr); err != nil {
			n.unmarkReplacing(ctx, old)
			return RemovedNode{Name: old}, err
		}
	}
	out, err := n.forgetNode(ctx, old, true)
	if err != nil && out.NodeID == "" {
		n.unmarkReplacing(ctx, old)
	}
	if err == nil {
		n.log.Info("node replaced: its copies are rebuilt, its records and etcd member gone", "replaced", old, "new", new,
			"volumes", len(plan.Rebuild))
	}
	return out, err
}

// markReplacing writes replacing/<old> = new while old is a node that is
// down.
func (n *Node) markReplacing(ctx context.Context, old, new string) error {
	mk, ak, rk := n.key("members", old), n.key("alive", old), n.key("replacing", old)
	// An unknown outcome fails the replace; run again, it writes the
	// same record again.
	resp, err := n.commit(ctx, txnSpec{
		If: []clientv3.Cmp{clientv3.Compare(clientv3.CreateRevision(mk), ">", 0),
			clientv3.Compare(clientv3.CreateRevision(ak), "=", 0)},
		Then: []clientv3.Op{clientv3.OpPut(rk, mustJSON(replacingRecord{New: new, Since: time.Now().UTC()}))}})
	if err != nil {
		return fmt.Errorf("replace node %s: %w", old, err)
	}
	if !resp.Succeeded {
		return fmt.Errorf("replace node %s: it came back up, or was removed, meanwhile: check quiver node list: %w",
			old, ErrNodeInUse)
	}
	n.log.Info("node marked replaced: the primaries rebuild its copies", "replaced", old, "new", new)
	return nil
}

// unmarkReplacing takes replacing/<old> away, as a replace ends unfinished.
func (n *Node) unmarkReplacing(ctx context.Context, old string) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	if _, err := n.cli.Delete(ctx, n.key("replacing", old)); err != nil {
		n.log.Warn("clear the mark of a replace that stopped", "replaced", old, "err", err)
	}
}

// replaceCopies waits for each volume of plan to be rebuilt without old,
// drops what is left of old in the records, and fails naming the volumes
// stuck on old.
func (n *Node) replaceCopies(ctx context.Context, plan ReplacePlan, pr ReplaceProgress) error {
	pr.AddTotal(plan.Bytes)
	stuck := plan.Stuck
	for _, v := range plan.Rebuild {
		why, err := n.waitReplaced(ctx, plan, v, pr)
		if err != nil {
			return err
		}
		if why != "" {
			stuck[v] = why
			continue
		}
		pr.Done(v)
	}
	if err := n.dropLeftovers(ctx, plan.Old); err != nil {
		return err
	}
	if len(stuck) > 0 {
		return stuckError(plan.Old, plan.New, stuck)
	}
	return nil
}

// replacePoll is how often a replace looks at a volume being rebuilt.
const replacePoll = 500 * time.Millisecond

// waitReplaced waits until old is out of volume's copies and every copy of
// it on an up node is in sync, adding its rebuild's bytes to pr. It
// returns why the volume is stuck on old when no other copy is in sync
// (the others went meanwhile), and an error when old is back or new is no
// longer up and undrained, or a copy failed.
func (n *Node) waitReplaced(ctx context.Context, plan ReplacePlan, volume string, pr ReplaceProgress) (string, error) {
	old, new := plan.Old, plan.New
	var total, reported int64
	add := func(done int64) {
		if d := min(done, total) - reported; d > 0 {
			pr.Add(d)
			reported += d
		}
	}
	for first := true; ; first = false {
		if !first {
			sleep(ctx, replacePoll)
		}
		if err := ctx.Err(); err != nil {
			return "", err
		}
		resp, err := n.cli.Txn(ctx).Then(clientv3.OpGet(n.key("volumes", volume)),
			clientv3.OpGet(n.key("copies", volume)+"/", clientv3.WithPrefix()),
			clientv3.OpGet(n.key("alive")+"/", clientv3.WithPrefix(), clientv3.WithKeysOnly()),
			clientv3.OpGet(n.key("drained", new))).Commit()
		if err != nil {
			n.log.Warn("replace: read a volume being rebuilt", "volume", volume, "err", err)
			continue
		}
		up := map[string]bool{}
		for _, kv := range resp.Responses[2].GetResponseRange().Kvs {
			up[lastSegment(string(kv.Key))] = true
		}
		switch {
		case up[old]:
			return "", fmt.Errorf("replace node %s: %s came back up meanwhile: the replace stops (the copies rebuilt so far "+
				"stay; its own copies resync); to take it out, quiver node remove %s --drain: %w", old, old, old, ErrNodeInUse)
		case !up[new]:
			return "", fmt.Errorf("replace node %s by %s: %s went down meanwhile: bring it up and run the replace again: %w",
				old, new, new, ErrNotEnoughNodes)
		case len(resp.Responses[3].GetResponseRange().Kvs) > 0:
			return "", fmt.Errorf("replace node %s by %s: %s was drained meanwhile: undrain it and run the replace again: %w",
				old, new, new, ErrNotEnoughNodes)
		}
		vkv := resp.Responses[0].GetResponseRange().Kvs
		var rec volumeRecord
		if len(vkv) == 0 || json.Unmarshal(vkv[0].Value, &rec) != nil || rec.State != volumeActive {
			add(total)
			return "", nil // deleted meanwhile: dropLeftovers clears what is left
		}
		if total == 0 {
			for _, d := range rec.Spec.Disks {
				total += d.Size
			}
		}
		copies := map[string]copyRecord{}
		for _, kv := range resp.Responses[1].GetResponseRange().Kvs {
			var c copyRecord
			if json.Unmarshal(kv.Value, &c) == nil {
				copies[lastSegment(string(kv.Key))] = c
			}
		}
		if rec.Primary == old || slices.Contains(rec.Copies, old) {
			if why := stuckOn(old, rec); why != "" {
				return why, nil
			}
			continue // the failover, or the primary's replacement, to come
		}
		whole, done := true, int64(0)
		for _, c := range rec.Copies {
			if !up[c] || slices.Contains(rec.InSync, c) {
				continue
			}
			whole = false
			cr := copies[c]
			if cr.State == CopyFailed {
				return "", fmt.Errorf("replace node %s: the new copy of %q on %s failed: %s: %w", old, volume, c, cr.Reason,
					ErrCopyFailed)
			}
			if cr.Progress != nil {
				done = max(done, cr.Progress.DoneBytes)
			}
		}
		if whole {
			add(total)
			n.log.Info("replace: volume rebuilt without the replaced node", "volume", volume, "replaced", old,
				"copies", rec.Copies)
			return "", nil
		}
		add(done)
	}
}

// dropLeftovers takes what is left of old out of the volumes' records:
// its copy keys, its name in the removing lists (a drain it never
// finished), and its copies of volumes being deleted (their deletion then
// goes on without it). Each volume is one Txn compared on its record's
// revision (a record changed meanwhile is read again). A volume that is
// active and still places a copy on old is left as it is.
func (n *Node) dropLeftovers(ctx context.Context, old string) error {
	for attempt := 0; ; attempt++ {
		changed, err := n.dropLeftoversOnce(ctx, old)
		if err != nil || !changed {
			return err
		}
		if attempt >= 10 {
			return fmt.Errorf("replace node %s: the volumes' records keep changing under the replace: run it again", old)
		}
		sleep(ctx, 50*time.Millisecond)
	}
}

// dropLeftoversOnce is one round of dropLeftovers; changed: a record
// changed under its Txn.
func (n *Node) dropLeftoversOnce(ctx context.Context, old string) (changed bool, err error) {
	resp, err := n.cli.Txn(ctx).Then(clientv3.OpGet(n.key("volumes")+"/", clientv3.WithPrefix()),
		clientv3.OpGet(n.key("copies")+"/", clientv3.WithPrefix(), clientv3.WithKeysOnly())).Commit()
	if err != nil {
		return false, fmt.Errorf("replace node %s: %w", old, err)
	}
	keyed := map[string]bool{}
	for _, kv := range resp.Responses[1].GetResponseRange().Kvs {
		k := string(kv.Key)
		if lastSegment(k) == old {
			keyed[lastSegment(strings.TrimSuffix(k, "/"+old))] = true
		}
	}
	for _, kv := range resp.Responses[0].GetResponseRange().Kvs {
		var rec volumeRecord
		if json.Unmarshal(kv.Value, &rec) != nil {
			continue
		}
		name := lastSegment(string(kv.Key))
		placed := rec.Primary == old || slices.Contains(rec.Copies, old)
		deleting := rec.State != volumeActive
		if (placed && !deleting) || (!placed && !keyed[name] && !slices.Contains(rec.Removing, old)) {
			continue
		}
		without := func(s []string) []string {
			return slices.DeleteFunc(slices.Clone(s), func(c string) bool { return c == old })
		}
		rec.Copies, rec.InSync, rec.Removing = without(rec.Copies), without(rec.InSync), without(rec.Removing)
		vk := string(kv.Key)
		// An unknown outcome fails the replace; run again, it finds what
		// is left then.
		tresp, err := n.commit(ctx, txnSpec{If: []clientv3.Cmp{clientv3.Compare(clientv3.ModRevision(vk), "=", kv.ModRevision)},
			Then: []clientv3.Op{clientv3.OpPut(vk, mustJSON(rec)), clientv3.OpDelete(n.key("copies", name, old))}})
		if err != nil {
			return false, fmt.Errorf("replace node %s: drop its copy of %q: %w", old, name, err)
		}
		if !tresp.Succeeded {
			changed = true
			continue
		}
		n.log.Info("replace: what was left of the replaced node in a volume's record dropped", "volume", name,
			"replaced", old, "deleting", deleting)
		if deleting {
			n.Copies().finishDelete(ctx, name, true)
		}
	}
	return changed, nil
}
