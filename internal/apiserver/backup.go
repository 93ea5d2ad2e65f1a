package apiserver

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/quiverstorage/quiver/internal/api"
	"github.com/quiverstorage/quiver/internal/auth"
	"github.com/quiverstorage/quiver/internal/backup"
	"github.com/quiverstorage/quiver/internal/cluster"
	"github.com/quiverstorage/quiver/internal/job"
	"github.com/quiverstorage/quiver/internal/pool"
)

// Backups (docs/backup.md): the routes reach the backup service of this
// node. They are the storage admin's: a tenant's token is refused, since a
// target holds the backups of every tenant.

// backups returns the service, or why there is none.
func (s *Server) backups(r *http.Request) (*backup.Service, error) {
	if principalOf(r).Tenant != "" {
		return nil, fmt.Errorf("backups are kept per server, for every tenant: a tenant's token cannot reach them: %w", auth.ErrForbidden)
	}
	if s.Backups == nil {
		return nil, fmt.Errorf("this server has no backup targets: start it with --backup-config FILE (docs/backup.md): %w", backup.ErrNoTarget)
	}
	return s.Backups, nil
}

// targetOf is the target a request names (?target= or the body's), or the
// server's only one.
func targetOf(svc *backup.Service, named string) (string, error) {
	if named != "" {
		return named, nil
	}
	if t := svc.Default(); t != "" {
		return t, nil
	}
	return "", fmt.Errorf("target: the server has several backup targets: name one (--target): %w", backup.ErrInvalid)
}

func (s *Server) listBackupTargets(w http.ResponseWriter, r *http.Request) error {
	svc, err := s.backups(r)
	if err != nil {
		return err
	}
	out := api.List[api.BackupTarget]{Items: []api.BackupTarget{}}
	for _, t := range svc.Targets(r.Context()) {
		out.Items = append(out.Items, api.BackupTarget{Name: t.Name, Store: t.Store, Repository: t.Repository, Error: t.Error})
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

func (s *Server) initBackupTarget(w http.ResponseWriter, r *http.Request) error {
	svc, err := s.backups(r)
	if err != nil {
		return err
	}
	t, err := svc.Init(r.Context(), r.PathValue("target"))
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusCreated, api.BackupTarget{Name: t.Name, Store: t.Store, Repository: t.Repository})
	return nil
}

func (s *Server) collectBackupTarget(w http.ResponseWriter, r *http.Request) error {
	svc, err := s.backups(r)
	if err != nil {
		return err
	}
	repo, err := svc.Repo(r.Context(), r.PathValue("target"))
	if err != nil {
		return err
	}
	removed, freed, err := repo.Collect(r.Context())
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, map[string]int64{"chunksRemoved": int64(removed), "bytesFreed": freed})
	return nil
}

func (s *Server) createBackup(w http.ResponseWriter, r *http.Request) error {
	svc, err := s.backups(r)
	if err != nil {
		return err
	}
	var spec api.BackupSpec
	if err := decode(r, &spec); err != nil {
		return err
	}
	target, err := targetOf(svc, spec.Target)
	if err != nil {
		return err
	}
	v, err := s.volume(r)
	if err != nil {
		return err
	}
	if _, err := svc.Repo(r.Context(), target); err != nil {
		return err // a missing repository or a wrong key is a 4xx here, not a failed job
	}
	var m *backup.Manifest
	return s.runJob(w, r, "backup", v.Name()+"@"+target, 1, func(ctx context.Context, j *job.Job) error {
		var err error
		if m, err = svc.Backup(ctx, v.Name(), target, spec.Full, j); err == nil {
			j.Done(m.ID)
		}
		return err
	}, func() error {
		writeJSON(w, http.StatusCreated, backupToAPI(target, m))
		return nil
	})
}

