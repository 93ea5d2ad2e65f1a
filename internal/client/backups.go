package client

import (
	"context"
	"fmt"
	"net/http"
	"net/url"

	"github.com/quiverstorage/quiver/internal/api"
)

// targetQuery names a backup target ("" lets the server pick its only one).
func targetQuery(target string, async bool) url.Values {
	q := url.Values{}
	if target != "" {
		q.Set("target", target)
	}
	if async {
		q.Set("async", "true")
	}
	return q
}

// BackupTargets lists the server's backup targets.
func (c *Client) BackupTargets(ctx context.Context) ([]api.BackupTarget, error) {
	var list api.List[api.BackupTarget]
	err := c.do(ctx, http.MethodGet, "/backup-targets", nil, nil, &list)
	return list.Items, err
}

// InitBackupTarget makes the repository of a target.
func (c *Client) InitBackupTarget(ctx context.Context, target string) (api.BackupTarget, error) {
	var t api.BackupTarget
	p, err := segment("target", target)
	if err != nil {
		return t, err
	}
	err = c.do(ctx, http.MethodPost, "/backup-targets/"+p+"/init", nil, nil, &t)
	return t, err
}

// CollectBackupTarget removes the chunks no backup of a target names.
func (c *Client) CollectBackupTarget(ctx context.Context, target string) (removed, freed int64, err error) {
	p, err := segment("target", target)
	if err != nil {
		return 0, 0, err
	}
	var out struct {
		Removed int64 `json:"chunksRemoved"`
		Freed   int64 `json:"bytesFreed"`
	}
	err = c.do(ctx, http.MethodPost, "/backup-targets/"+p+"/collect", nil, nil, &out)
	return out.Removed, out.Freed, err
}

// StartBackup starts a backup of a volume and returns its job.
func (c *Client) StartBackup(ctx context.Context, volume string, spec api.BackupSpec) (api.Job, error) {
	p, err := segment("volume", volume)
	if err != nil {
		return api.Job{}, err
	}
	return c.startJob(ctx, "/volumes/"+p+"/backups", spec)
}

// ListBackups lists the backups in a target (of one volume when not "").
func (c *Client) ListBackups(ctx context.Context, target, volume string) ([]api.Backup, error) {
	q := targetQuery(target, false)
	if volume != "" {
		q.Set("volume", volume)
	}
	var list api.List[api.Backup]
	err := c.do(ctx, http.MethodGet, "/backups", q, nil, &list)
	return list.Items, err
}

func backupPath(id string) (string, error) {
	p, err := segment("backup", id)
	if err != nil {
		return "", err
	}
	return "/backups/" + p, nil
}

// GetBackup returns one backup.
func (c *Client) GetBackup(ctx context.Context, target, id string) (api.Backup, error) {
	var b api.Backup
	p, err := backupPath(id)
	if err != nil {
		return b, err
	}
	err = c.do(ctx, http.MethodGet, p, targetQuery(target, false), nil, &b)
	return b, err
}

// DeleteBackup deletes one backup.
func (c *Client) DeleteBackup(ctx context.Context, target, id string) error {
	p, err := backupPath(id)
	if err != nil {
		return err
	}
	return c.do(ctx, http.MethodDelete, p, targetQuery(target, false), nil, nil)
}

// StartRestore starts the restore of a backup into a new volume.
func (c *Client) StartRestore(ctx context.Context, target, id string, spec api.RestoreSpec) (api.Job, error) {
	p, err := backupPath(id)
	if err != nil {
		return api.Job{}, err
	}
	return c.startJobQuery(ctx, p+"/restore", targetQuery(target, true), spec)
}

// InstantRestore makes a new volume from a backup that is served at once
// while its content is copied in (spec.Instant is set for the caller);
// Volume.Restore reports the copy.
func (c *Client) InstantRestore(ctx context.Context, target, id string, spec api.RestoreSpec) (api.Volume, error) {
	p, err := backupPath(id)
	if err != nil {
		return api.Volume{}, err
	}
	spec.Instant = true
	var v api.Volume
	err = c.do(ctx, http.MethodPost, p+"/restore", targetQuery(target, false), spec, &v)
	return v, err
}

// StartVerify starts reading back and checking every chunk of a backup.
func (c *Client) StartVerify(ctx context.Context, target, id string) (api.Job, error) {
	p, err := backupPath(id)
	if err != nil {
		return api.Job{}, err
	}
	return c.startJobQuery(ctx, p+"/verify", targetQuery(target, true), nil)
}

func (c *Client) startJobQuery(ctx context.Context, path string, q url.Values, body any) (api.Job, error) {
	var job api.Job
	if err := c.do(ctx, http.MethodPost, path, q, body, &job); err != nil {
		return job, err
	}
	if job.ID == "" {
		return job, fmt.Errorf("POST %s%s: %w", api.Version, path, errNoJob)
	}
	return job, nil
}

// SetBackupPolicy sets a volume's backup schedule and retention.
func (c *Client) SetBackupPolicy(ctx context.Context, volume string, p api.BackupPolicy) (api.Volume, error) {
	var v api.Volume
	seg, err := segment("volume", volume)
	if err != nil {
		return v, err
	}
	err = c.do(ctx, http.MethodPut, "/volumes/"+seg+"/backup-policy", nil, p, &v)
	return v, err
}

// DeleteBackupPolicy removes a volume's backup schedule.
func (c *Client) DeleteBackupPolicy(ctx context.Context, volume string) (api.Volume, error) {
	var v api.Volume
	seg, err := segment("volume", volume)
	if err != nil {
		return v, err
	}
	err = c.do(ctx, http.MethodDelete, "/volumes/"+seg+"/backup-policy", nil, nil, &v)
	return v, err
}

// BackupStatus lists every volume's backups by target: the newest, its age
// against the policy, what it cost.
func (c *Client) BackupStatus(ctx context.Context) ([]api.BackupStatus, error) {
	var list api.List[api.BackupStatus]
	err := c.do(ctx, http.MethodGet, "/backup-status", nil, nil, &list)
	return list.Items, err
}

// SetDirectAccess records (on) or clears that holder (a node) hands the
// volume's image files to a VM; see api.Volume.DirectAccess.
func (c *Client) SetDirectAccess(ctx context.Context, volume, holder string, on bool) error {
	v, err := segment("volume", volume)
	if err != nil {
		return err
	}
	h, err := segment("holder", holder)
	if err != nil {
		return err
	}
	method := http.MethodPut
	if !on {
		method = http.MethodDelete
	}
	return c.do(ctx, method, "/volumes/"+v+"/direct-access/"+h, nil, nil, nil)
}
