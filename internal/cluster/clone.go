package cluster

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/quiverstorage/quiver/internal/api"
)

// Clones of a replicated volume (docs/cluster.md, "Clones"): the primary
// clones its copy at the cut, each in-sync copy clones its own (OpClone)
// and records its copy of the clone, in sync at term 1, in
// copies/<clone>/<node>; then the primary places the clone on the same
// nodes (PlaceClone), itself its primary. Until PlaceClone the clone is
// not a volume of the cluster: OpUnclone deletes what a copy made.

// applyClone makes this node's copy of the clone op.Name of volume, the
// attachment through which the clone's primary (the source's) writes it at
// term 1, and its copy record. A failure after the clone was made deletes
// it again: a copy that answers an error leaves nothing behind.
func (o Ops) applyClone(ctx context.Context, volume string, op Op) error {
	if op.Name == "" || op.UID == "" {
		return fmt.Errorf("clone of %q: operation without a name or UID", volume)
	}
	uid, err := o.n.store.CloneCopy(ctx, volume, op)
	if err != nil {
		return err
	}
	undo := func(cause error) error {
		if derr := o.n.store.DeleteCopy(context.WithoutCancel(ctx), op.Name, uid); derr != nil {
			o.n.log.Error("delete a clone whose copy could not be recorded", "volume", op.Name, "err", derr)
		}
		return cause
	}
	err = o.n.store.AttachForPrimary(ctx, op.Name, op.Primary, 1)
	if err != nil {
		return undo(fmt.Errorf("clone %s: attach for the primary: %w", op.Name, err))
	}
	c := copyRecord{State: CopyInSync, LocalUID: uid, Term: 1, UpdatedAt: time.Now().UTC()}
	ck, vk := o.n.key("copies", op.Name, o.n.cfg.NodeName), o.n.key("volumes", op.Name)
	// An unknown outcome (ErrUnknownOutcome) is undone like any error:
	// the primary then fails the clone and unclones it on every copy,
	// which deletes a copy record that was applied (and DeleteCopy of the
	// copy undo deleted changes nothing).
	resp, err := o.n.commit(ctx, txnSpec{If: []clientv3.Cmp{clientv3.Compare(clientv3.CreateRevision(vk), "=", 0),
		clientv3.Compare(clientv3.CreateRevision(ck), "=", 0)},
		Then: []clientv3.Op{clientv3.OpPut(ck, mustJSON(c))}})
	switch {
	case err != nil:
		return undo(fmt.Errorf("clone %s: record the copy: %w", op.Name, err))
	case !resp.Succeeded:
		return undo(fmt.Errorf("clone %s: the name is placed already, or this node has a copy of it: %w", op.Name,
			ErrVolumeExists))
	}
	return nil
}

// applyUnclone deletes this node's copy of a clone of volume that its
// primary could not place (another copy failed it, or the primary crashed
// before placing it), and its copy record. A clone placed meanwhile is
// left alone. Without a copy record (the primary's own clone: its record
// is written when the clone is placed) the local volume op.Name goes if it
// is a clone of volume (Store.DeleteUnplacedClone).
func (o Ops) applyUnclone(ctx context.Context, volume string, op Op) error {
	ck, vk := o.n.key("copies", op.Name, o.n.cfg.NodeName), o.n.key("volumes", op.Name)
	resp, err := o.n.cli.Txn(ctx).Then(clientv3.OpGet(vk), clientv3.OpGet(ck)).Commit() // a read: changes nothing
	if err != nil {
		return fmt.Errorf("undo clone %s: %w", op.Name, err)
	}
	if vkv := resp.Responses[0].GetResponseRange().Kvs; len(vkv) > 0 {
		var rec volumeRecord
		if json.Unmarshal(vkv[0].Value, &rec) == nil && rec.UID == op.UID {
			return fmt.Errorf("undo clone %s: it is placed: %w", op.Name, ErrVolumeExists)
		}
		return nil // another volume of that name: its copy is not ours
	}
	ckv := resp.Responses[1].GetResponseRange().Kvs
	if len(ckv) == 0 {
		if err := o.n.store.DeleteUnplacedClone(ctx, volume, op.Name); err != nil {
			return fmt.Errorf("undo clone %s: %w", op.Name, err)
		}
		return nil
	}
	var c copyRecord
	if err := json.Unmarshal(ckv[0].Value, &c); err != nil {
		return fmt.Errorf("etcd key %s: %w", ck, err)
	}
	if c.LocalUID != "" {
		if err := o.n.store.DeleteCopy(ctx, op.Name, c.LocalUID); err != nil {
			return fmt.Errorf("undo clone %s: %w", op.Name, err)
		}
	}
	// A delete: after an unknown outcome (ErrUnknownOutcome, an error to
	// the caller) the unclone again finds the record gone or deletes it.
	if _, err := o.n.commit(ctx, txnSpec{If: []clientv3.Cmp{clientv3.Compare(clientv3.CreateRevision(vk), "=", 0)},
		Then: []clientv3.Op{clientv3.OpDelete(ck)}}); err != nil {
		return fmt.Errorf("undo clone %s: remove the copy record: %w", op.Name, err)
	}
	return nil
}

