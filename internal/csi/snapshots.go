package csi

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/quiverstorage/quiver/internal/api"
	"github.com/quiverstorage/quiver/internal/client"
)

// CreateSnapshot takes a quiver whole-VM snapshot: every disk of the volume
// at one instant. The quiver snapshot name is snapshotName(name). CSI names
// snapshots across all volumes, quiver per volume, so a name already used on
// another volume is looked for (one request per volume that has snapshots)
// and refused with AlreadyExists.
func (c *controller) CreateSnapshot(ctx context.Context, req *csi.CreateSnapshotRequest) (*csi.CreateSnapshotResponse, error) {
	if err := checkName("name", req.GetName()); err != nil {
		return nil, err
	}
	if err := required("source_volume_id", req.GetSourceVolumeId()); err != nil {
		return nil, err
	}
	for _, key := range slices.Sorted(maps.Keys(req.GetParameters())) {
		if !strings.HasPrefix(key, reservedPrefix) {
			return nil, fmt.Errorf("unknown snapshot parameter %q (the quiver plugin takes none): %w", key, ErrInvalid)
		}
	}
	volume, err := parseVolumeID("source_volume_id", req.GetSourceVolumeId())
	if err != nil {
		return nil, err
	}
	qc, unlock, err := c.d.lockedClient(req.GetSecrets(), volume)
	if err != nil {
		return nil, err
	}
	defer unlock()
	snap := snapshotName(req.GetName())

	s, err := qc.GetSnapshot(ctx, volume, snap)
	if err == nil {
		return &csi.CreateSnapshotResponse{Snapshot: csiSnapshot(s)}, nil
	}
	if !client.IsNotFound(err) {
		return nil, fmt.Errorf("look up snapshot %s: %w", snapshotID(volume, snap), err)
	}
	if _, err := qc.GetVolume(ctx, volume); client.IsNotFound(err) {
		return nil, fmt.Errorf("source volume %s: %w", volume, ErrNotFound)
	} else if err != nil {
		return nil, fmt.Errorf("look up volume %s: %w", volume, err)
	}
	if other, err := c.snapshotElsewhere(ctx, qc, volume, snap); err != nil {
		return nil, err
	} else if other != "" {
		return nil, fmt.Errorf("snapshot name %q is taken by snapshot %s of another volume: %w",
			req.GetName(), snapshotID(other, snap), ErrExists)
	}
	s, err = qc.CreateSnapshot(ctx, volume, snap, requestKey("snapshot", req.GetName(), volume))
	switch {
	case client.IsConflict(err):
		return nil, fmt.Errorf("snapshot %s: %w (%v)", snapshotID(volume, snap), ErrExists, err)
	case client.IsNotFound(err):
		return nil, fmt.Errorf("source volume %s: %w", volume, ErrNotFound)
	case err != nil:
		return nil, fmt.Errorf("snapshot %s: %w", snapshotID(volume, snap), busyOr(err))
	}
	return &csi.CreateSnapshotResponse{Snapshot: csiSnapshot(s)}, nil
}

// snapshotElsewhere returns the volume other than volume that has a snapshot
// named snap, or "": one request, whatever the number of volumes.
func (c *controller) snapshotElsewhere(ctx context.Context, qc *client.Client, volume, snap string) (string, error) {
	snaps, err := qc.FindSnapshots(ctx, LabelDriver+"="+c.d.cfg.DriverName, snap)
	if err != nil {
		return "", fmt.Errorf("look up snapshot %s on other volumes: %w", snap, err)
	}
	for _, s := range snaps {
		if s.Volume != volume {
			return s.Volume, nil
		}
	}
	return "", nil
}

func csiSnapshot(s api.Snapshot) *csi.Snapshot {
	return &csi.Snapshot{
		SnapshotId:     snapshotID(s.Volume, s.Name),
		SourceVolumeId: s.Volume,
		SizeBytes:      sumDiskSizes(s.Disks),
		CreationTime:   timestamppb.New(s.CreatedAt),
		ReadyToUse:     true, // a quiver snapshot is complete when the call returns
	}
}

// DeleteSnapshot deletes one snapshot; an unknown or malformed ID is
// success.
func (c *controller) DeleteSnapshot(ctx context.Context, req *csi.DeleteSnapshotRequest) (*csi.DeleteSnapshotResponse, error) {
	volume, snap, err := parseSnapshotID("snapshot_id", req.GetSnapshotId())
	if errors.Is(err, ErrNotFound) {
		return &csi.DeleteSnapshotResponse{}, nil
	} else if err != nil {
		return nil, err
	}
	qc, unlock, err := c.d.lockedClient(req.GetSecrets(), volume)
	if err != nil {
		return nil, err
	}
	defer unlock()
	if err := qc.DeleteSnapshot(ctx, volume, snap); err != nil && !client.IsNotFound(err) {
		return nil, fmt.Errorf("delete snapshot %s: %w", req.GetSnapshotId(), busyOr(err))
	}
	return &csi.DeleteSnapshotResponse{}, nil
}

