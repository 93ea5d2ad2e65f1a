package client

import (
	"context"
	"net/http"
	"net/url"

	"github.com/quiverstorage/quiver/internal/api"
)

// Pool describes the storage pool the server runs on.
func (c *Client) Pool(ctx context.Context) (api.PoolInfo, error) {
	var info api.PoolInfo
	err := c.do(ctx, http.MethodGet, "/pool", nil, nil, &info)
	return info, err
}

// ListVolumes lists the volumes whose labels match selector ("k=v,k2=v2");
// an empty selector lists every volume.
func (c *Client) ListVolumes(ctx context.Context, selector string) ([]api.Volume, error) {
	var query url.Values
	if selector != "" {
		query = url.Values{"selector": {selector}}
	}
	var list api.List[api.Volume]
	err := c.do(ctx, http.MethodGet, "/volumes", query, nil, &list)
	return list.Items, err
}

// CreateVolume creates a volume with its disks. A taken name fails with
// IsConflict, unless opts allow the existing volume (IdempotencyKey,
// IdempotentCreate) and its spec is the same.
func (c *Client) CreateVolume(ctx context.Context, spec api.VolumeSpec, opts ...CallOption) (api.Volume, error) {
	var v api.Volume
	err := c.do(ctx, http.MethodPost, "/volumes", nil, spec, &v, opts...)
	return v, err
}

// GetVolume returns one volume.
func (c *Client) GetVolume(ctx context.Context, name string) (api.Volume, error) {
	var v api.Volume
	p, err := segment("volume", name)
	if err != nil {
		return v, err
	}
	err = c.do(ctx, http.MethodGet, "/volumes/"+p, nil, nil, &v)
	return v, err
}

// Primary returns where the volume's disks are served now (its primary
// on a cluster). While a failover is under way it fails with
// api.CodeUnavailable: ask again.
func (c *Client) Primary(ctx context.Context, name string) (api.Primary, error) {
	var pr api.Primary
	p, err := segment("volume", name)
	if err != nil {
		return pr, err
	}
	err = c.do(ctx, http.MethodGet, "/volumes/"+p+"/primary", nil, nil, &pr)
	return pr, err
}

// UpdateVolume grows the capacity and/or replaces the labels of a volume.
func (c *Client) UpdateVolume(ctx context.Context, name string, update api.VolumeUpdate) (api.Volume, error) {
	var v api.Volume
	p, err := segment("volume", name)
	if err != nil {
		return v, err
	}
	err = c.do(ctx, http.MethodPatch, "/volumes/"+p, nil, update, &v)
	return v, err
}

// DeleteVolume deletes a volume with its disks. A volume with snapshots is
// refused (IsHasSnapshots) unless opts include Recursive. On a cluster, a
// delete that could not reach every copy's node yet is accepted: the volume
// is then returned, in state deleting (Reason says which copies are left),
// and its nodes finish the delete by themselves; a finished delete returns
// nil.
func (c *Client) DeleteVolume(ctx context.Context, name string, opts ...CallOption) (*api.Volume, error) {
	p, err := segment("volume", name)
	if err != nil {
		return nil, err
	}
	var v api.Volume
	if err := c.do(ctx, http.MethodDelete, "/volumes/"+p, nil, nil, &v, opts...); err != nil {
		return nil, err
	}
	if v.Name == "" {
		return nil, nil
	}
	return &v, nil
}

// AddDisk adds a disk to a volume and returns the volume. A disk of that
// name already there fails with IsConflict, unless opts allow it (as for
// CreateVolume).
func (c *Client) AddDisk(ctx context.Context, volume string, spec api.DiskSpec, opts ...CallOption) (api.Volume, error) {
	var v api.Volume
	p, err := segment("volume", volume)
	if err != nil {
		return v, err
	}
	err = c.do(ctx, http.MethodPost, "/volumes/"+p+"/disks", nil, spec, &v, opts...)
	return v, err
}

// GrowDisk sets a disk's size in bytes (it can only grow) and returns the
// volume.
func (c *Client) GrowDisk(ctx context.Context, volume, disk string, size int64) (api.Volume, error) {
	var v api.Volume
	p, err := diskPath(volume, disk)
	if err != nil {
		return v, err
	}
	err = c.do(ctx, http.MethodPatch, p, nil, api.DiskUpdate{Size: size}, &v)
	return v, err
}

// RemoveDisk removes a disk and its image from a volume and returns the
// volume. While writers are connected to the volume it fails with IsInUse,
// unless opts hold Force.
func (c *Client) RemoveDisk(ctx context.Context, volume, disk string, opts ...CallOption) (api.Volume, error) {
	var v api.Volume
	p, err := diskPath(volume, disk)
	if err != nil {
		return v, err
	}
	err = c.do(ctx, http.MethodDelete, p, nil, nil, &v, opts...)
	return v, err
}

func diskPath(volume, disk string) (string, error) {
	v, err := segment("volume", volume)
	if err != nil {
		return "", err
	}
	d, err := segment("disk", disk)
	if err != nil {
		return "", err
	}
	return "/volumes/" + v + "/disks/" + d, nil
}

// Version returns which quiver the server is.
func (c *Client) Version(ctx context.Context) (api.BuildInfo, error) {
	var v api.BuildInfo
	err := c.do(ctx, http.MethodGet, "/version", nil, nil, &v)
	return v, err
}

// SpaceUsage returns how the pool's space divides among the volumes
// matching selector ("" for all) and their snapshots.
func (c *Client) SpaceUsage(ctx context.Context, selector string) (api.SpaceUsage, error) {
	var u api.SpaceUsage
	query := url.Values{}
	if selector != "" {
		query.Set("selector", selector)
	}
	err := c.do(ctx, http.MethodGet, "/usage", query, nil, &u)
	return u, err
}

// VolumeStats returns the volume's cumulative read and write counters
// (GET /v1/volumes/{volume}/stats).
func (c *Client) VolumeStats(ctx context.Context, name string) (api.VolumeStats, error) {
	var s api.VolumeStats
	p, err := segment("volume", name)
	if err != nil {
		return s, err
	}
	err = c.do(ctx, http.MethodGet, "/volumes/"+p+"/stats", nil, nil, &s)
	return s, err
}

// Rekey rekeys an encrypted volume and returns it: a shallow rekey (a new
// KEK) at once; a deep one (spec.Deep) when every block is under the new
// data key (StartRekey returns at once with its job).
func (c *Client) Rekey(ctx context.Context, name string, spec api.RekeySpec) (api.Volume, error) {
	var v api.Volume
	p, err := segment("volume", name)
	if err != nil {
		return v, err
	}
	err = c.do(ctx, http.MethodPost, "/volumes/"+p+"/rekey", nil, spec, &v)
	return v, err
}

// StartRekey starts a deep rekey as a job and returns at once.
func (c *Client) StartRekey(ctx context.Context, name string, spec api.RekeySpec) (api.Job, error) {
	p, err := segment("volume", name)
	if err != nil {
		return api.Job{}, err
	}
	return c.startJob(ctx, "/volumes/"+p+"/rekey", spec)
}
