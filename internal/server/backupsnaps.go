package server

import (
	"context"

	"github.com/quiverstorage/quiver/internal/backup"
	"github.com/quiverstorage/quiver/internal/cluster"
	"github.com/quiverstorage/quiver/internal/pool"
	"github.com/quiverstorage/quiver/internal/replicated"
)

// clusterSnapshots takes a backup's snapshots on a cluster node: a volume
// with more than one copy through its primary (this node: the API carries
// a backup there), on every copy at one cut, so that every copy keeps the
// backup's base and the change tracking of any later primary can answer
// the next delta; any other volume in the pool alone.
type clusterSnapshots struct {
	node  *cluster.Node
	vols  *replicated.Volumes
	local backup.Snapshots
}

var _ backup.Snapshots = clusterSnapshots{}

func (c clusterSnapshots) replicated(ctx context.Context, volume string) (bool, error) {
	role, err := c.node.Primaries().Role(ctx, volume)
	if err != nil {
		return false, err
	}
	return role.Placed && role.Replicas > 1, nil
}

func (c clusterSnapshots) Snapshot(ctx context.Context, volume, name string) (pool.SnapshotInfo, error) {
	rep, err := c.replicated(ctx, volume)
	if err != nil {
		return pool.SnapshotInfo{}, err
	}
	if !rep {
		return c.local.Snapshot(ctx, volume, name)
	}
	info, _, err := c.vols.Snapshot(ctx, volume, name, pool.Idempotency{}, nil)
	return info, err
}

func (c clusterSnapshots) DeleteSnapshot(ctx context.Context, volume, name string) error {
	rep, err := c.replicated(ctx, volume)
	if err != nil {
		return err
	}
	if !rep {
		return c.local.DeleteSnapshot(ctx, volume, name)
	}
	return c.vols.DeleteSnapshot(ctx, volume, name)
}