// PlaceClone places spec, a clone whose every copy is made (the primary's:
// localUID; the others': their copy records, written by applyClone), on
// copies, with this node as its primary at term 1 and every copy in sync:
// one Txn that needs the name free, every other copy recorded, and this
// node's lease. A name placed meanwhile is ErrVolumeExists. A clone of a
// tenant (spec.Tenant) is charged to its usage in the same Txn, as
// CreateCharged does: charge.Admit refuses past a quota.
func (vs Volumes) PlaceClone(ctx context.Context, spec api.VolumeSpec, uid, key, localUID string, copies []string, charge Charge) (Placement, error) {
	s := vs.n.session()
	if s == nil || !vs.n.up.Load() {
		return Placement{}, fmt.Errorf("place clone %q: %w", spec.Name, ErrNoSession)
	}
	me := vs.n.cfg.NodeName
	rec := volumeRecord{UID: uid, Spec: spec, IdempotencyKey: key, Copies: copies, Primary: me, Term: 1,
		InSync: copies, CreatedAt: time.Now().UTC()}
	vk := vs.n.key("volumes", spec.Name)
	cmps := []clientv3.Cmp{clientv3.Compare(clientv3.CreateRevision(vk), "=", 0),
		clientv3.Compare(clientv3.LeaseValue(vs.n.key("alive", me)), "=", s.Lease())}
	for _, c := range copies {
		if c != me {
			cmps = append(cmps, clientv3.Compare(clientv3.CreateRevision(vs.n.key("copies", spec.Name, c)), ">", 0))
		}
	}
	mine := copyRecord{State: CopyInSync, LocalUID: localUID, Term: 1, UpdatedAt: time.Now().UTC()}
	var resp *clientv3.TxnResponse
	for {
		cmps, ops := cmps, []clientv3.Op{clientv3.OpPut(vs.n.key("copies", spec.Name, me), mustJSON(mine))}
		var urev int64
		if spec.Tenant != "" {
			used, rev, err := vs.readUsage(ctx, spec.Tenant)
			if err != nil {
				return Placement{}, fmt.Errorf("place clone %q: %w", spec.Name, err)
			}
			if charge.Admit != nil {
				if err := charge.Admit(used); err != nil {
					return Placement{}, fmt.Errorf("place clone %q: %w", spec.Name, err)
				}
			}
			add := charge.Add
			rec.Charge, urev = &add, rev
			cmps = append(cmps, vs.usageUnchanged(spec.Tenant, rev))
			ops = append(ops, clientv3.OpPut(vs.usageKey(spec.Tenant), mustJSON(used.plus(add))))
		}
		// An unknown outcome is learnt (commitLearning): a try again
		// finds the name placed, by this call if the record is ours (its
		// UID), which is success, not ErrVolumeExists. Left unknown, it
		// is ErrUnknownOutcome: the caller's undo leaves a placed clone
		// alone (applyUnclone), and the user's retry with its idempotency
		// key finds it.
		var err error
		var tried bool
		resp, tried, err = vs.n.commitLearning(ctx, "place clone", txnSpec{If: cmps,
			Then: append(ops, clientv3.OpPut(vk, mustJSON(rec))), Else: []clientv3.Op{clientv3.OpGet(vk)}})
		if err != nil {
			return Placement{}, fmt.Errorf("place clone %q: %w", spec.Name, err)
		}
		if !resp.Succeeded && tried && recordedUID(resp, uid) {
			resp.Succeeded = true // placed by the try whose answer was lost
		}
		if resp.Succeeded || spec.Tenant == "" {
			break
		}
		// The tenant's usage changed meanwhile (another create): admit
		// again on the new one; anything else refuses below.
		if _, rev, err := vs.readUsage(ctx, spec.Tenant); err != nil || rev == urev {
			break
		}
	}
	if !resp.Succeeded {
		return Placement{}, fmt.Errorf("place clone %q: the name was placed meanwhile, a copy's record is missing, "+
			"or this node lost its lease: %w", spec.Name, ErrVolumeExists)
	}
	vs.n.log.Info("clone placed", "volume", spec.Name, "copies", copies, "primary", me, "term", 1)
	p, ok, err := vs.Placement(ctx, spec.Name)
	if err != nil || !ok {
		return toPlacement(spec.Name, rec, nil), nil
	}
	return p, nil
}

// recordedUID says whether the first response of resp (a Get of a volume
// record) is a record of uid.
func recordedUID(resp *clientv3.TxnResponse, uid string) bool {
	kvs := resp.Responses[0].GetResponseRange().GetKvs()
	if len(kvs) == 0 {
		return false
	}
	var rec volumeRecord
	return json.Unmarshal(kvs[0].Value, &rec) == nil && rec.UID == uid
}
