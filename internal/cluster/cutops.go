package cluster

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/quiverstorage/quiver/internal/api"
)

// UpdateDisks records the volume's disk set (and capacity) in its spec in
// etcd, as the primary at term holding its lease, after every in-sync copy
// changed its disks at one cut: a copy made or rebuilt later, and a resync
// that conforms a diverged copy, follow the spec.
func (vs Volumes) UpdateDisks(ctx context.Context, volume string, term uint64, capacity int64, disks []api.DiskSpec) error {
	s := vs.n.session()
	if s == nil || !vs.n.up.Load() {
		return fmt.Errorf("record the disks of %q: %w", volume, ErrNoSession)
	}
	var err error
	for range 3 { // the record may change meanwhile (a copy recorded out of sync)
		if err = vs.updateDisks(ctx, s.Lease(), volume, term, capacity, disks); !errors.Is(err, errChanged) {
			return err
		}
	}
	return err
}

var errChanged = errors.New("the volume record changed meanwhile, or this node lost its lease")

func (vs Volumes) updateDisks(ctx context.Context, lease clientv3.LeaseID, volume string, term uint64, capacity int64,
	disks []api.DiskSpec) error {
	vk, ak := vs.n.key("volumes", volume), vs.n.key("alive", vs.n.cfg.NodeName)
	resp, err := vs.n.cli.Get(ctx, vk)
	if err != nil {
		return fmt.Errorf("record the disks of %q: %w", volume, err)
	}
	if len(resp.Kvs) == 0 {
		return fmt.Errorf("record the disks of %q: %w", volume, ErrVolumeNotFound)
	}
	var rec volumeRecord
	if err := json.Unmarshal(resp.Kvs[0].Value, &rec); err != nil {
		return err
	}
	if rec.Primary != vs.n.cfg.NodeName || rec.Term != term {
		return fmt.Errorf("record the disks of %q: this node is not the primary at term %d (primary %s, term %d): %w",
			volume, term, rec.Primary, rec.Term, ErrNotPrimary)
	}
	rec.Spec.Disks = append([]api.DiskSpec{}, disks...)
	rec.Spec.Capacity = max(rec.Spec.Capacity, capacity)
	// An unknown outcome (ErrUnknownOutcome) is an error to the caller:
	// the change at the cut keeps its intent open, and settling it records
	// the same disks again (writing them twice is no change).
	put, err := vs.n.commit(ctx, txnSpec{
		If: []clientv3.Cmp{clientv3.Compare(clientv3.ModRevision(vk), "=", resp.Kvs[0].ModRevision),
			clientv3.Compare(clientv3.LeaseValue(ak), "=", lease)},
		Then: []clientv3.Op{clientv3.OpPut(vk, mustJSON(rec))}})
	if err != nil {
		return fmt.Errorf("record the disks of %q: %w", volume, err)
	}
	if !put.Succeeded {
		return fmt.Errorf("record the disks of %q: %w: %w", volume, errChanged, ErrNoSession)
	}
	return nil
}
