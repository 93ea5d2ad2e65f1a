package pool

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/quiverstorage/quiver/internal/durable"
)

// recover brings the pool to a clean state after any crash and loads it:
// temporary files left in the pool directory (a first start killed while it
// wrote pool.json) are removed, committed rollbacks are finished, then every
// volume is loaded and its leftovers reclaimed (temporary files, orphan
// images, short images), and finally staging/ is emptied: whatever is there
// was never committed.
func (p *Pool) recover(ctx context.Context) error {
	if err := removeTemps(p.dir); err != nil {
		return fmt.Errorf("reclaim temporary files: %w", err)
	}
	entries, err := os.ReadDir(p.volumesDir())
	if err != nil {
		return fmt.Errorf("read volumes: %w", err)
	}
	for _, e := range entries {
		if err := ctx.Err(); err != nil {
			return err
		}
		name := e.Name()
		if !e.IsDir() || ValidateName("volume", name) != nil {
			p.log.Warn("ignoring entry in volumes directory: not a volume", "entry", name)
			continue
		}
		v, err := p.loadVolume(name)
		if err != nil {
			return fmt.Errorf("load volume %q: %w", name, err)
		}
		if v != nil {
			p.volumes[name] = v
		}
	}
	staged, err := os.ReadDir(p.stagingDir())
	if err != nil {
		return err
	}
	for _, e := range staged {
		if err := os.RemoveAll(filepath.Join(p.stagingDir(), e.Name())); err != nil {
			return fmt.Errorf("reclaim staging: %w", err)
		}
	}
	if len(staged) > 0 {
		p.log.Info("reclaimed unfinished work", "entries", len(staged))
		return durable.SyncDir(p.stagingDir())
	}
	return nil
}

// loadVolume finishes a committed rollback, reads the manifest, reclaims
// leftovers and loads the snapshots. It returns nil, nil for a directory that
// is not a volume (no manifest).
func (p *Pool) loadVolume(name string) (*Volume, error) {
	dir := p.volumeDir(name)
	var rec rollbackRecord
	switch err := durable.ReadJSON(filepath.Join(dir, rollbackRecordName), &rec); {
	case err == nil:
		if filepath.Base(rec.Staging) != rec.Staging || rec.Staging == "" || rec.Staging == "." || rec.Staging == ".." {
			return nil, fmt.Errorf("bad rollback record %+v", rec)
		}
		p.log.Info("finishing interrupted rollback", "volume", name, "snapshot", rec.Snapshot)
		if err := applyRollback(dir, filepath.Join(p.stagingDir(), filepath.Base(rec.Staging))); err != nil {
			return nil, fmt.Errorf("finish rollback: %w", err)
		}
	case !errors.Is(err, fs.ErrNotExist):
		return nil, err
	}
	var m volumeManifest
	if err := durable.ReadJSON(filepath.Join(dir, "volume.json"), &m); err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			p.log.Warn("ignoring directory without volume.json", "dir", dir)
			return nil, nil
		}
		return nil, err
	}
	if m.Name != name {
		return nil, fmt.Errorf("manifest names %q", m.Name)
	}
	if err := removeTemps(dir); err != nil {
		return nil, err
	}
	disks := filepath.Join(dir, "disks")
	if err := removeOrphanImages(disks, m.Disks); err != nil {
		return nil, err
	}
	for _, d := range m.Disks {
		path := filepath.Join(disks, d.Name+".img")
		if err := extendImage(path, d.Size); err != nil {
			return nil, fmt.Errorf("disk %q: %w", d.Name, err)
		}
	}
	v := newVolume(p, m, nil)
	if err := v.loadSnapshots(); err != nil {
		return nil, err
	}
	if err := v.loadAttachments(); err != nil {
		return nil, err
	}
	return v, nil
}

func (v *Volume) loadSnapshots() error {
	entries, err := os.ReadDir(v.snapshotsDir())
	if err != nil {
		return err
	}
	for _, e := range entries {
		name := e.Name()
		if !e.IsDir() || ValidateName("snapshot", name) != nil {
			v.pool.log.Warn("ignoring entry in snapshots directory", "volume", v.name, "entry", name)
			continue
		}
		var s snapshotManifest
		if err := durable.ReadJSON(filepath.Join(v.snapshotDir(name), "snapshot.json"), &s); err != nil {
			return fmt.Errorf("snapshot %q: %w", name, err)
		}
		v.snaps[name] = &s
	}
	return nil
}

// removeTemps removes temporary files that an interrupted atomic write left.
func removeTemps(dir string) error {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	for _, e := range entries {
		if durable.IsTemp(e.Name()) {
			if err := os.Remove(filepath.Join(dir, e.Name())); err != nil {
				return err
			}
		}
	}
	return nil
}
