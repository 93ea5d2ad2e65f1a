package backup

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/quiverstorage/quiver/internal/pool"
)

// Instant restore (docs/backup.md, "Instant restore"): a new volume that a VM
// can attach at once, while its content is copied in from the backup in the
// background. The pool does the filling (pool/fill.go: a unit is fetched
// before any I/O touches it, and recorded durably before the VM changes
// it); the service names the backup as the volume's fill source, connects
// the source, and keeps the copy going, again after a failure of the store
// and after a restart of the server, until the volume is whole.

// fillPrefix starts the fill source of a volume restored from a backup:
// "backup:<target>:<id>".
const fillPrefix = "backup:"

// fillRetry is how long a failed copy waits before it tries again.
const fillRetry = 30 * time.Second

func fillRef(target, id string) string { return fillPrefix + target + ":" + id }

func parseFillRef(ref string) (target, id string, ok bool) {
	rest, ok := strings.CutPrefix(ref, fillPrefix)
	if !ok {
		return "", "", false
	}
	target, id, ok = strings.Cut(rest, ":")
	return target, id, ok && validID(id) == nil
}

// backupSource is a fill source reading a backup's disks from the store.
type backupSource struct{ disks map[string]*ExportDisk }

func (b *backupSource) ReadDisk(_ context.Context, disk string, p []byte, off int64) error {
	d := b.disks[disk]
	if d == nil {
		return fmt.Errorf("the backup has no disk %q: %w", disk, pool.ErrDiskNotFound)
	}
	return d.ReadAt(p, off)
}

func (b *backupSource) close() {
	for _, d := range b.disks {
		_ = d.Close()
	}
}

// InstantRestore makes a new volume from a backup (only the disks named,
// when any) that is served at once: a VM may attach it and boot while its
// content is copied in. It returns once the volume is durable and the copy
// has started; VolumeInfo.Fill reports the copy's progress until it ends.
func (s *Service) InstantRestore(ctx context.Context, targetName, id, volume string, disks []string) (pool.VolumeInfo, error) {
	r, m, spec, err := s.restorePlan(ctx, targetName, id, volume, disks)
	if err != nil {
		return pool.VolumeInfo{}, err
	}
	if targetName == "" {
		targetName = s.Default()
	}
	spec.Fill = fillRef(targetName, m.ID)
	src, err := openBackupSource(ctx, r, m, spec.Disks)
	if err != nil {
		return pool.VolumeInfo{}, err
	}
	if _, _, err := s.pool.Create(ctx, spec); err != nil {
		src.close()
		return pool.VolumeInfo{}, err
	}
	v, err := s.pool.Volume(volume)
	if err != nil {
		src.close()
		return pool.VolumeInfo{}, err
	}
	// Connected before the volume is handed out: a VM may read at once.
	v.ConnectFill(src)
	s.startFill(v, src)
	return v.Info(), nil
}

func openBackupSource(ctx context.Context, r *Repository, m *Manifest, disks []pool.DiskSpec) (*backupSource, error) {
	src := &backupSource{disks: map[string]*ExportDisk{}}
	for _, d := range disks {
		ed, err := r.openDisk(ctx, m.ID, d.Name, true) // an encrypted volume's: its ciphertext, as the new volume stores it
		if err != nil {
			src.close()
			return nil, err
		}
		src.disks[d.Name] = ed
	}
	return src, nil
}

// resumeFills restarts the copy of every volume still filling from a
// backup (after a restart of the server).
func (s *Service) resumeFills() {
	for _, info := range s.pool.List(nil) {
		v, err := s.pool.Volume(info.Name)
		if err != nil || v.Filling() == nil {
			continue
		}
		if _, _, ok := parseFillRef(v.Filling().Source); ok {
			s.startFill(v, nil)
		}
	}
}

// startFill runs the copy of v in the background until the volume is whole
// or gone, or the service closes; src, when nil, is opened from the
// volume's fill record, and again after every failure.
func (s *Service) startFill(v *pool.Volume, src *backupSource) {
	if _, busy := s.filling.LoadOrStore(v.Name(), true); busy {
		if src != nil {
			src.close()
		}
		return
	}
	s.fills.Add(1)
	go func() {
		defer s.fills.Done()
		defer s.filling.Delete(v.Name())
		ctx := s.ctx
		defer func() {
			if src != nil {
				src.close()
			}
		}()
		for attempt := 0; ; attempt++ {
			f := v.Filling()
			if f == nil {
				return
			}
			var err error
			if src == nil {
				src, err = s.openFillSource(ctx, v, f.Source)
			}
			if err == nil {
				err = v.Fill(ctx, src, nil)
			}
			if err == nil {
				s.log.Info("instant restore complete", "volume", v.Name(), "source", f.Source)
				return
			}
			if errors.Is(err, pool.ErrVolumeNotFound) || errors.Is(err, pool.ErrClosed) || ctx.Err() != nil {
				return
			}
			s.log.Warn("instant restore: the copy failed; it resumes later (the VM's reads of blocks not copied yet fail meanwhile)",
				"volume", v.Name(), "source", f.Source, "attempt", attempt+1, "retry in", fillRetry, "err", err)
			select {
			case <-ctx.Done():
				return
			case <-time.After(fillRetry):
			}
		}
	}()
}

// openFillSource opens the backup named by a volume's fill record.
func (s *Service) openFillSource(ctx context.Context, v *pool.Volume, ref string) (*backupSource, error) {
	target, id, ok := parseFillRef(ref)
	if !ok {
		return nil, fmt.Errorf("volume %s fills from %q, not a backup: %w", v.Name(), ref, pool.ErrInvalid)
	}
	r, err := s.Repo(ctx, target)
	if err != nil {
		return nil, err
	}
	m, err := r.Get(ctx, id)
	if err != nil {
		return nil, err
	}
	var disks []pool.DiskSpec
	for _, d := range v.Info().Disks {
		disks = append(disks, pool.DiskSpec{Name: d.Name, Size: d.Size})
	}
	return openBackupSource(ctx, r, m, disks)
}

// Close stops the copies running in the background and waits for them.
func (s *Service) Close() {
	s.cancel()
	s.fills.Wait()
}
