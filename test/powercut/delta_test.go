package powercut

import (
	"context"
	"fmt"

	"github.com/quiverstorage/quiver/internal/api"
)

// granule is change tracking's unit (internal/pool, changes.go): a delta
// names 64 KiB granules, or 1 MiB regions for the writes just before a
// crash, so a block that differs is reported with its granule at least.
const granule = 64 << 10

// verifyDeltas checks the change tracking of volume vol after a boot. Every
// snapshot is a checkpoint; for each, the delta from it to the live disks
// must cover every block that differs between the snapshot and the live
// disk, and the delta between two snapshots every block that differs
// between them (over-reporting is allowed, under-reporting never is). live
// and snaps are what verifyVolume read back after the boot: the blocks
// themselves, not the model.
func (l *lane) verifyDeltas(ctx context.Context, vol string, live map[string][]uint64, snaps map[string]map[string][]uint64) error {
	names := sortedKeys(snaps)
	for _, from := range names {
		if err := l.verifyDelta(ctx, vol, from, "", snaps[from], live); err != nil {
			return err
		}
		for _, to := range names {
			if to == from {
				continue
			}
			if err := l.verifyDelta(ctx, vol, from, to, snaps[from], snaps[to]); err != nil {
				return err
			}
		}
	}
	return nil
}

// verifyDelta checks the delta from snapshot from to snapshot to (the live
// disks when to is empty): base and now are the blocks of each disk at
// both ends. The disks compared are those of now; a disk not in the base
// differs whole.
func (l *lane) verifyDelta(ctx context.Context, vol, from, to string, base, now map[string][]uint64) error {
	what := "since snapshot " + from
	if to != "" {
		what = "from snapshot " + from + " to snapshot " + to
	}
	ch, err := l.mc.api.SnapshotChanges(ctx, vol, from, to)
	if err != nil {
		return fmt.Errorf("changes %s: %w", what, err)
	}
	deltas := map[string]api.DiskChanges{}
	for _, dc := range ch.Disks {
		deltas[dc.Disk] = dc
	}
	changed := false
	for _, d := range sortedKeys(now) {
		dc, ok := deltas[d]
		if !ok {
			return fmt.Errorf("changes %s: disk %s is not in the delta (disks %v)", what, d, sortedKeys(deltas))
		}
		if size := int64(len(now[d])) * blockSize; dc.Size != size {
			return fmt.Errorf("changes %s: disk %s of %d bytes, want %d", what, d, dc.Size, size)
		}
		was, inBase := base[d]
		for b, v := range now[d] {
			w := uint64(0)
			if inBase {
				w = was[b]
			}
			if inBase && v == w {
				continue
			}
			changed = true
			l.stats.deltaBlocksDiffering++
			off := int64(b) * blockSize
			if !dc.Whole && !covered(dc.Ranges, off, blockSize) {
				return fmt.Errorf("change tracking under-reports %s: disk %s differs at offset %d (block %d holds write %d (%s), the base held %d (%s)), "+
					"but its 64 KiB granule at %d is not in the delta (whole %v, ranges %v)",
					what, d, off, b, v, l.model.where(v), w, l.model.where(w), off&^(granule-1), dc.Whole, dc.Ranges)
			}
		}
		l.stats.deltaBytesReported += dc.Changed
	}
	l.stats.deltasChecked++
	if changed {
		l.stats.deltasWithChanges++
	}
	return nil
}

// covered says whether [off, off+n) lies in rs (sorted and merged, as the
// API returns them).
func covered(rs []api.Range, off, n int64) bool {
	for _, r := range rs {
		if r.Offset <= off && off+n <= r.Offset+r.Length {
			return true
		}
	}
	return false
}