func (s *Server) listBackups(w http.ResponseWriter, r *http.Request) error {
	svc, err := s.backups(r)
	if err != nil {
		return err
	}
	target, err := targetOf(svc, r.URL.Query().Get("target"))
	if err != nil {
		return err
	}
	volume := r.URL.Query().Get("volume")
	if volume != "" {
		if err := pool.ValidateName("volume", volume); err != nil {
			return err
		}
	}
	repo, err := svc.Repo(r.Context(), target)
	if err != nil {
		return err
	}
	list, bad, err := repo.List(r.Context(), volume)
	if err != nil {
		return err
	}
	out := api.List[api.Backup]{Items: []api.Backup{}}
	for _, m := range list {
		out.Items = append(out.Items, backupToAPI(target, m))
	}
	if len(bad) > 0 {
		s.log.Warn("backup manifests that cannot be read", "target", target, "count", len(bad), "first", bad[0])
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

// backupOf finds the backup a request names.
func (s *Server) backupOf(r *http.Request) (*backup.Service, *backup.Repository, string, *backup.Manifest, error) {
	svc, err := s.backups(r)
	if err != nil {
		return nil, nil, "", nil, err
	}
	target, err := targetOf(svc, r.URL.Query().Get("target"))
	if err != nil {
		return nil, nil, "", nil, err
	}
	repo, err := svc.Repo(r.Context(), target)
	if err != nil {
		return nil, nil, "", nil, err
	}
	m, err := repo.Get(r.Context(), r.PathValue("id"))
	if err != nil {
		return nil, nil, "", nil, err
	}
	return svc, repo, target, m, nil
}

func (s *Server) getBackup(w http.ResponseWriter, r *http.Request) error {
	_, _, target, m, err := s.backupOf(r)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, backupToAPI(target, m))
	return nil
}

func (s *Server) deleteBackup(w http.ResponseWriter, r *http.Request) error {
	_, repo, _, m, err := s.backupOf(r)
	if err != nil {
		return err
	}
	if err := repo.Delete(r.Context(), m.ID); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

func (s *Server) restoreBackup(w http.ResponseWriter, r *http.Request) error {
	svc, _, target, m, err := s.backupOf(r)
	if err != nil {
		return err
	}
	var spec api.RestoreSpec
	if err := decode(r, &spec); err != nil {
		return err
	}
	if err := pool.ValidateName("volume", spec.Volume); err != nil {
		return err
	}
	if s.Cluster != nil {
		// A volume of a cluster is placed through etcd; the restore makes
		// a volume of this node's pool only.
		return fmt.Errorf("restore on a cluster node is not built yet: restore on a single node, or boot from the backup's "+
			"export (docs/backup.md): %w", cluster.ErrNotSupported)
	}
	if _, err := s.pool.Volume(spec.Volume); err == nil {
		return fmt.Errorf("volume %s already exists; restore into a new volume: %w", spec.Volume, pool.ErrExists)
	}
	if spec.Instant {
		info, err := svc.InstantRestore(r.Context(), target, m.ID, spec.Volume, spec.Disks)
		if err != nil {
			return err
		}
		writeJSON(w, http.StatusCreated, viewOf(r).volume(volumeToAPI(info)))
		return nil
	}
	var info pool.VolumeInfo
	return s.runJob(w, r, "restore", m.ID+"->"+spec.Volume, 1, func(ctx context.Context, j *job.Job) error {
		var err error
		if info, err = svc.Restore(ctx, target, m.ID, spec.Volume, spec.Disks, j); err == nil {
			j.Done(spec.Volume)
		}
		return err
	}, func() error {
		writeJSON(w, http.StatusCreated, viewOf(r).volume(volumeToAPI(info)))
		return nil
	})
}

func (s *Server) verifyBackup(w http.ResponseWriter, r *http.Request) error {
	_, repo, _, m, err := s.backupOf(r)
	if err != nil {
		return err
	}
	var bad []backup.BadChunk
	return s.runJob(w, r, "verify", m.ID, 1, func(ctx context.Context, j *job.Job) error {
		var err error
		if bad, err = repo.Verify(ctx, m, j, 4); err != nil {
			return err
		}
		if len(bad) > 0 {
			var where []string
			for _, b := range bad {
				where = append(where, fmt.Sprintf("disk %s at %d (block %s in pack %s)", b.Disk, b.Offset, b.ID, b.Pack))
			}
			return fmt.Errorf("backup %s: %d blocks damaged: %s: %w", m.ID, len(bad), strings.Join(where, "; "), backup.ErrCorrupt)
		}
		j.Done(m.ID)
		return nil
	}, func() error {
		out := api.BackupVerify{Backup: m.ID, Bad: []api.BadChunk{}}
		for _, b := range bad {
			out.Bad = append(out.Bad, api.BadChunk{ID: b.ID, Pack: b.Pack, Disk: b.Disk, Offset: b.Offset, Error: b.Error})
		}
		writeJSON(w, http.StatusOK, out)
		return nil
	})
}

// setDirectAccess records that a node hands the volume's image files to a
// VM (the CSI node plugin, before it binds them): change tracking counts
// every disk changed until it is cleared.
func (s *Server) setDirectAccess(w http.ResponseWriter, r *http.Request) error {
	return s.directAccess(w, r, true)
}

func (s *Server) clearDirectAccess(w http.ResponseWriter, r *http.Request) error {
	return s.directAccess(w, r, false)
}

func (s *Server) directAccess(w http.ResponseWriter, r *http.Request, on bool) error {
	v, err := s.volume(r)
	if err != nil {
		return err
	}
	info, err := v.SetDirectAccess(r.Context(), r.PathValue("holder"), on)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, viewOf(r).volume(volumeToAPI(info)))
	return nil
}

func (s *Server) setBackupPolicy(w http.ResponseWriter, r *http.Request) error {
	svc, err := s.backups(r)
	if err != nil {
		return err
	}
	var p api.BackupPolicy
	if err := decode(r, &p); err != nil {
		return err
	}
	every, err := time.ParseDuration(p.Every)
	if err != nil {
		return fmt.Errorf("every %q: a duration such as 30m or 24h: %w", p.Every, pool.ErrInvalid)
	}
	target, err := targetOf(svc, p.Target)
	if err != nil {
		return err
	}
	if _, err := svc.Repo(r.Context(), target); err != nil {
		return err // an unknown target, or one without a repository: said now, not at the first backup
	}
	v, err := s.volume(r)
	if err != nil {
		return err
	}
	info, err := v.SetBackupPolicy(r.Context(), &pool.BackupPolicy{Every: every, Target: p.Target, KeepLast: p.KeepLast,
		KeepDaily: p.KeepDaily, KeepWeekly: p.KeepWeekly, KeepMonthly: p.KeepMonthly})
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, viewOf(r).volume(volumeToAPI(info)))
	return nil
}

