package replicated

import (
	"context"
	"crypto/rand"
	"encoding/hex"
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
func (r *Volumes) Clone(ctx context.Context, h *pool.CloneHold, req pool.CloneRequest,
	charge func(api.VolumeSpec) cluster.Charge, prog pool.Progress) ([]pool.VolumeInfo, error) {
	defer h.Release()
	volume := req.Source.Volume
	what := "clone " + req.Source.String()
	src, ok, err := r.node.Volumes().Placement(ctx, volume)
	if err != nil {
		return nil, err
	}
	if !ok {
		return nil, fmt.Errorf("%s: %w", what, cluster.ErrVolumeNotFound)
	}
	fresh := map[string]bool{}
	for _, name := range req.Names {
		_, placed, err := r.node.Volumes().Placement(ctx, name)
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
		uids := map[string]string{}
		var ops []cluster.Op
		for _, name := range req.Names {
			if fresh[name] {
				var b [12]byte
				_, _ = rand.Read(b[:])
				uids[name] = hex.EncodeToString(b[:])
				ops = append(ops, cluster.Op{Kind: cluster.OpClone, Name: name, UID: uids[name],
					Snapshot: req.Source.Snapshot, SnapshotUID: snapUID, Labels: req.Labels, Nodes: cs.nodes})
			}
		}
		if len(ops) == 0 { // every name a placed clone: the pool answers
			made, err := h.Clone(ctx, prog)
			out = made
			return err
		}
		return r.intended(ctx, volume, cs, ops, func() error {
			var err error
			out, err = r.cloneAtCut(ctx, h, volume, what, cs, ops, src, req, charge, prog)
			return err
		})
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// cloneAtCut makes the clones of ops here, then on every in-sync copy, then
// places each; a failure leaves the unplaced ones to the intent's undo
// (errIntentOpen), which intended runs at once, the Sets still frozen.
func (r *Volumes) cloneAtCut(ctx context.Context, h *pool.CloneHold, volume, what string, cs *cutState,
	ops []cluster.Op, src cluster.Placement, req pool.CloneRequest, charge func(api.VolumeSpec) cluster.Charge,
	prog pool.Progress) ([]pool.VolumeInfo, error) {
	made, err := h.Clone(ctx, prog)
	if err != nil {
		return nil, intentOpen(err) // some may be made
	}
	uids := map[string]string{}
	for _, op := range ops {
		uids[op.Name] = op.UID
		if err := r.node.Ops().RunOp(ctx, volume, cs.role.Term, op); err != nil {
			return nil, intentOpen(fmt.Errorf("%s to %s: a copy could not clone it; undone on every node: %w: %w", what,
				op.Name, cluster.ErrCopyFailed, err))
		}
	}
	r.crashPoint("clone:after-copies")
	copies := append([]string{r.node.Name()}, cs.nodes...)
	for _, m := range made {
		uid, fresh := uids[m.Name]
		if !fresh {
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
		if _, err := r.node.Volumes().PlaceClone(ctx, spec, uid, req.Idempotency.Key, m.UID, copies, ch); err != nil {
			// The clones placed before this one stay: each is whole.
			return nil, intentOpen(fmt.Errorf("%s to %s: undone on every node: %w", what, m.Name, err))
		}
	}
	r.log.Info("clone made on every copy", "volume", volume, "snapshot", req.Source.Snapshot, "clones", len(made),
		"copies", copies)
	return made, nil
}
