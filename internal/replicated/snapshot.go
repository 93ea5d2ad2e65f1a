package replicated

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"

	"github.com/quiverstorage/quiver/internal/cluster"
	"github.com/quiverstorage/quiver/internal/pool"
)

// Snapshot takes a snapshot of a replicated volume this node is the primary
// of, at the same cut on every copy (docs/cluster.md): with every disk's
// Set frozen (no change in flight, none applied anywhere until the end) it
// snapshots the local copy and has each in-sync copy take the snapshot
// with the same name and UID. A copy that fails undoes it everywhere. A
// volume with a copy out of sync is refused (ErrDegraded): its snapshot
// would be missing there.
func (r *Volumes) Snapshot(ctx context.Context, volume, name string, idem pool.Idempotency,
	prog pool.Progress) (pool.SnapshotInfo, bool, error) {
	v, err := r.pool.Volume(volume)
	if err != nil {
		return pool.SnapshotInfo{}, false, err
	}
	if _, err := v.Snapshot(name); err == nil {
		// There already: the pool answers (a retry, or ErrExists).
		return v.CreateSnapshotWith(ctx, name, idem, prog)
	}
	var info pool.SnapshotInfo
	var created bool
	err = r.atCut(ctx, volume, "snapshot "+volume+"@"+name, nil, func(ctx context.Context, cs *cutState) error {
		var b [12]byte
		_, _ = rand.Read(b[:])
		idem.UID = hex.EncodeToString(b[:])
		op := cluster.Op{Kind: cluster.OpSnapshot, Name: name, UID: idem.UID, Nodes: cs.nodes}
		return r.intended(ctx, volume, cs, []cluster.Op{op}, func() error {
			var err error
			info, created, err = v.CreateSnapshotWith(ctx, name, idem, prog)
			if err != nil || !created {
				return err
			}
			r.crashPoint("snapshot:after-local")
			op.UID = info.UID
			if err := r.node.Ops().RunOp(ctx, volume, cs.role.Term, op); err != nil {
				undo := cluster.Op{Kind: cluster.OpDeleteSnapshot, Name: name, UID: info.UID, Nodes: cs.nodes}
				uerr := errors.Join(v.DeleteSnapshot(context.Background(), name), r.node.Ops().RunOp(context.Background(), volume, cs.role.Term, undo))
				if uerr != nil {
					r.log.Error("undo a snapshot the copies did not all take", "volume", volume, "snapshot", name, "err", uerr)
					return intentOpen(err)
				}
				return err
			}
			r.log.Info("snapshot taken on every copy", "volume", volume, "snapshot", name, "uid", info.UID, "copies", cs.nodes)
			return nil
		})
	})
	if err != nil {
		return pool.SnapshotInfo{}, false, err
	}
	return info, created, nil
}

// DeleteSnapshot deletes a snapshot of a replicated volume here and on
// every in-sync copy. A copy out of sync keeps it until it is deleted
// there (docs/cluster.md).
func (r *Volumes) DeleteSnapshot(ctx context.Context, volume, name string) error {
	v, err := r.pool.Volume(volume)
	if err != nil {
		return err
	}
	snap, err := v.Snapshot(name)
	if err != nil {
		return err
	}
	role, err := r.node.Primaries().Role(ctx, volume)
	if err != nil {
		return err
	}
	if err := v.DeleteSnapshot(ctx, name); err != nil {
		return err
	}
	nodes := make([]string, 0, len(role.Targets))
	for _, t := range role.Targets {
		nodes = append(nodes, t.Node)
	}
	return r.node.Ops().RunOp(ctx, volume, role.Term, cluster.Op{Kind: cluster.OpDeleteSnapshot, Name: name, UID: snap.UID, Nodes: nodes})
}

// primaryRole reads this node's role for volume and refuses unless it is
// the primary with every copy in sync.
func (r *Volumes) primaryRole(ctx context.Context, volume, what string) (cluster.Role, error) {
	role, err := r.node.Primaries().Role(ctx, volume)
	if err != nil {
		return role, err
	}
	if !role.IsPrimary(r.node.Name()) {
		return role, fmt.Errorf("%s: the primary is %s: %w", what, role.Primary, cluster.ErrNotPrimary)
	}
	if len(role.Behind) > 0 {
		var out []string
		for _, b := range role.Behind {
			out = append(out, b.Node+" ("+b.State+")")
		}
		return role, fmt.Errorf("%s: the copy on %s is out of sync and would lack it; wait for its resync: %w",
			what, strings.Join(out, ", "), cluster.ErrDegraded)
	}
	return role, nil
}
