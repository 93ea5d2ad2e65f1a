package pool

import (
	"context"
	"fmt"
	"slices"
)

// ChangeReporter is implemented by disk handles that can say what changed
// in their disk since a checkpoint (changes.go): a server offers it to
// clients as a dirty bitmap (the NBD qemu:dirty-bitmap: context). It is a
// capability (Capabilities.Changes): only handles that declare it offer
// it, so a wrapper that fences or forwards its disk offers none unless it
// implements it with its own checks.
type ChangeReporter interface {
	// Checkpoints names the snapshots a delta of the handle's disk can
	// start from: every snapshot of its volume that is a checkpoint,
	// except a snapshot handle's own snapshot. Sorted.
	Checkpoints() []string
	// ChangesSince returns the ranges of the handle's disk that may differ
	// between snapshot base and what the handle reads: its snapshot, or
	// the live disk as it is at the call. Sorted, merged, within the
	// disk's size; the whole disk when the disk is not in base.
	// ErrSnapshotNotFound or ErrNoCheckpoint when base is not a
	// checkpoint of the volume.
	ChangesSince(ctx context.Context, base string) ([]ChangedRange, error)
}

var (
	_ ChangeReporter = (*liveDisk)(nil)
	_ ChangeReporter = (*snapshotDisk)(nil)
)

// checkpoints names the volume's snapshots that are checkpoints, but
// except; none when except is not empty and not a checkpoint (no delta
// ends at a snapshot taken before change tracking).
func (v *Volume) checkpoints(except string) []string {
	v.mu.Lock()
	if s := v.snaps[except]; except != "" && (s == nil || s.Checkpoint == 0) {
		v.mu.Unlock()
		return nil
	}
	out := make([]string, 0, len(v.snaps))
	for _, s := range v.snaps {
		if s.Checkpoint != 0 && s.Name != except {
			out = append(out, s.Name)
		}
	}
	v.mu.Unlock()
	slices.Sort(out)
	return out
}

// diskChangesSince returns the ranges of disk that changed between base and
// to (the live disk when to is empty): Volume.Changes, for one disk.
func (v *Volume) diskChangesSince(ctx context.Context, base, to, disk string) ([]ChangedRange, error) {
	deltas, err := v.Changes(ctx, base, to)
	if err != nil {
		return nil, err
	}
	for _, d := range deltas {
		if d.Disk == disk {
			return d.Ranges, nil
		}
	}
	return nil, fmt.Errorf("changes of disk %q of volume %q since %s: %w", disk, v.name, base, ErrDiskNotFound)
}

// Checkpoints implements ChangeReporter.
func (d *liveDisk) Checkpoints() []string { return d.v.checkpoints("") }

// ChangesSince implements ChangeReporter: the changes up to the call, of
// writes acknowledged before it (a write in flight may or may not be in).
func (d *liveDisk) ChangesSince(ctx context.Context, base string) ([]ChangedRange, error) {
	if d.closed.Load() {
		return nil, ErrClosed
	}
	return d.v.diskChangesSince(ctx, base, "", d.df.name)
}

// Checkpoints implements ChangeReporter.
func (d *snapshotDisk) Checkpoints() []string { return d.v.checkpoints(d.snapshot) }

// ChangesSince implements ChangeReporter.
func (d *snapshotDisk) ChangesSince(ctx context.Context, base string) ([]ChangedRange, error) {
	return d.v.diskChangesSince(ctx, base, d.snapshot, d.disk)
}
