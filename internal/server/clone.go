package server

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"

	"github.com/quiverstorage/quiver/internal/api"
	"github.com/quiverstorage/quiver/internal/cluster"
	"github.com/quiverstorage/quiver/internal/pool"
)

// Clone clones a replicated volume this node is the primary of (its live
// disks, or one of its snapshots) onto the same nodes, at one cut
// (docs/cluster.md, "Clones"): with every disk's Set frozen, this node
// clones its copy (the pool's clone: reflink where the filesystem has it),
// then every in-sync copy clones its own (OpClone) and records its copy of
// the clone; then each clone is placed in etcd on those nodes, this node
// its primary at term 1, every copy in sync. A copy that fails undoes the
// clones everywhere (OpUnclone, and the local ones deleted) and the
// request fails (cluster.ErrCopyFailed) with nothing left behind. A clone
// of a tenant's volume is the tenant's, charged to its usage when it is
// placed (charge, nil for none): one past a quota is undone the same way. A
// volume with a copy out of sync is refused (cluster.ErrDegraded). Each
// clone is durable on every copy when it returns. h is the pool's hold of
// the request (source and names), released on return; a name that is a
// clone of the same source placed already (an idempotent retry) is
// answered as it is.
func (r *replicaSets) Clone(ctx context.Context, h *pool.CloneHold, req pool.CloneRequest,
	charge func(api.VolumeSpec) cluster.Charge, prog pool.Progress) ([]pool.VolumeInfo, error) {
	defer h.Release()
	volume := req.Source.Volume
	what := "clone " + req.Source.String()
	src, ok, err := r.node.Placement(ctx, volume)
	if err != nil {
		return nil, err
	}
	if !ok {
		return nil, fmt.Errorf("%s: %w", what, cluster.ErrVolumeNotFound)
	}
	fresh := map[string]bool{}
	for _, name := range req.Names {
		_, placed, err := r.node.Placement(ctx, name)
		if err != nil {
			return nil, err
		}
		_, lerr := r.pool.Volume(name)
		switch local := lerr == nil; {
		case !placed && !local:
			fresh[name] = true
		case placed && !local:
			return nil, fmt.Errorf("%s: volume %q is placed on other nodes of the cluster; pick another name: %w",
				what, name, cluster.ErrVolumeExists)
		case !placed && local:
			return nil, fmt.Errorf("%s: volume %q exists on this node but is not placed in the cluster; delete it "+
				"first: %w", what, name, pool.ErrExists)
		}
		// placed and here: the pool's hold checked it is a clone of this
		// source that the request's idempotency allows.
	}
	var out []pool.VolumeInfo
	err = r.atCut(ctx, volume, what, nil, func(ctx context.Context, cs *cutState) error {
		var snapUID string
		if req.Source.Snapshot != "" {
			v, err := r.pool.Volume(volume)
			if err != nil {
				return err
			}
			snap, err := v.Snapshot(req.Source.Snapshot)
			if err != nil {
				return err
			}
			snapUID = snap.UID
		}
		made, err := h.Clone(ctx, prog)
		if err != nil {
			r.undoClones(volume, cs, fresh, nil)
			return err
		}
		uids := map[string]string{}
		for _, m := range made {
			if fresh[m.Name] {
				var b [12]byte
				_, _ = rand.Read(b[:])
				uids[m.Name] = hex.EncodeToString(b[:])
			}
		}
		for _, m := range made {
			if !fresh[m.Name] {
				continue
			}
			op := cluster.Op{Kind: cluster.OpClone, Name: m.Name, UID: uids[m.Name], Snapshot: req.Source.Snapshot,
				SnapshotUID: snapUID, Labels: req.Labels, Nodes: cs.nodes}
			if err := r.node.RunOp(ctx, volume, cs.role.Term, op); err != nil {
				r.undoClones(volume, cs, fresh, uids)
				return fmt.Errorf("%s to %s: a copy could not clone it; undone on every node: %w: %w", what, m.Name,
					cluster.ErrCopyFailed, err)
			}
		}
		copies := append([]string{r.node.Name()}, cs.nodes...)
		for i, m := range made {
			if !fresh[m.Name] {
				continue
			}
			spec := api.VolumeSpec{Name: m.Name, Capacity: m.Capacity, Labels: m.Labels, QoS: src.Spec.QoS,
				Replicas: src.Spec.Replicas, Tenant: src.Spec.Tenant}
			for _, d := range m.Disks {
				spec.Disks = append(spec.Disks, api.DiskSpec{Name: d.Name, Size: d.Size, Shared: d.Shared})
			}
			var ch cluster.Charge
			if charge != nil {
				ch = charge(spec)
			}
			if _, err := r.node.PlaceClone(ctx, spec, uids[m.Name], req.Idempotency.Key, m.UID, copies, ch); err != nil {
				// The clones placed before this one stay: each is whole.
				left := map[string]bool{}
				for _, n := range made[i:] {
					left[n.Name] = fresh[n.Name]
				}
				r.undoClones(volume, cs, left, uids)
				return fmt.Errorf("%s to %s: undone on every node: %w", what, m.Name, err)
			}
			delete(fresh, m.Name)
		}
		out = made
		r.log.Info("clone made on every copy", "volume", volume, "snapshot", req.Source.Snapshot, "clones", len(made),
			"copies", copies)
		return nil
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// undoClones deletes the clones in names (those marked true) on the copies
// (OpUnclone, for the ones with a cluster UID in uids) and here. It runs
// at the cut, after a failure: what it cannot undo is logged with the
// clone's name for an operator.
func (r *replicaSets) undoClones(volume string, cs *cutState, names map[string]bool, uids map[string]string) {
	ctx := context.Background()
	for name, ours := range names {
		if !ours {
			continue
		}
		var errs error
		if uid, sent := uids[name]; sent && len(cs.nodes) > 0 {
			op := cluster.Op{Kind: cluster.OpUnclone, Name: name, UID: uid, Nodes: cs.nodes}
			errs = r.node.RunOp(ctx, volume, cs.role.Term, op)
		}
		v, err := r.pool.Volume(name)
		if err == nil && v.Info().Source != nil && v.Info().Source.Volume == volume {
			errs = errors.Join(errs, r.pool.Delete(ctx, name))
		}
		if errs != nil {
			r.log.Error("undo a clone the copies did not all make: delete it by hand", "volume", volume, "clone", name,
				"err", errs)
		}
	}
}