// GetSnapshot returns one snapshot.
func (c *controller) GetSnapshot(ctx context.Context, req *csi.GetSnapshotRequest) (*csi.GetSnapshotResponse, error) {
	volume, snap, err := parseSnapshotID("snapshot_id", req.GetSnapshotId())
	if err != nil {
		return nil, err
	}
	qc, err := c.d.clientFor(req.GetSecrets())
	if err != nil {
		return nil, err
	}
	s, err := qc.GetSnapshot(ctx, volume, snap)
	if client.IsNotFound(err) {
		return nil, fmt.Errorf("snapshot %s: %w", req.GetSnapshotId(), ErrNotFound)
	} else if err != nil {
		return nil, fmt.Errorf("look up snapshot %s: %w", req.GetSnapshotId(), err)
	}
	return &csi.GetSnapshotResponse{Snapshot: csiSnapshot(s)}, nil
}

// ListSnapshots lists snapshots of the volumes this plugin made (or the one
// asked for by ID or source volume), sorted by ID, a page at a time.
func (c *controller) ListSnapshots(ctx context.Context, req *csi.ListSnapshotsRequest) (*csi.ListSnapshotsResponse, error) {
	if err := checkMaxEntries(req.GetMaxEntries()); err != nil {
		return nil, err
	}
	after, err := parseToken(req.GetStartingToken(), func(id string) bool {
		_, _, err := parseSnapshotID("starting_token", id)
		return err == nil
	})
	if err != nil {
		return nil, err
	}
	qc, err := c.d.clientFor(req.GetSecrets())
	if err != nil {
		return nil, err
	}
	snaps, err := c.listSnapshots(ctx, qc, req.GetSnapshotId(), req.GetSourceVolumeId())
	if err != nil {
		return nil, err
	}
	snaps, next := page(snaps, (*csi.Snapshot).GetSnapshotId, after, req.GetMaxEntries())
	resp := &csi.ListSnapshotsResponse{NextToken: next}
	for _, s := range snaps {
		resp.Entries = append(resp.Entries, &csi.ListSnapshotsResponse_Entry{Snapshot: s})
	}
	return resp, nil
}

// listSnapshots gathers the snapshots a ListSnapshots request selects. IDs
// that cannot name a quiver snapshot or volume select nothing.
func (c *controller) listSnapshots(ctx context.Context, qc *client.Client, id, source string) ([]*csi.Snapshot, error) {
	if id != "" {
		volume, snap, err := parseSnapshotID("snapshot_id", id)
		if err != nil || (source != "" && source != volume) {
			return nil, nil
		}
		s, err := qc.GetSnapshot(ctx, volume, snap)
		if client.IsNotFound(err) {
			return nil, nil
		} else if err != nil {
			return nil, fmt.Errorf("look up snapshot %s: %w", id, err)
		}
		return []*csi.Snapshot{csiSnapshot(s)}, nil
	}
	var volumes []string
	if source != "" {
		if _, err := parseVolumeID("source_volume_id", source); err != nil {
			return nil, nil
		}
		volumes = []string{source}
	} else {
		// One request for the snapshots of every volume this plugin made:
		// on a cluster node a volume's snapshot count is its copy's, which
		// a node without a copy does not have, and the server answers this
		// from every node (docs/security.md, "Tenants on a cluster").
		snaps, err := qc.FindSnapshots(ctx, LabelDriver+"="+c.d.cfg.DriverName, "")
		if err != nil {
			return nil, fmt.Errorf("list snapshots: %w", err)
		}
		out := make([]*csi.Snapshot, 0, len(snaps))
		for _, s := range snaps {
			out = append(out, csiSnapshot(s))
		}
		return out, nil
	}
	var out []*csi.Snapshot
	for _, v := range volumes {
		list, err := qc.ListSnapshots(ctx, v)
		if client.IsNotFound(err) {
			continue
		} else if err != nil {
			return nil, fmt.Errorf("list snapshots of %s: %w", v, err)
		}
		for _, s := range list {
			out = append(out, csiSnapshot(s))
		}
	}
	return out, nil
}
