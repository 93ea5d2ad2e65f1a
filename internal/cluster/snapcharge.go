package cluster

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// Snapshots of a tenant's volumes count in its usage (Usage.Snapshots):
// "snapcharges/<volume>" holds how many of the volume's snapshots are
// counted, and changes only in the Txn that changes the tenant's usage by
// as much; the removal of the volume's record gives them back
// (removeRecord). docs/security.md, "Tenants on a cluster".

func (vs Volumes) snapChargeKey(volume string) string { return vs.n.key("snapcharges", volume) }

// ChargeSnapshots adds delta (one new snapshot: 1; one deleted: -1) to the
// snapshots counted for volume and its tenant, in one Txn that needs the
// volume placed and the usage admit saw (admit: nil for no quota; called
// for a positive delta with the tenant's usage before it, it refuses with
// an error naming the quota). A volume without a tenant counts nothing.
// The count never goes below zero: a snapshot made before it was counted
// gives nothing back.
func (vs Volumes) ChargeSnapshots(ctx context.Context, volume string, delta int64, admit func(Usage) error) error {
	vk, sk := vs.n.key("volumes", volume), vs.snapChargeKey(volume)
	for {
		resp, err := vs.n.cli.Txn(ctx).Then(clientv3.OpGet(vk), clientv3.OpGet(sk)).Commit() // a read: changes nothing
		if err != nil {
			return fmt.Errorf("count snapshots of %q: %w", volume, err)
		}
		vkv := resp.Responses[0].GetResponseRange().Kvs
		if len(vkv) == 0 {
			return fmt.Errorf("count snapshots of %q: %w", volume, ErrVolumeNotFound)
		}
		var rec volumeRecord
		if err := json.Unmarshal(vkv[0].Value, &rec); err != nil {
			return fmt.Errorf("etcd key %s: %w", vk, err)
		}
		tenant := rec.Spec.Tenant
		if tenant == "" {
			return nil
		}
		var count, srev int64
		if skv := resp.Responses[1].GetResponseRange().Kvs; len(skv) > 0 {
			srev = skv[0].ModRevision
			if count, err = strconv.ParseInt(string(skv[0].Value), 10, 64); err != nil {
				return fmt.Errorf("etcd key %s: %w", sk, err)
			}
		}
		d := max(delta, -count)
		if d == 0 {
			return nil
		}
		used, urev, err := vs.readUsage(ctx, tenant)
		if err != nil {
			return fmt.Errorf("count snapshots of %q: %w", volume, err)
		}
		if d > 0 && admit != nil {
			if err := admit(used); err != nil {
				return fmt.Errorf("snapshot of %q: %w", volume, err)
			}
		}
		cmps := []clientv3.Cmp{vs.usageUnchanged(tenant, urev), clientv3.Compare(clientv3.ModRevision(vk), "=", vkv[0].ModRevision)}
		if srev == 0 {
			cmps = append(cmps, clientv3.Compare(clientv3.CreateRevision(sk), "=", 0))
		} else {
			cmps = append(cmps, clientv3.Compare(clientv3.ModRevision(sk), "=", srev))
		}
		ops := []clientv3.Op{clientv3.OpPut(vs.usageKey(tenant), mustJSON(used.plus(Usage{Snapshots: d})))}
		if count+d == 0 {
			ops = append(ops, clientv3.OpDelete(sk))
		} else {
			ops = append(ops, clientv3.OpPut(sk, strconv.FormatInt(count+d, 10)))
		}
		// An unknown outcome (ErrUnknownOutcome) is an error to the
		// caller (503), never a round again here: if it applied, another
		// round would count the snapshot twice.
		put, err := vs.n.commit(ctx, txnSpec{If: cmps, Then: ops})
		if err != nil {
			return fmt.Errorf("count snapshots of %q: %w", volume, err)
		}
		if put.Succeeded {
			return nil
		}
		// The usage, the count or the record changed meanwhile: again.
	}
}

// snapCharge returns the snapshots counted for volume and the key's mod
// revision (0: none).
func (vs Volumes) snapCharge(ctx context.Context, volume string) (int64, int64, error) {
	sk := vs.snapChargeKey(volume)
	resp, err := vs.n.cli.Get(ctx, sk)
	if err != nil || len(resp.Kvs) == 0 {
		return 0, 0, err
	}
	c, err := strconv.ParseInt(string(resp.Kvs[0].Value), 10, 64)
	if err != nil {
		return 0, 0, fmt.Errorf("etcd key %s: %w", sk, err)
	}
	return c, resp.Kvs[0].ModRevision, nil
}
