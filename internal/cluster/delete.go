package cluster

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// Deletes (docs/cluster.md, "Delete"). A delete marks the record deleting;
// the primary's node deletes its copy first, then the other copies' nodes
// theirs, and the last copy gone takes the record with it. The primary's
// copy is the only one a client can have attached: when it refuses, no copy
// is gone yet, and the record goes back to active. A copy whose node is down
// keeps the volume deleting (listed so, refused for attach, snapshot, clone
// and a new volume of its name) until that node is back and deletes it.

// DeleteVolume deletes volume from the cluster and waits, at most
// OpTimeout, until its record is gone. Its outcomes:
//   - nil: every copy and the record are gone;
//   - ErrDeleteRefused: the primary's copy refused (attached); no copy was
//     deleted and the volume is active again;
//   - ErrDeletePending: a copy's node is down, or its copy refused, or the
//     copies did not report in time: the volume stays deleting and the
//     copies' nodes finish the delete by themselves (reconcile);
//   - ErrVolumeNotFound, or an etcd error (nothing was changed, or the
//     volume is deleting: a delete again carries on).
func (vs Volumes) DeleteVolume(ctx context.Context, volume string) error {
	k := vs.n.key("volumes", volume)
	resp, err := vs.n.cli.Get(ctx, k)
	if err != nil {
		return fmt.Errorf("delete volume %q: %w", volume, err)
	}
	if len(resp.Kvs) == 0 {
		return fmt.Errorf("volume %q: %w", volume, ErrVolumeNotFound)
	}
	var rec volumeRecord
	if err := json.Unmarshal(resp.Kvs[0].Value, &rec); err != nil {
		return fmt.Errorf("etcd key %s: %w", k, err)
	}
	rec.State, rec.Refused = volumeDeleting, ""
	// Put even when it is marked already: the copy nodes see the event and
	// try again.
	// An unknown outcome (ErrUnknownOutcome) is an error to the caller
	// (503): the user's delete again marks the record again, which is
	// what this Put does even when it is marked.
	put, err := vs.n.commit(ctx, txnSpec{If: []clientv3.Cmp{clientv3.Compare(clientv3.ModRevision(k), "=", resp.Kvs[0].ModRevision)},
		Then: []clientv3.Op{clientv3.OpPut(k, mustJSON(rec))}})
	if err != nil {
		return fmt.Errorf("delete volume %q: %w", volume, err)
	}
	if !put.Succeeded {
		return fmt.Errorf("delete volume %q: changed meanwhile, retry", volume)
	}
	return vs.waitDeleted(ctx, volume)
}

// copiesLeft are the copy records of a volume that hold a local volume.
func copiesLeft(copies map[string]copyRecord) []string {
	var left []string
	for node, c := range copies {
		if c.LocalUID != "" {
			left = append(left, node)
		}
	}
	slices.Sort(left)
	return left
}

// waitDeleted waits, at most OpTimeout, until the record of the deleting
// volume is gone (removing it itself once no copy is left), or the
// primary's copy refused, or no copy left can go now.
func (vs Volumes) waitDeleted(ctx context.Context, volume string) error {
	ctx, cancel := context.WithTimeout(ctx, vs.n.cfg.OpTimeout)
	defer cancel()
	vk, cp := vs.n.key("volumes", volume), vs.n.key("copies", volume)+"/"
	for {
		resp, err := vs.n.cli.Txn(ctx).Then(clientv3.OpGet(vk), clientv3.OpGet(cp, clientv3.WithPrefix()),
			clientv3.OpGet(vs.n.key("alive")+"/", clientv3.WithPrefix(), clientv3.WithKeysOnly())).Commit()
		if err != nil {
			return fmt.Errorf("delete volume %q: %w", volume, vs.opError(ctx, err))
		}
		kvs := resp.Responses[0].GetResponseRange().Kvs
		if len(kvs) == 0 {
			vs.n.log.Info("volume deleted from the cluster", "volume", volume)
			return nil
		}
		var rec volumeRecord
		if err := json.Unmarshal(kvs[0].Value, &rec); err != nil {
			return fmt.Errorf("etcd key %s: %w", vk, err)
		}
		if rec.State != volumeDeleting {
			return fmt.Errorf("delete volume %q: the copy on %s, its primary, refused: %s; no copy was deleted and the volume is active: %w",
				volume, rec.Primary, rec.Refused, ErrDeleteRefused)
		}
		copies := map[string]copyRecord{}
		for _, kv := range resp.Responses[1].GetResponseRange().Kvs {
			var c copyRecord
			if json.Unmarshal(kv.Value, &c) == nil {
				copies[lastSegment(string(kv.Key))] = c
			}
		}
		left := copiesLeft(copies)
		if len(left) == 0 {
			if err := vs.removeRecord(ctx, volume, rec, kvs[0].ModRevision); err != nil {
				return fmt.Errorf("delete volume %q: %w", volume, err)
			}
			continue // read again: gone
		}
		alive := map[string]bool{}
		for _, kv := range resp.Responses[2].GetResponseRange().Kvs {
			alive[lastSegment(string(kv.Key))] = true
		}
		var stuck []string // copies that cannot go now, with why
		moving := false
		for _, node := range left {
			switch c := copies[node]; {
			case !alive[node]:
				stuck = append(stuck, node+" (down)")
			case c.State == copyDeleteFailed:
				stuck = append(stuck, fmt.Sprintf("%s (%s)", node, c.Reason))
			default:
				moving = true
			}
		}
		// The other copies wait for the primary's.
		if primaryLeft := slices.Contains(left, rec.Primary); primaryLeft && !alive[rec.Primary] {
			moving = false
		}
		pending := func(why string) error {
			return fmt.Errorf("delete volume %q: %s; it stays deleting, and the copies on %s are deleted when their node can (it is back, or the copy is detached): %w",
				volume, why, strings.Join(left, ", "), ErrDeletePending)
		}
		if !moving {
			return pending("copies out of reach: " + strings.Join(stuck, ", "))
		}
		wctx, wcancel := context.WithCancel(ctx)
		rev := resp.Header.Revision + 1
		wv, wc := vs.n.cli.Watch(wctx, vk, clientv3.WithRev(rev)), vs.n.cli.Watch(wctx, cp, clientv3.WithPrefix(), clientv3.WithRev(rev))
		select {
		case <-wv:
		case <-wc:
		case <-ctx.Done():
		}
		wcancel()
		if ctx.Err() != nil {
			return pending(fmt.Sprintf("the copies did not report within %s (--cluster-op-timeout)", vs.n.cfg.OpTimeout))
		}
	}
}

