package replicated

import (
	"context"
	"errors"
	"fmt"

	"github.com/quiverstorage/quiver/internal/api"
	"github.com/quiverstorage/quiver/internal/cluster"
	"github.com/quiverstorage/quiver/internal/pool"
	"github.com/quiverstorage/quiver/internal/qos"
)

// applyCutOp applies to this node's copy a change its primary made to its
// own at the cut (cut.go), while the primary holds every disk's Set frozen:
// no write reaches this copy meanwhile. The only writer of a copy is its
// primary, which checked its own clients' writers: the copy's changes are
// forced past the primary's replication attachment. Each is durable on
// return (the pool's contract) and answers the same when applied again.
func applyCutOp(ctx context.Context, v *pool.Volume, op cluster.Op) error {
	switch op.Kind {
	case cluster.OpCheckSnapshot, cluster.OpRollback:
		snap, err := v.Snapshot(op.Name)
		if err != nil {
			return fmt.Errorf("this copy lacks it: %w", err)
		}
		if snap.UID != op.UID {
			return fmt.Errorf("snapshot %s@%s here is %s, not the primary's %s: %w", v.Name(), op.Name, snap.UID, op.UID,
				cluster.ErrCopyMismatch)
		}
		if op.Kind == cluster.OpCheckSnapshot {
			return nil
		}
		_, err = v.RollbackWith(ctx, op.Name, true, nil)
		return err
	case cluster.OpAddDisk, cluster.OpGrowDisk, cluster.OpRemoveDisk:
		if op.Disk == nil {
			return fmt.Errorf("operation %q without a disk", op.Kind)
		}
		if err := growCapacity(ctx, v, op.Capacity); err != nil {
			return err
		}
		d := pool.DiskSpec{Name: op.Disk.Name, Size: op.Disk.Size, Shared: op.Disk.Shared}
		var err error
		switch op.Kind {
		case cluster.OpAddDisk:
			_, err = v.AddDiskWith(ctx, d, pool.Idempotency{SameSpec: true})
		case cluster.OpGrowDisk:
			_, err = v.GrowDisk(ctx, d.Name, d.Size)
		default:
			if _, err = v.RemoveDiskWith(ctx, d.Name, true); errors.Is(err, pool.ErrDiskNotFound) {
				err = nil
			}
		}
		return err
	case cluster.OpConformDisks:
		return conformDisks(ctx, v, op)
	case cluster.OpUpdate:
		if op.Update == nil {
			return fmt.Errorf("operation %q without an update", op.Kind)
		}
		return applyUpdate(ctx, v, op.Update)
	}
	return fmt.Errorf("operation %q: %w", op.Kind, cluster.ErrNotSupported)
}

// growCapacity grows the copy's volume capacity to the primary's.
func growCapacity(ctx context.Context, v *pool.Volume, capacity int64) error {
	if capacity <= v.Info().Capacity {
		return nil
	}
	_, err := v.Update(ctx, pool.Update{Capacity: &capacity})
	return err
}

// applyUpdate gives the copy the primary's capacity, labels and QoS limits
// as u has them (each when given). The capacity only grows: a copy that
// holds more keeps it, as growCapacity does.
func applyUpdate(ctx context.Context, v *pool.Volume, u *api.VolumeUpdate) error {
	upd := pool.Update{Labels: u.Labels}
	if u.Capacity != nil && *u.Capacity > v.Info().Capacity {
		c := *u.Capacity
		upd.Capacity = &c
	}
	if u.QoS != nil {
		q := qos.Limits(*u.QoS)
		upd.QoS = &q
	}
	if upd.Capacity == nil && upd.Labels == nil && upd.QoS == nil {
		return nil
	}
	_, err := v.Update(ctx, upd)
	return err
}

// conformDisks makes the copy's disk set the primary's (op.Disks) before a
// resync copies it whole (resync.go): a copy that missed a change of the
// disks at the cut (it failed it, or was out of sync) gets every disk of
// the primary's size. A disk here that is not there, or larger, is
// removed (and made again empty): its data is about to be overwritten.
func conformDisks(ctx context.Context, v *pool.Volume, op cluster.Op) error {
	if err := growCapacity(ctx, v, op.Capacity); err != nil {
		return err
	}
	if op.Update != nil { // the primary's labels and QoS, which it may have missed too
		if err := applyUpdate(ctx, v, op.Update); err != nil {
			return fmt.Errorf("conform the volume's settings: %w", err)
		}
	}
	want := map[string]pool.DiskSpec{}
	for _, d := range op.Disks {
		want[d.Name] = pool.DiskSpec{Name: d.Name, Size: d.Size, Shared: d.Shared}
	}
	have := map[string]pool.DiskInfo{}
	for _, d := range v.Info().Disks {
		have[d.Name] = d
		if w, ok := want[d.Name]; !ok || d.Size > w.Size || d.Shared != w.Shared {
			if _, err := v.RemoveDiskWith(ctx, d.Name, true); err != nil {
				return fmt.Errorf("conform disk %s: %w", d.Name, err)
			}
			delete(have, d.Name)
		}
	}
	for _, d := range op.Disks {
		h, ok := have[d.Name]
		var err error
		switch {
		case !ok:
			_, err = v.AddDiskWith(ctx, want[d.Name], pool.Idempotency{SameSpec: true})
		case h.Size < d.Size:
			_, err = v.GrowDisk(ctx, d.Name, d.Size)
		}
		if err != nil {
			return fmt.Errorf("conform disk %s: %w", d.Name, err)
		}
	}
	return nil
}