func (s *Server) deleteBackupPolicy(w http.ResponseWriter, r *http.Request) error {
	if _, err := s.backups(r); err != nil {
		return err
	}
	v, err := s.volume(r)
	if err != nil {
		return err
	}
	info, err := v.SetBackupPolicy(r.Context(), nil)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, viewOf(r).volume(volumeToAPI(info)))
	return nil
}

func (s *Server) backupStatus(w http.ResponseWriter, r *http.Request) error {
	svc, err := s.backups(r)
	if err != nil {
		return err
	}
	now := time.Now()
	out := api.List[api.BackupStatus]{Items: []api.BackupStatus{}}
	for _, st := range svc.Statuses(r.Context()) {
		b := api.BackupStatus{Volume: st.Volume, Target: st.Target, LastSuccess: st.LastSuccess, LastBackup: st.LastBackup,
			LastError: st.LastError, Overdue: st.Overdue(now), BytesSent: st.BytesSent, Dedup: st.Dedup, Failures: st.Failures}
		if st.Every > 0 {
			b.Every = st.Every.String()
		}
		out.Items = append(out.Items, b)
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

func backupToAPI(target string, m *backup.Manifest) api.Backup {
	if m == nil {
		return api.Backup{}
	}
	b := api.Backup{ID: m.ID, Target: target, Volume: m.Volume, Snapshot: m.Snapshot, Parent: m.Parent, CreatedAt: m.CreatedAt,
		Labels: m.Labels, Stats: api.BackupStats{Logical: m.Stats.Logical, BytesRead: m.Stats.BytesRead, BytesSent: m.Stats.BytesSent,
			ChunksNew: m.Stats.ChunksNew, ChunksReused: m.Stats.ChunksReused, ChunksZero: m.Stats.ChunksZero, Duration: m.Stats.Duration}}
	for _, d := range m.Disks {
		b.Disks = append(b.Disks, api.Disk{Name: d.Name, Size: d.Size})
	}
	return b
}
