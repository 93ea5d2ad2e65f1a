package pool

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
)

// Lazy change tracking: no sync on the write path after a checkpoint
// (issue 33, acceptance 6).
//
// Writing each region's bit ahead (changes.go) costs an fdatasync of the
// live map on the first write into every 1 MiB region after a checkpoint:
// right after a snapshot, random writes are nearly all such first writes.
// On XFS the filesystem keeps a second record of what changed since a
// snapshot: the live image and the snapshot's image share every block the
// image has not written since (the capture reflinks them), and a written
// block is a block of the image's own (copy on write, or a hole filled).
// So once the snapshot of checkpoint seq is committed, each disk's live map
// header names seq (changeLazy, one header write and sync), and from then
// on writes are recorded in memory only. After a crash, the map's regions
// are completed from the extent maps: every range where the live image and
// the snapshot's image are not both holes or the very same device blocks
// (fscap.Differences) counts as changed, at 64 KiB granules. That set
// holds every byte whose content differs, whatever the history, since two
// files mapping one block hold the same bytes; it is read after an
// fdatasync of the image, so that writes still in the page cache (a
// process killed, not a power cut) have their copy on write remapped
// first.
//
// The recovery needs that snapshot. Deleting it first writes the regions
// recorded in memory into the live map and clears the header's seq, with
// the gate closed (endLazy); a checkpoint's cut stops lazy recording, its
// new epoch being written ahead until its own snapshot is committed, and
// the reset after the seal clears the old seq. Where the snapshot is gone
// after all, or the filesystem cannot say, the disk counts as changed whole
// since the checkpoint.
//
// Only on XFS pools (where the unshare guard runs, v.pool.us): btrfs and
// NFS keep the write-ahead map.

// lazyChanges turns lazy recording on for the tracked disks of the volume,
// now that snapshot s, the checkpoint's, is committed (ops lock held).
func (v *Volume) lazyChanges(s *snapshotManifest) {
	if v.pool.us == nil || s.Checkpoint == 0 || s.CheckpointPool != v.pool.id {
		return
	}
	c := v.loadedChanges()
	if c == nil {
		return
	}
	for _, dc := range c.tracking() {
		if err := dc.enableLazy(s.Checkpoint); err != nil {
			v.pool.log.Warn("change tracking stays written ahead", "volume", v.name, "disk", dc.name, "err", err)
		}
	}
}

// tracking returns the disks whose tracking is loaded (c.mu taken and
// released: a disk's own work may take it, ensureDir).
func (c *changeLog) tracking() []*diskChanges {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make([]*diskChanges, 0, len(c.disks))
	for _, dc := range c.disks {
		out = append(out, dc)
	}
	return out
}

// enableLazy names checkpoint seq in the live map's header (durable) and
// then records changes in memory only.
func (dc *diskChanges) enableLazy(seq uint64) error {
	dc.mu.Lock()
	defer dc.mu.Unlock()
	dc.idle()
	if dc.err != nil {
		return dc.err
	}
	was := dc.lazySeq
	dc.lazySeq = seq
	var err error
	if dc.f == nil {
		err = dc.open(dc.regions)
	} else {
		err = dc.writeHeader()
	}
	if err != nil {
		dc.lazySeq = was
		return dc.failed(err)
	}
	dc.lazy.Store(true)
	return nil
}

// writeHeader (mu held) rewrites the live map's header and syncs it.
func (dc *diskChanges) writeHeader() error {
	if _, err := dc.f.WriteAt(dc.header(dc.flags()), 0); err != nil {
		return err
	}
	if err := dc.f.Sync(); err != nil {
		return fmt.Errorf("%w: %w", errMapSync, err)
	}
	return nil
}

// endLazy (before snapshot s goes) writes ahead what was recorded lazily
// against s's checkpoint, with the gate closed so that no write is
// recorded meanwhile, and clears the checkpoint from the live maps.
func (v *Volume) endLazy(s SnapshotInfo) error {
	v.mu.Lock()
	sm := v.snaps[s.Name]
	v.mu.Unlock()
	if sm == nil || sm.Checkpoint == 0 {
		return nil
	}
	c := v.loadedChanges()
	if c == nil {
		return nil
	}
	v.gate.Lock()
	defer v.gate.Unlock()
	for _, dc := range c.tracking() {
		if err := dc.endLazy(sm.Checkpoint); err != nil {
			return fmt.Errorf("volume %q: %w", v.name, err)
		}
	}
	return nil
}

// endLazy (gate held exclusively) writes the regions of the granules
// recorded so far into the live map, without checkpoint seq in its header,
// if the header named seq.
func (dc *diskChanges) endLazy(seq uint64) error {
	dc.mu.Lock()
	defer dc.mu.Unlock()
	dc.idle()
	if dc.lazySeq != seq {
		return nil
	}
	if dc.err != nil {
		return dc.err
	}
	regions := newBitset(changeRegion, dc.size)
	regions.or(dc.regions)
	regions.or(dc.fine.Load())
	dc.lazySeq = 0
	var err error
	if dc.f == nil {
		err = dc.open(regions) // a map read at load is open for writing only by a change
	} else {
		err = dc.writeMap(dc.f, regions)
	}
	if err != nil {
		dc.lazySeq = seq
		return dc.failed(err)
	}
	for i := range dc.regions.words {
		dc.regions.words[i].Store(regions.words[i].Load())
	}
	dc.lazy.Store(false)
	return nil
}

// recoverLazy (at load, the live map read) adds what changed since
// checkpoint seq as the extent maps of the image and of that checkpoint's
// snapshot show it; the header keeps naming seq. Without the snapshot, or
// an extent map, the disk counts as changed whole.
func (dc *diskChanges) recoverLazy(seq uint64) error {
	v := dc.c.v
	dc.lazySeq = seq
	whole := func(why string, err error) error {
		v.pool.log.Warn("changes recorded lazily cannot be recovered; the disk counts as changed whole since the checkpoint",
			"volume", v.name, "disk", dc.name, "checkpoint", seq, "why", why, "err", err)
		dc.all.Store(true)
		return nil
	}
	var snap *snapshotManifest
	v.mu.Lock()
	for _, s := range v.snaps {
		if s.Checkpoint == seq && s.CheckpointPool == v.pool.id {
			snap = s
		}
	}
	v.mu.Unlock()
	if snap == nil {
		return whole("its snapshot is gone", nil)
	}
	i := -1
	for k, d := range snap.Disks {
		if d.Name == dc.name {
			i = k
		}
	}
	if i < 0 {
		return whole("the disk is not in its snapshot", nil)
	}
	live, err := v.pool.openImage(v.pool.rel(v.diskPath(dc.name)), os.O_RDONLY)
	if err != nil {
		return err
	}
	defer live.Close()
	base, err := v.pool.openImage(v.pool.rel(filepath.Join(v.snapshotDir(snap.Name), dc.name+".img")), os.O_RDONLY)
	if err != nil {
		return err
	}
	defer base.Close()
	// Writes a killed process left in the page cache are remapped first.
	if err := live.Sync(); err != nil {
		return whole("the image does not sync", err)
	}
	diffs, err := live.Differences(base, dc.size)
	if errors.Is(err, ErrNotSupported) {
		return whole("no extent map", err)
	}
	if err != nil {
		return err
	}
	// Granules only: a write into their regions is written ahead (the
	// header still names seq, so a crash recovers them again anyway).
	fine := dc.fine.Load()
	for _, r := range diffs {
		fine.add(r[0], r[1])
	}
	return nil
}
