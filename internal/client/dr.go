package client

import (
	"bytes"
	"context"
	"net/http"
	"net/url"
	"strconv"

	"github.com/quiverstorage/quiver/internal/api"
)

// The DR target's side (issue 34): a source site drives these on the
// target site's API.

func drTargetPath(rel string) string { return "/dr/targets/" + url.PathEscape(rel) }

// DRTargets lists the relationships this site is the target of.
func (c *Client) DRTargets(ctx context.Context) ([]api.DRTarget, error) {
	var out api.List[api.DRTarget]
	err := c.do(ctx, http.MethodGet, "/dr/targets", nil, nil, &out)
	return out.Items, err
}

// DRTarget returns the target of relationship rel.
func (c *Client) DRTarget(ctx context.Context, rel string) (api.DRTarget, error) {
	var out api.DRTarget
	err := c.do(ctx, http.MethodGet, drTargetPath(rel), nil, nil, &out)
	return out, err
}

// DRAccept makes a new, empty volume the target of a relationship.
func (c *Client) DRAccept(ctx context.Context, spec api.DRAccept) (api.DRTarget, error) {
	var out api.DRTarget
	err := c.do(ctx, http.MethodPost, "/dr/targets", nil, spec, &out)
	return out, err
}

// DRPromote ends a relationship on its target: the volume returns to its
// last point and becomes an ordinary volume.
func (c *Client) DRPromote(ctx context.Context, rel string) (api.Volume, error) {
	var out api.Volume
	err := c.do(ctx, http.MethodPost, drTargetPath(rel)+"/promote", nil, nil, &out)
	return out, err
}

// DRBegin starts applying a point.
func (c *Client) DRBegin(ctx context.Context, rel string, spec api.DRBegin) error {
	return c.do(ctx, http.MethodPost, drTargetPath(rel)+"/begin", nil, spec, nil)
}

// DRWrite writes data at off of a disk of the point being applied.
func (c *Client) DRWrite(ctx context.Context, rel, disk string, off int64, data []byte) error {
	q := url.Values{"offset": {strconv.FormatInt(off, 10)}}
	return c.doBody(ctx, http.MethodPut, drTargetPath(rel)+"/disks/"+url.PathEscape(disk)+"/data", q,
		"application/octet-stream", bytes.NewReader(data), nil)
}

// DRZero zeroes a range of a disk of the point being applied.
func (c *Client) DRZero(ctx context.Context, rel, disk string, off, length int64) error {
	return c.do(ctx, http.MethodPost, drTargetPath(rel)+"/disks/"+url.PathEscape(disk)+"/zero", nil,
		api.DRZero{Offset: off, Length: length}, nil)
}

// DRCommit makes the point being applied the target's last point.
func (c *Client) DRCommit(ctx context.Context, rel string, p api.DRPoint) error {
	return c.do(ctx, http.MethodPost, drTargetPath(rel)+"/commit", nil, p, nil)
}

// The source's side.

// DRSites lists the sites this server ships to.
func (c *Client) DRSites(ctx context.Context) ([]api.DRSite, error) {
	var out api.List[api.DRSite]
	err := c.do(ctx, http.MethodGet, "/dr/sites", nil, nil, &out)
	return out.Items, err
}

// DRSync ships a point of a volume to a site's target and returns what
// the cycle did, once the target committed it.
func (c *Client) DRSync(ctx context.Context, volume string, spec api.DRSync) (api.DRCycle, error) {
	var out api.DRCycle
	err := c.do(ctx, http.MethodPost, "/volumes/"+url.PathEscape(volume)+"/dr/sync", nil, spec, &out)
	return out, err
}

// SetDRPolicy sets a volume's DR relationship: its points are shipped by
// the server's scheduler to hold the policy's RPO.
func (c *Client) SetDRPolicy(ctx context.Context, volume string, p api.DRPolicy) (api.Volume, error) {
	var v api.Volume
	err := c.do(ctx, http.MethodPut, "/volumes/"+url.PathEscape(volume)+"/dr-policy", nil, p, &v)
	return v, err
}

// DeleteDRPolicy removes a volume's DR relationship (the points on both
// sites stay).
func (c *Client) DeleteDRPolicy(ctx context.Context, volume string) (api.Volume, error) {
	var v api.Volume
	err := c.do(ctx, http.MethodDelete, "/volumes/"+url.PathEscape(volume)+"/dr-policy", nil, nil, &v)
	return v, err
}

// DRStatus lists the relationships of the server's volumes with a DR
// policy: their lag, last point and cycles.
func (c *Client) DRStatus(ctx context.Context) ([]api.DRStatus, error) {
	var out api.List[api.DRStatus]
	err := c.do(ctx, http.MethodGet, "/dr/status", nil, nil, &out)
	return out.Items, err
}

// DRDemote makes a volume, a source of relationship rel until now, the
// target of rel on this site: the other site's next cycle ships only what
// changed since the last point both had.
func (c *Client) DRDemote(ctx context.Context, volume, rel string) (api.DRTarget, error) {
	var out api.DRTarget
	err := c.do(ctx, http.MethodPost, "/volumes/"+url.PathEscape(volume)+"/dr/demote", nil, api.DRDemote{Relationship: rel}, &out)
	return out, err
}
