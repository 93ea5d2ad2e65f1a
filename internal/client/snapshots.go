package client

import (
	"context"
	"net/http"
	"net/url"
	"strconv"

	"github.com/quiverstorage/quiver/internal/api"
)

// asyncQuery asks a long operation to answer at once with a Job.
var asyncQuery = url.Values{"async": {"true"}}

// ListSnapshots lists the snapshots of a volume.
func (c *Client) ListSnapshots(ctx context.Context, volume string) ([]api.Snapshot, error) {
	p, err := segment("volume", volume)
	if err != nil {
		return nil, err
	}
	var list api.List[api.Snapshot]
	err = c.do(ctx, http.MethodGet, "/volumes/"+p+"/snapshots", nil, nil, &list)
	return list.Items, err
}

// FindSnapshots lists the snapshots of every volume matching selector (all
// volumes when ""), only those called name when name is not "".
func (c *Client) FindSnapshots(ctx context.Context, selector, name string) ([]api.Snapshot, error) {
	query := url.Values{}
	if selector != "" {
		query.Set("selector", selector)
	}
	if name != "" {
		query.Set("name", name)
	}
	var list api.List[api.Snapshot]
	err := c.do(ctx, http.MethodGet, "/snapshots", query, nil, &list)
	return list.Items, err
}

// CreateSnapshot snapshots every disk of a volume and returns when the
// snapshot is complete. A taken name fails with IsConflict, unless opts allow
// the existing snapshot (IdempotencyKey, IdempotentCreate).
func (c *Client) CreateSnapshot(ctx context.Context, volume, name string, opts ...CallOption) (api.Snapshot, error) {
	var s api.Snapshot
	p, err := segment("volume", volume)
	if err != nil {
		return s, err
	}
	err = c.do(ctx, http.MethodPost, "/volumes/"+p+"/snapshots", nil, api.SnapshotSpec{Name: name}, &s, opts...)
	return s, err
}

// StartSnapshot starts a snapshot as a job and returns at once; follow it
// with WaitJob.
func (c *Client) StartSnapshot(ctx context.Context, volume, name string, opts ...CallOption) (api.Job, error) {
	p, err := segment("volume", volume)
	if err != nil {
		return api.Job{}, err
	}
	return c.startJob(ctx, "/volumes/"+p+"/snapshots", api.SnapshotSpec{Name: name}, opts...)
}

// GetSnapshot returns one snapshot of a volume.
func (c *Client) GetSnapshot(ctx context.Context, volume, name string) (api.Snapshot, error) {
	var s api.Snapshot
	p, err := snapshotPath(volume, name)
	if err != nil {
		return s, err
	}
	err = c.do(ctx, http.MethodGet, p, nil, nil, &s)
	return s, err
}

// SnapshotChanges returns what changed in each disk of a volume since
// snapshot from: up to snapshot to, or the live disks when to is "".
func (c *Client) SnapshotChanges(ctx context.Context, volume, from, to string) (api.SnapshotChanges, error) {
	var out api.SnapshotChanges
	p, err := snapshotPath(volume, from)
	if err != nil {
		return out, err
	}
	query := url.Values{}
	if to != "" {
		if _, err := segment("snapshot", to); err != nil {
			return out, err
		}
		query.Set("to", to)
	}
	err = c.do(ctx, http.MethodGet, p+"/changes", query, nil, &out)
	return out, err
}

// SnapshotAllocated returns the data ranges of disk of a snapshot from
// offset on, at most limit of them (0: the server's default); the answer's
// Next, when not 0, is the offset to ask from for the rest.
func (c *Client) SnapshotAllocated(ctx context.Context, volume, snapshot, disk string, offset int64, limit int) (api.SnapshotAllocated, error) {
	var out api.SnapshotAllocated
	p, err := snapshotPath(volume, snapshot)
	if err != nil {
		return out, err
	}
	if _, err := segment("disk", disk); err != nil {
		return out, err
	}
	query := url.Values{"disk": {disk}}
	if offset != 0 {
		query.Set("offset", strconv.FormatInt(offset, 10))
	}
	if limit != 0 {
		query.Set("limit", strconv.Itoa(limit))
	}
	err = c.do(ctx, http.MethodGet, p+"/allocated", query, nil, &out)
	return out, err
}

// DeleteSnapshot deletes one snapshot of a volume.
func (c *Client) DeleteSnapshot(ctx context.Context, volume, name string) error {
	p, err := snapshotPath(volume, name)
	if err != nil {
		return err
	}
	return c.do(ctx, http.MethodDelete, p, nil, nil, nil)
}

// Rollback returns every disk of a volume to a snapshot and returns the
// volume when done. While writers are connected to the volume it fails with
// IsInUse, unless opts hold Force.
func (c *Client) Rollback(ctx context.Context, volume, snapshot string, opts ...CallOption) (api.Volume, error) {
	var v api.Volume
	p, err := segment("volume", volume)
	if err != nil {
		return v, err
	}
	err = c.do(ctx, http.MethodPost, "/volumes/"+p+"/rollback", nil, api.RollbackSpec{Snapshot: snapshot}, &v, opts...)
	return v, err
}

// StartRollback starts a rollback as a job and returns at once.
func (c *Client) StartRollback(ctx context.Context, volume, snapshot string, opts ...CallOption) (api.Job, error) {
	p, err := segment("volume", volume)
	if err != nil {
		return api.Job{}, err
	}
	return c.startJob(ctx, "/volumes/"+p+"/rollback", api.RollbackSpec{Snapshot: snapshot}, opts...)
}

// Clone makes one or many volumes from a snapshot or a live volume and
// returns them when all are made. A taken name fails with IsConflict before
// any clone is made, unless opts allow it (as for CreateVolume) and it is a
// clone of the same source.
func (c *Client) Clone(ctx context.Context, spec api.CloneSpec, opts ...CallOption) ([]api.Volume, error) {
	var list api.List[api.Volume]
	err := c.do(ctx, http.MethodPost, "/clones", nil, spec, &list, opts...)
	return list.Items, err
}

// StartClone starts a clone as a job and returns at once.
func (c *Client) StartClone(ctx context.Context, spec api.CloneSpec, opts ...CallOption) (api.Job, error) {
	return c.startJob(ctx, "/clones", spec, opts...)
}

func snapshotPath(volume, snapshot string) (string, error) {
	v, err := segment("volume", volume)
	if err != nil {
		return "", err
	}
	s, err := segment("snapshot", snapshot)
	if err != nil {
		return "", err
	}
	return "/volumes/" + v + "/snapshots/" + s, nil
}