// removeRecord removes the record of volume, if it is still the one of
// mod revision modRev, and its copies' keys, and gives the record's charge
// back to its tenant's usage in the same Txn. A record changed or gone
// meanwhile is left as it is (nil: whoever changed it goes on).
func (vs Volumes) removeRecord(ctx context.Context, volume string, rec volumeRecord, modRev int64) error {
	k := vs.n.key("volumes", volume)
	for {
		ops := []clientv3.Op{clientv3.OpDelete(k), clientv3.OpDelete(vs.n.key("copies", volume)+"/", clientv3.WithPrefix())}
		cmps := []clientv3.Cmp{clientv3.Compare(clientv3.ModRevision(k), "=", modRev)}
		if rec.Spec.Tenant != "" {
			used, rev, err := vs.readUsage(ctx, rec.Spec.Tenant)
			if err != nil {
				return err
			}
			// The snapshots counted for it go back with it.
			snaps, srev, err := vs.snapCharge(ctx, volume)
			if err != nil {
				return err
			}
			back := Usage{Snapshots: snaps}
			if rec.Charge != nil {
				back = back.plus(*rec.Charge)
			}
			// Only the record still there gives its charge back, once.
			cmps = append(cmps, vs.usageUnchanged(rec.Spec.Tenant, rev),
				clientv3.Compare(clientv3.ModRevision(vs.snapChargeKey(volume)), "=", srev))
			ops = append(ops, clientv3.OpPut(vs.usageKey(rec.Spec.Tenant), mustJSON(used.minus(back))),
				clientv3.OpDelete(vs.snapChargeKey(volume)))
		}
		// An unknown outcome (ErrUnknownOutcome) is an error to the
		// caller (503): the user's delete again finds the record gone
		// (ErrVolumeNotFound: it was removed) or removes it; the compares
		// give the charge back once.
		resp, err := vs.n.commit(ctx, txnSpec{If: cmps, Then: ops, Else: []clientv3.Op{clientv3.OpGet(k)}})
		if err != nil {
			return err
		}
		if resp.Succeeded {
			return nil
		}
		kvs := resp.Responses[0].GetResponseRange().GetKvs()
		if len(kvs) == 0 || kvs[0].ModRevision != modRev {
			return nil // changed or removed by another meanwhile
		}
		// Else the tenant's usage or snapshot charge changed: again.
	}
}

