package csi

import (
	"context"
	"fmt"

	"github.com/container-storage-interface/spec/lib/go/csi"

	"github.com/quiverstorage/quiver/internal/api"
	"github.com/quiverstorage/quiver/internal/client"
)

// The SnapshotMetadata service (CSI v1.10 and later; Kubernetes' changed
// block tracking, KEP-3314): the allocated ranges of one snapshot, and the
// ranges that changed between two snapshots of a volume, streamed.
//
// Which disk. A CSI volume is a whole quiver volume, but its Block-mode
// device shows the volume's first disk at offset 0: alone (the plugin's
// own NBD path, primaryDisk), or as the first slot of the endpoint's
// @disks device, where disk i starts at i*endpoint.SlotSize. So the service
// reports the first disk of the snapshot, whose offsets are the device's in
// both layouts; a one-disk volume (the default layout) is reported whole.
// The other disks of a volume of several are not in the stream: a backup of
// every disk of a VM at one cut is quiver's own (docs/backup.md).
//
// Ranges are VARIABLE_LENGTH extents: allocation as the pool's filesystem
// reports it (per block), changes as change tracking records them (per 64
// KiB, docs/backup.md). A range that holds starting_offset is cut to start
// there, and none ends at or before it.

// defaultMaxResults is the ranges per message when the request leaves
// max_results at 0: about 24 KiB of protobuf, far below gRPC's 4 MiB.
const defaultMaxResults = 1024

// snapshotMetadata is the CSI SnapshotMetadata service; it runs with the
// controller.
type snapshotMetadata struct {
	csi.UnimplementedSnapshotMetadataServer
	d *Driver
}

// GetMetadataAllocated streams the data ranges of the snapshot's first disk
// from starting_offset on, reading them from the API a page at a time.
func (m *snapshotMetadata) GetMetadataAllocated(req *csi.GetMetadataAllocatedRequest, stream csi.SnapshotMetadata_GetMetadataAllocatedServer) error {
	ctx := stream.Context()
	volume, snap, err := parseSnapshotID("snapshot_id", req.GetSnapshotId())
	if err != nil {
		return err
	}
	perMsg, err := maxResults(req.GetMaxResults())
	if err != nil {
		return err
	}
	qc, err := m.d.clientFor(req.GetSecrets())
	if err != nil {
		return err
	}
	disk, err := firstDisk(ctx, qc, "snapshot_id", volume, snap)
	if err != nil {
		return err
	}
	from := req.GetStartingOffset()
	if err := checkOffset(from, disk); err != nil {
		return err
	}
	out := &rangeStream{from: from, perMsg: perMsg, send: func(bm []*csi.BlockMetadata) error {
		return stream.Send(&csi.GetMetadataAllocatedResponse{BlockMetadataType: csi.BlockMetadataType_VARIABLE_LENGTH,
			VolumeCapacityBytes: disk.Size, BlockMetadata: bm})
	}}
	for off := from; ; {
		page, err := qc.SnapshotAllocated(ctx, volume, snap, disk.Name, off, min(perMsg, api.MaxAllocatedRanges))
		if client.IsNotFound(err) {
			return fmt.Errorf("snapshot %s (disk %s): %w (%v)", req.GetSnapshotId(), disk.Name, ErrNotFound, err)
		} else if err != nil {
			return fmt.Errorf("allocated ranges of snapshot %s (disk %s): %w", req.GetSnapshotId(), disk.Name, err)
		}
		for _, r := range page.Ranges {
			if err := out.add(r); err != nil {
				return err
			}
		}
		if page.Next == 0 {
			return out.close()
		}
		off = page.Next
	}
}

