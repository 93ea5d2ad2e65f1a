package pool

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"

	"github.com/quiverstorage/quiver/internal/durable"
	"github.com/quiverstorage/quiver/internal/storage"
)

// recover brings the pool to a clean state after any crash and loads it:
// temporary files left in the pool directory (a first start killed while it
// wrote pool.json) are removed, committed rollbacks are finished, then every
// volume is loaded and its leftovers reclaimed (temporary files, orphan
// images, short images), and finally staging/ is emptied: whatever is there
// was never committed. A read-only pool is loaded without any of the
// repairs.
//
// Nothing read from the pool is trusted: every file is reached through the
// pool's root (no symbolic link followed, no hard-linked image), every name
// in a manifest passes the API's rules, and a volume that fails any check
// is quarantined (Volume.broken): listed, not served, not touched.
func (p *Pool) recover(ctx context.Context) error {
	if !p.readOnly {
		if err := p.removeTemps("."); err != nil {
			return fmt.Errorf("reclaim temporary files: %w", err)
		}
	}
	entries, err := p.fs.ReadDir("volumes")
	if err != nil {
		return fmt.Errorf("read volumes: %w", err)
	}
	keep := map[string]bool{} // staging entries a quarantined volume's rollback needs
	for _, e := range entries {
		if err := ctx.Err(); err != nil {
			return err
		}
		name := e.Name()
		if ValidateName("volume", name) != nil {
			p.log.Warn("ignoring entry in volumes directory: not a volume name", "entry", name)
			continue
		}
		v, err := p.loadVolume(name)
		if err != nil {
			p.log.Error("volume quarantined: not served, not touched", "volume", name, "err", err)
			v = newBrokenVolume(p, name, err)
			if rec, rerr := p.rollbackRecord(name); rerr == nil {
				keep[rec.Staging] = true
			}
		}
		p.volumes[name] = v
	}
	if p.readOnly {
		return nil
	}
	staged, err := p.fs.ReadDir("staging")
	if err != nil {
		return err
	}
	n := 0
	for _, e := range staged {
		if keep[e.Name()] {
			continue
		}
		if err := p.fs.RemoveAll(path.Join("staging", e.Name())); err != nil {
			return fmt.Errorf("reclaim staging: %w", err)
		}
		n++
	}
	if n > 0 {
		// Not synced: what comes back after a crash is reclaimed again.
		p.log.Info("reclaimed unfinished work", "entries", n)
	}
	return nil
}

// loadVolume checks the volume's files, finishes a committed rollback, reads
// and validates the manifests, reclaims leftovers and loads the snapshots.
// Any error quarantines the volume; the checks that lead to nothing being
// touched come before any repair.
func (p *Pool) loadVolume(name string) (*Volume, error) {
	dir := path.Join("volumes", name)
	if err := p.checkTree(dir, map[string]bool{"disks": true, "snapshots": true, "changes": false, "fill": false, "rekey": false}); err != nil {
		return nil, err
	}
	// Change tracking's maps (changes.go), fill maps (fill.go) and rekey
	// journals (rekey.go), when there: files only.
	for _, sub := range []string{"changes", "fill", "rekey"} {
		if err := p.checkTree(path.Join(dir, sub), nil); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return nil, fmt.Errorf("%s: %w", sub, err)
		}
	}
	rec, err := p.rollbackRecord(name)
	switch {
	case err == nil:
		if p.readOnly {
			return nil, errors.New("an interrupted rollback waits to be finished: open the pool read-write")
		}
		if err := p.checkTree(path.Join("staging", rec.Staging), nil); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return nil, fmt.Errorf("rollback record: %w", err)
		}
		p.log.Info("finishing interrupted rollback", "volume", name, "snapshot", rec.Snapshot)
		if err := p.applyRollback(p.volumeDir(name), p.stagingPath(rec.Staging)); err != nil {
			return nil, fmt.Errorf("finish rollback: %w", err)
		}
	case !errors.Is(err, fs.ErrNotExist):
		return nil, err
	}
	var m volumeManifest
	err = p.readDecoded(path.Join(dir, "volume.json"), func(b []byte) (err error) {
		m, err = decodeVolumeManifest(b, name)
		return err
	})
	if err != nil {
		return nil, err
	}
	if !p.readOnly {
		if err := p.removeTemps(dir); err != nil {
			return nil, err
		}
		for _, sub := range []string{"changes", "fill", "rekey"} {
			if err := p.removeTemps(path.Join(dir, sub)); err != nil && !errors.Is(err, fs.ErrNotExist) {
				return nil, err
			}
		}
		if err := p.removeOrphanImages(path.Join(dir, "disks"), m.Disks); err != nil {
			return nil, err
		}
	}
	for _, d := range m.Disks {
		if err := p.checkImage(path.Join(dir, "disks", d.Name+".img"), d.Size, !p.readOnly); err != nil {
			return nil, fmt.Errorf("disk %q: %w", d.Name, err)
		}
	}
	v := newVolume(p, m, nil)
	if m.Rekey == nil && !p.readOnly {
		v.removeRekeyJournals() // left by a crash right after a rekey finished
	}
	if m.Fill == nil && !p.readOnly {
		v.removeFillMaps() // left by a crash right after the fill's end
	}
	if err := v.loadSnapshots(); err != nil {
		return nil, err
	}
	if err := v.loadAttachments(); err != nil {
		return nil, err
	}
	return v, nil
}