// deleteCopy deletes this node's copy of a deleting volume (rec, at mod
// revision modRev; have is the copy's record, when exists): reconcile
// calls it for each change of the record and each full read. A copy of a
// node other than the primary waits until the primary's is gone. The
// primary's copy that refuses puts the record back to active, with why; a
// copy of another node that refuses is recorded delete-failed (the volume
// stays deleting). The last copy gone removes the record.
func (cs Copies) deleteCopy(ctx context.Context, name string, rec volumeRecord, modRev int64, have copyRecord, exists bool) {
	me := cs.n.cfg.NodeName
	ck := cs.n.key("copies", name, me)
	if !exists || have.LocalUID == "" {
		if exists {
			if _, err := cs.n.cli.Delete(ctx, ck); err != nil {
				cs.n.log.Warn("remove copy state", "volume", name, "err", err)
			}
		}
		cs.finishDelete(ctx, name, false)
		return
	}
	if rec.Primary != me && slices.Contains(rec.Copies, rec.Primary) {
		resp, err := cs.n.cli.Get(ctx, cs.n.key("copies", name, rec.Primary))
		if err != nil {
			cs.n.log.Warn("read the primary's copy state", "volume", name, "err", err)
			return
		}
		var pc copyRecord
		if len(resp.Kvs) > 0 && json.Unmarshal(resp.Kvs[0].Value, &pc) == nil && pc.LocalUID != "" {
			return // the primary's goes first; its node puts the record again then
		}
	}
	if err := cs.n.store.DeleteCopy(ctx, name, have.LocalUID); err != nil {
		cs.n.log.Error("delete a copy", "volume", name, "err", err)
		if rec.Primary == me {
			cs.refuseDelete(ctx, name, rec, modRev, err)
			return
		}
		have.State, have.Reason, have.UpdatedAt = copyDeleteFailed, err.Error(), time.Now().UTC()
		cs.putCopy(ctx, ck, have)
		return
	}
	cs.n.log.Info("copy deleted", "volume", name)
	if _, err := cs.n.cli.Delete(ctx, ck); err != nil {
		cs.n.log.Warn("remove copy state", "volume", name, "err", err)
	}
	cs.finishDelete(ctx, name, true)
}

// refuseDelete puts the record of a deleting volume back to active, with
// why, when the primary's copy refused to go: no other copy went before
// it. A record changed meanwhile (a delete again) is left deleting.
func (cs Copies) refuseDelete(ctx context.Context, name string, rec volumeRecord, modRev int64, cause error) {
	vk := cs.n.key("volumes", name)
	rec.State, rec.Refused = volumeActive, cause.Error()
	// An unknown outcome (ErrUnknownOutcome) is logged: the volume is
	// then active or still deleting, and a delete again decides.
	resp, err := cs.n.commit(ctx, txnSpec{If: []clientv3.Cmp{clientv3.Compare(clientv3.ModRevision(vk), "=", modRev)},
		Then: []clientv3.Op{clientv3.OpPut(vk, mustJSON(rec))}})
	switch {
	case err != nil:
		cs.n.log.Warn("put back a volume whose delete its primary refused", "volume", name, "err", err)
	case resp.Succeeded:
		cs.n.log.Warn("delete refused by the primary's copy: the volume is active again", "volume", name, "err", cause)
	}
}

// finishDelete removes the record of a deleting volume when no copy holds
// a local volume any more. Else, with again, it puts the record again,
// unchanged, for the copies' nodes that wait for the primary's copy to go.
func (cs Copies) finishDelete(ctx context.Context, name string, again bool) {
	vk, cp := cs.n.key("volumes", name), cs.n.key("copies", name)+"/"
	resp, err := cs.n.cli.Txn(ctx).Then(clientv3.OpGet(vk), clientv3.OpGet(cp, clientv3.WithPrefix())).Commit()
	if err != nil {
		cs.n.log.Warn("read a deleting volume", "volume", name, "err", err)
		return
	}
	kvs := resp.Responses[0].GetResponseRange().Kvs
	var rec volumeRecord
	if len(kvs) == 0 || json.Unmarshal(kvs[0].Value, &rec) != nil || rec.State != volumeDeleting {
		return
	}
	copies := map[string]copyRecord{}
	for _, kv := range resp.Responses[1].GetResponseRange().Kvs {
		var c copyRecord
		if json.Unmarshal(kv.Value, &c) == nil {
			copies[lastSegment(string(kv.Key))] = c
		}
	}
	if len(copiesLeft(copies)) == 0 {
		if err := cs.n.Volumes().removeRecord(ctx, name, rec, kvs[0].ModRevision); err != nil {
			cs.n.log.Warn("remove the record of a deleted volume", "volume", name, "err", err)
			return
		}
		cs.n.log.Info("volume deleted from the cluster: its last copy is gone", "volume", name)
		return
	}
	if !again {
		return
	}
	// An unknown outcome is logged: the next full read of the placements
	// (a node back, a watch broken) finds the same.
	if _, err := cs.n.commit(ctx, txnSpec{If: []clientv3.Cmp{clientv3.Compare(clientv3.ModRevision(vk), "=", kvs[0].ModRevision)},
		Then: []clientv3.Op{clientv3.OpPut(vk, string(kvs[0].Value))}}); err != nil {
		cs.n.log.Warn("tell the copies of a deleting volume", "volume", name, "err", err)
	}
}