// GetMetadataDelta streams the ranges of the first disk of the target
// snapshot that changed since the base snapshot, from starting_offset on.
// A snapshot without change tracking is FailedPrecondition, the spec's
// case for a full backup instead.
func (m *snapshotMetadata) GetMetadataDelta(req *csi.GetMetadataDeltaRequest, stream csi.SnapshotMetadata_GetMetadataDeltaServer) error {
	ctx := stream.Context()
	volume, base, err := parseSnapshotID("base_snapshot_id", req.GetBaseSnapshotId())
	if err != nil {
		return err
	}
	tvolume, target, err := parseSnapshotID("target_snapshot_id", req.GetTargetSnapshotId())
	if err != nil {
		return err
	}
	if tvolume != volume {
		return fmt.Errorf("base_snapshot_id %s and target_snapshot_id %s are snapshots of different volumes: a delta is between two snapshots of one volume: %w",
			req.GetBaseSnapshotId(), req.GetTargetSnapshotId(), ErrInvalid)
	}
	if target == base {
		return fmt.Errorf("base_snapshot_id and target_snapshot_id are the same snapshot %s: a delta needs two: %w",
			req.GetBaseSnapshotId(), ErrInvalid)
	}
	perMsg, err := maxResults(req.GetMaxResults())
	if err != nil {
		return err
	}
	qc, err := m.d.clientFor(req.GetSecrets())
	if err != nil {
		return err
	}
	if _, err := firstDisk(ctx, qc, "base_snapshot_id", volume, base); err != nil {
		return err
	}
	disk, err := firstDisk(ctx, qc, "target_snapshot_id", volume, target)
	if err != nil {
		return err
	}
	from := req.GetStartingOffset()
	if err := checkOffset(from, disk); err != nil {
		return err
	}
	changes, err := qc.SnapshotChanges(ctx, volume, base, target)
	if client.IsNotFound(err) {
		return fmt.Errorf("changes from %s to %s: %w (%v)", req.GetBaseSnapshotId(), req.GetTargetSnapshotId(), ErrNotFound, err)
	} else if err != nil {
		return fmt.Errorf("changes from %s to %s: %w", req.GetBaseSnapshotId(), req.GetTargetSnapshotId(), err)
	}
	var ranges []api.Range
	found := false
	for _, d := range changes.Disks {
		if d.Disk == disk.Name {
			ranges, found = d.Ranges, true
		}
	}
	if !found {
		return fmt.Errorf("changes from %s to %s list no disk %s", req.GetBaseSnapshotId(), req.GetTargetSnapshotId(), disk.Name)
	}
	out := &rangeStream{from: from, perMsg: perMsg, send: func(bm []*csi.BlockMetadata) error {
		return stream.Send(&csi.GetMetadataDeltaResponse{BlockMetadataType: csi.BlockMetadataType_VARIABLE_LENGTH,
			VolumeCapacityBytes: disk.Size, BlockMetadata: bm})
	}}
	for _, r := range ranges {
		if err := out.add(r); err != nil {
			return err
		}
	}
	return out.close()
}

// firstDisk returns the first disk of a snapshot, the one the service
// reports; an unknown snapshot is NotFound naming field.
func firstDisk(ctx context.Context, qc *client.Client, field, volume, snap string) (api.Disk, error) {
	s, err := qc.GetSnapshot(ctx, volume, snap)
	if client.IsNotFound(err) {
		return api.Disk{}, fmt.Errorf("%s %s: %w", field, snapshotID(volume, snap), ErrNotFound)
	} else if err != nil {
		return api.Disk{}, fmt.Errorf("look up snapshot %s: %w", snapshotID(volume, snap), err)
	}
	if len(s.Disks) == 0 {
		return api.Disk{}, fmt.Errorf("snapshot %s has no disk: %w", snapshotID(volume, snap), ErrPrecondition)
	}
	return s.Disks[0], nil
}

// maxResults checks max_results and returns the ranges per message.
func maxResults(n int32) (int, error) {
	switch {
	case n < 0:
		return 0, fmt.Errorf("max_results %d: must be 0 (the plugin chooses) or more: %w", n, ErrInvalid)
	case n == 0:
		return defaultMaxResults, nil
	}
	return int(n), nil
}

// checkOffset refuses a starting_offset that is negative or past the end of
// disk (the volume's capacity in the spec's words): OutOfRange.
func checkOffset(off int64, disk api.Disk) error {
	if off < 0 || off > disk.Size {
		return fmt.Errorf("starting_offset %d: must be 0 to the snapshot's %d bytes (disk %s): %w", off, disk.Size, disk.Name, ErrOffset)
	}
	return nil
}

// rangeStream sends ranges as BlockMetadata, perMsg to a message, none
// ending at or before from, the one that holds from cut to start there.
// Ranges must come sorted and apart (as the API gives them). At least one
// message is sent, so the volume's capacity always reaches the caller.
type rangeStream struct {
	from   int64
	perMsg int
	send   func([]*csi.BlockMetadata) error
	buf    []*csi.BlockMetadata
	sent   bool
}

func (s *rangeStream) add(r api.Range) error {
	off, end := r.Offset, r.Offset+r.Length
	if end <= s.from || r.Length <= 0 {
		return nil
	}
	off = max(off, s.from)
	s.buf = append(s.buf, &csi.BlockMetadata{ByteOffset: off, SizeBytes: end - off})
	if len(s.buf) == s.perMsg {
		return s.flush()
	}
	return nil
}

func (s *rangeStream) flush() error {
	s.sent = true
	err := s.send(s.buf)
	s.buf = nil
	return err
}

// close sends what is left, or an empty message when nothing was sent.
func (s *rangeStream) close() error {
	if len(s.buf) > 0 || !s.sent {
		return s.flush()
	}
	return nil
}
