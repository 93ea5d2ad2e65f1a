package pool

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"path"
	"path/filepath"
	"strings"
)

const rollbackRecordName = "rollback.json"

// Rollback rolls the volume back, refusing while writers are connected. See
// RollbackWith.
func (v *Volume) Rollback(ctx context.Context, snapshot string, prog Progress) (VolumeInfo, error) {
	return v.RollbackWith(ctx, snapshot, false, prog)
}

// RollbackWith returns every disk of the volume to its state in a snapshot,
// and the disk set to the snapshot's. While writers are connected to the
// volume (a running VM: its filesystems would be corrupted) it fails with
// ErrInUse, unless force; the check runs before the work and again just
// before the commit point. The snapshot's images are first cloned into
// staging; writing rollback.json is the commit point, after which the new
// images are renamed into place under the closed I/O gate. A crash after the
// commit point is finished at start-up; one before it leaves the volume as it
// was. Durable on return. Open disk handles see the rolled-back data.
func (v *Volume) RollbackWith(ctx context.Context, snapshot string, force bool, prog Progress) (VolumeInfo, error) {
	if err := ValidateName("snapshot", snapshot); err != nil {
		return VolumeInfo{}, err
	}
	h, err := v.Hold("rollback")
	if err != nil {
		return VolumeInfo{}, err
	}
	return h.Rollback(ctx, snapshot, force, prog)
}

// Rollback is Volume.RollbackWith under the hold, which it releases.
func (h *Hold) Rollback(ctx context.Context, snapshot string, force bool, prog Progress) (VolumeInfo, error) {
	defer h.Release()
	v := h.v
	prog = orNop(prog)
	if err := ValidateName("snapshot", snapshot); err != nil {
		return VolumeInfo{}, err
	}
	checkWriters := func() error {
		if force {
			return nil
		}
		return v.CheckWriters("rollback to " + snapshot)
	}
	if err := checkWriters(); err != nil {
		return VolumeInfo{}, err
	}
	s, err := v.snapshotManifest(snapshot)
	if err != nil {
		return VolumeInfo{}, err
	}
	staged, err := v.pool.newStaging("rb")
	if err != nil {
		return VolumeInfo{}, err
	}
	err = v.pool.addCopyTotal(prog, v.snapshotDir(snapshot), s.Disks, 1)
	if err == nil {
		err = v.pool.copyImages(ctx, staged, v.snapshotDir(snapshot), s.Disks, prog)
	}
	if err != nil {
		v.pool.discard(staged)
		return VolumeInfo{}, fmt.Errorf("rollback %s to %s: %w", v.name, snapshot, err)
	}
	m := v.manifest()
	m.Disks = append([]DiskSpec(nil), s.Disks...)
	m.Capacity = max(m.Capacity, s.Capacity)
	if err := v.pool.writeJSON(filepath.Join(staged, "volume.json"), m); err != nil {
		v.pool.discard(staged)
		return VolumeInfo{}, err
	}
	// The record points start-up at the staged directory: its entry in
	// staging/ must be durable before the record is.
	if err := v.pool.fs.SyncDir("staging"); err != nil {
		v.pool.discard(staged)
		return VolumeInfo{}, fmt.Errorf("rollback %s to %s: %w", v.name, snapshot, err)
	}
	if err := checkWriters(); err != nil {
		v.pool.discard(staged)
		return VolumeInfo{}, err
	}
	// Every disk is replaced whole: change tracking records that ahead.
	if err := v.markAllChanged(append(append([]DiskSpec(nil), s.Disks...), v.manifest().Disks...)); err != nil {
		v.pool.discard(staged)
		return VolumeInfo{}, fmt.Errorf("rollback %s to %s: %w", v.name, snapshot, err)
	}
	rec := rollbackRecord{Snapshot: snapshot, Staging: filepath.Base(staged)}
	if err := v.pool.writeJSON(filepath.Join(v.dir, rollbackRecordName), rec); err != nil {
		if err = v.metaError(err); errors.Is(err, ErrVolumeFailed) {
			// The record may be in place: start-up would finish the
			// rollback from the staged images, so keep them.
			return VolumeInfo{}, fmt.Errorf("rollback %s to %s: %w", v.name, snapshot, err)
		}
		v.pool.discard(staged)
		return VolumeInfo{}, err
	}
	v.gate.Lock()
	err = v.pool.applyRollback(v.dir, staged)
	v.mu.Lock()
	v.m = m
	v.mu.Unlock()
	if err == nil {
		err = v.refreshFiles(true)
	}
	v.gate.Unlock()
	if err != nil {
		return VolumeInfo{}, fmt.Errorf("rollback %s to %s: %w (start-up will finish it)", v.name, snapshot, err)
	}
	prog.Done(snapshot)
	return v.Info(), nil
}