// rollbackRecord reads and validates the rollback record of volume name.
func (p *Pool) rollbackRecord(name string) (rollbackRecord, error) {
	var rec rollbackRecord
	err := p.readDecoded(path.Join("volumes", name, rollbackRecordName), func(b []byte) (err error) {
		rec, err = decodeRollbackRecord(b)
		return err
	})
	return rec, err
}

// checkTree requires dir to be a directory (not a link to one), its
// subdirectories named in dirs to be directories (those mapped to false
// may be absent), and every other entry to be a regular file with one link.
func (p *Pool) checkTree(dir string, dirs map[string]bool) error {
	fi, err := p.fs.Lstat(dir)
	if err != nil {
		return hostile(err)
	}
	if !fi.IsDir() {
		return fmt.Errorf("%s is a %s, not a directory: %w", dir, kindOf(fi), ErrHostile)
	}
	for d, required := range dirs {
		fi, err := p.fs.Lstat(path.Join(dir, d))
		if !required && errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return hostile(err)
		}
		if !fi.IsDir() {
			return fmt.Errorf("%s/%s is a %s, not a directory: %w", dir, d, kindOf(fi), ErrHostile)
		}
	}
	es, err := p.fs.ReadDir(dir)
	if err != nil {
		return hostile(err)
	}
	for _, e := range es {
		if _, ok := dirs[e.Name()]; ok {
			continue
		}
		if err := p.checkFile(path.Join(dir, e.Name())); err != nil {
			return err
		}
	}
	return nil
}

// checkFile requires rel to be a regular file with one link.
func (p *Pool) checkFile(rel string) error {
	fi, err := p.fs.Lstat(rel)
	if err != nil {
		return hostile(err)
	}
	if !fi.Mode().IsRegular() {
		return fmt.Errorf("%s is a %s, not a regular file: %w", rel, kindOf(fi), ErrHostile)
	}
	if n := linksOf(fi); n > 1 {
		return fmt.Errorf("%s has %d hard links (another may be outside the pool): %w", rel, n, ErrHostile)
	}
	return nil
}

// checkImage opens a disk image through the root (a regular file with one
// link) and, when repair is set, extends it to size if a crash left it short;
// a read-only pool refuses a short image instead.
func (p *Pool) checkImage(rel string, size int64, repair bool) error {
	flag := os.O_RDONLY
	if repair {
		flag = os.O_RDWR
	}
	f, err := p.openImage(rel, flag)
	if err != nil {
		return err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return err
	}
	if st.Size() >= size {
		return nil
	}
	if !repair {
		return fmt.Errorf("image is %s, its manifest says %s: open the pool read-write to repair it", formatSize(st.Size()), formatSize(size))
	}
	// Not synced: a crash that loses the new size leaves the image short
	// again, and the next start extends it again.
	return f.Truncate(size)
}

// linksOf returns the hard links of a file described by Lstat.
func linksOf(fi fs.FileInfo) uint64 { return storage.Links(fi) }

// stagingPath is the path of an entry of staging/.
func (p *Pool) stagingPath(name string) string { return filepath.Join(p.stagingDir(), name) }

// openImage opens a disk image (rel to the pool directory) through the
// root: never through a symbolic link, never a file with another name.
func (p *Pool) openImage(rel string, flag int) (storage.File, error) {
	f, err := p.fs.OpenRegular(rel, flag)
	if err != nil {
		return nil, hostile(err)
	}
	return f, nil
}

func (v *Volume) loadSnapshots() error {
	dir := path.Join("volumes", v.name, "snapshots")
	entries, err := v.pool.fs.ReadDir(dir)
	if err != nil {
		return hostile(err)
	}
	for _, e := range entries {
		name := e.Name()
		if ValidateName("snapshot", name) != nil {
			v.pool.log.Warn("ignoring entry in snapshots directory", "volume", v.name, "entry", name)
			continue
		}
		sdir := path.Join(dir, name)
		if err := v.pool.checkTree(sdir, nil); err != nil {
			return fmt.Errorf("snapshot %q: %w", name, err)
		}
		var s snapshotManifest
		err := v.pool.readDecoded(path.Join(sdir, "snapshot.json"), func(b []byte) (err error) {
			s, err = decodeSnapshotManifest(b, v.name, name)
			return err
		})
		if err != nil {
			return fmt.Errorf("snapshot %q: %w", name, err)
		}
		for _, d := range s.Disks {
			f, err := v.pool.openImage(path.Join(sdir, d.Name+".img"), os.O_RDONLY)
			if err != nil {
				return fmt.Errorf("snapshot %q disk %q: %w", name, d.Name, err)
			}
			f.Close()
		}
		v.snaps[name] = &s
	}
	return nil
}

// removeTemps removes temporary files that an interrupted atomic write left
// in dir (relative to the pool directory).
func (p *Pool) removeTemps(dir string) error {
	entries, err := p.fs.ReadDir(dir)
	if err != nil {
		return err
	}
	for _, e := range entries {
		if durable.IsTemp(e.Name()) {
			if err := p.fs.Remove(path.Join(dir, e.Name())); err != nil {
				return err
			}
		}
	}
	return nil
}
