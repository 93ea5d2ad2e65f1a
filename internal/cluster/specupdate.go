package cluster

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/quiverstorage/quiver/internal/api"
)

// SpecChange is a change of a placed volume's capacity, QoS or labels
// (PATCH /v1/volumes/{volume}) as etcd records it.
type SpecChange struct {
	Update api.VolumeUpdate
	// Charge is what the volume counts in its tenant's usage with a spec:
	// the record's charge becomes Charge of the new spec, and the usage
	// changes by the difference.
	Charge func(api.VolumeSpec) Usage
	// Admit, when not nil, is called with the tenant's usage before the
	// change when the charge grows, and refuses with an error that names
	// the quota.
	Admit func(used Usage) error
}

// UpdateSpec records ch in the volume's record (its spec, read by the
// nodes without a copy, and by copies made or conformed later) and, for a
// tenant's volume whose creation was counted, the new charge in the
// tenant's usage, in one Txn that needs the record and the usage as read.
// It returns the spec before the change, for an undo. Only the spec
// changes: the copies' manifests are their primary's to change, at the cut.
func (vs Volumes) UpdateSpec(ctx context.Context, volume string, ch SpecChange) (api.VolumeSpec, error) {
	vk := vs.n.key("volumes", volume)
	for {
		resp, err := vs.n.cli.Get(ctx, vk)
		if err != nil {
			return api.VolumeSpec{}, fmt.Errorf("record the update of %q: %w", volume, err)
		}
		if len(resp.Kvs) == 0 {
			return api.VolumeSpec{}, fmt.Errorf("record the update of %q: %w", volume, ErrVolumeNotFound)
		}
		var rec volumeRecord
		if err := json.Unmarshal(resp.Kvs[0].Value, &rec); err != nil {
			return api.VolumeSpec{}, fmt.Errorf("etcd key %s: %w", vk, err)
		}
		if rec.State == volumeDeleting {
			return api.VolumeSpec{}, fmt.Errorf("update %q: the volume is being deleted: %w", volume, ErrVolumeNotFound)
		}
		prev := rec.Spec
		rec.Spec = applySpecUpdate(rec.Spec, ch.Update)
		cmps := []clientv3.Cmp{clientv3.Compare(clientv3.ModRevision(vk), "=", resp.Kvs[0].ModRevision)}
		var ops []clientv3.Op
		if tenant := rec.Spec.Tenant; tenant != "" && rec.Charge != nil && ch.Charge != nil {
			after := ch.Charge(rec.Spec)
			delta := after.minus(*rec.Charge)
			used, urev, err := vs.readUsage(ctx, tenant)
			if err != nil {
				return api.VolumeSpec{}, fmt.Errorf("record the update of %q: %w", volume, err)
			}
			if ch.Admit != nil && (delta.Capacity > 0 || delta.IOPS > 0 || delta.NoIOPSLimit > 0) {
				if err := ch.Admit(used); err != nil {
					return api.VolumeSpec{}, fmt.Errorf("update %q: %w", volume, err)
				}
			}
			rec.Charge = &after
			cmps = append(cmps, vs.usageUnchanged(tenant, urev))
			ops = append(ops, clientv3.OpPut(vs.usageKey(tenant), mustJSON(used.plus(delta))))
		}
		ops = append(ops, clientv3.OpPut(vk, mustJSON(rec)))
		// An unknown outcome (ErrUnknownOutcome) is an error to the
		// caller (503), never a round again here: if it applied, that
		// round would return this change's spec as the one before it, and
		// the caller's undo would keep the change. The user's update again
		// sets the same spec, and changes the usage by nothing once the
		// record's charge is the new spec's.
		put, err := vs.n.commit(ctx, txnSpec{If: cmps, Then: ops})
		if err != nil {
			return api.VolumeSpec{}, fmt.Errorf("record the update of %q: %w", volume, err)
		}
		if put.Succeeded {
			return prev, nil
		}
		// The record or the usage changed meanwhile: again.
	}
}

// applySpecUpdate is spec with u applied: a capacity, labels (an empty map
// removes them all) and QoS limits (all replaced; none removes them) when
// given.
func applySpecUpdate(spec api.VolumeSpec, u api.VolumeUpdate) api.VolumeSpec {
	if u.Capacity != nil {
		spec.Capacity = *u.Capacity
	}
	if u.Labels != nil {
		spec.Labels = maps.Clone(u.Labels)
		if len(spec.Labels) == 0 {
			spec.Labels = nil
		}
	}
	if u.QoS != nil {
		q := *u.QoS
		spec.QoS = &q
		if q == (api.QoS{}) {
			spec.QoS = nil
		}
	}
	return spec
}

// UpdateOf is the update that makes a volume's capacity, labels and QoS
// those of spec (an undo of UpdateSpec, or what a conformed copy takes).
func UpdateOf(spec api.VolumeSpec) api.VolumeUpdate {
	capacity := spec.Capacity
	u := api.VolumeUpdate{Capacity: &capacity, Labels: maps.Clone(spec.Labels), QoS: &api.QoS{}}
	if u.Labels == nil {
		u.Labels = map[string]string{}
	}
	if spec.QoS != nil {
		*u.QoS = *spec.QoS
	}
	return u
}