// applyRollback moves the staged images and manifest into the volume
// directory, removes images the new manifest does not list, and removes the
// rollback record. Every step is idempotent, so start-up can redo it after a
// crash at any point. Every file is reached through the pool's root. The
// staged directory outlives the record (it is removed last), so a record
// whose staged directory is missing means the pool lost what the rollback
// committed: applyRollback then fails instead of finishing a rollback
// without its images.
func (p *Pool) applyRollback(volDir, staged string) error {
	vol, stg := p.rel(volDir), p.rel(staged)
	disks := path.Join(vol, "disks")
	entries, err := p.fs.ReadDir(stg)
	if errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("staged rollback %s is missing: %w", filepath.Base(staged), err)
	}
	if err != nil {
		return err
	}
	for _, e := range entries {
		if strings.HasSuffix(e.Name(), ".img") {
			if err := p.fs.Rename(path.Join(stg, e.Name()), path.Join(disks, e.Name())); err != nil {
				return err
			}
		}
	}
	if err := p.checkFile(path.Join(stg, "volume.json")); err == nil {
		if err := p.fs.Rename(path.Join(stg, "volume.json"), path.Join(vol, "volume.json")); err != nil {
			return err
		}
	}
	// A rename is durable once both its directories are synced. The
	// images' are before the record goes (the staged directory's sync
	// comes after the disks directory's); volume.json's rename becomes
	// durable with the record's removal, at the sync of the volume
	// directory below. Until the record is gone, a crash redoes all this.
	if err := p.fs.SyncDir(disks); err != nil {
		return err
	}
	if err := p.fs.SyncDir(stg); err != nil {
		return err
	}
	var m volumeManifest
	err = p.readDecoded(path.Join(vol, "volume.json"), func(b []byte) (err error) {
		m, err = decodeVolumeManifest(b, filepath.Base(volDir))
		return err
	})
	if err != nil {
		return err
	}
	if err := p.removeOrphanImages(disks, m.Disks); err != nil {
		return err
	}
	if err := p.fs.Remove(path.Join(vol, rollbackRecordName)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	if err := p.fs.SyncDir(vol); err != nil {
		return err
	}
	return p.fs.RemoveAll(stg)
}

// removeOrphanImages removes every entry of the disks directory (relative to
// the pool directory) that is not the image of a listed disk (crash
// leftovers: temp files, images of disks whose add never committed or whose
// removal did). Entries are unlinked relative to the directory, so a link
// among them is removed, never followed. The removals are not synced:
// orphans that come back after a crash are removed at the next start.
func (p *Pool) removeOrphanImages(disksDir string, disks []DiskSpec) error {
	keep := make(map[string]bool, len(disks))
	for _, d := range disks {
		keep[d.Name+".img"] = true
	}
	entries, err := p.fs.ReadDir(disksDir)
	if err != nil {
		return hostile(err)
	}
	for _, e := range entries {
		if !keep[e.Name()] {
			if err := p.fs.RemoveAll(path.Join(disksDir, e.Name())); err != nil {
				return err
			}
		}
	}
	return nil
}
