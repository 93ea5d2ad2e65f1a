package apiserver

import (
	"cmp"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"slices"

	"github.com/quiverstorage/quiver/internal/api"
	"github.com/quiverstorage/quiver/internal/cluster"
)

// Cross-volume reads on a cluster node (docs/security.md, "Tenants on a
// cluster"): a tenant's GET /v1/snapshots, GET /v1/attachments and GET
// /v1/pool answer from the tenant's placements in etcd, the same on every
// node, as its volume list does. A node-wide caller's GET /v1/snapshots is
// the cluster's too (every placed volume's, and this node's own volumes
// that are not placed); its attachments and pool are the node's own.

// tenantPlacements returns the placements the caller sees (a tenant: its
// own) whose labels match (nil: all), sorted by name; with those being
// deleted when deleting says so.
func (s *Server) tenantPlacements(r *http.Request, match func(map[string]string) bool, deleting bool) ([]cluster.Placement, error) {
	ps, err := s.Cluster.Placements(r.Context())
	if err != nil {
		return nil, fmt.Errorf("%w: %w", errUnavailable, err)
	}
	return seenPlacements(r, ps, match, deleting), nil
}

// seenPlacements are the placements of ps that the caller sees (a
// tenant: its own) whose labels match (nil: all), sorted by name; with
// those being deleted when deleting says so.
//
// The snapshot and attachment lists leave a deleting volume out: it takes
// no attachment, clone or rollback, its snapshots go with its copies, and
// its primary's node is often the one down that keeps it deleting, so
// asking it would fail the whole list (503) until that node is back. The
// pool's counts keep it: it holds its space, and counts in its tenant's
// use, until its last copy is gone, and the volume list shows it.
func seenPlacements(r *http.Request, ps map[string]cluster.Placement, match func(map[string]string) bool, deleting bool) []cluster.Placement {
	p := principalOf(r)
	var out []cluster.Placement
	for _, pl := range ps {
		if !p.Sees(pl.Spec.Tenant) || (pl.Deleting && !deleting) || (match != nil && !match(pl.Spec.Labels)) {
			continue
		}
		out = append(out, pl)
	}
	slices.SortFunc(out, func(a, b cluster.Placement) int { return cmp.Compare(a.Volume, b.Volume) })
	return out
}

// findClusterSnapshots answers GET /v1/snapshots on a cluster node: the
// snapshots of each placed volume the caller sees matching match (named
// name, when given), read from this node's copy, else asked of the
// volume's primary (one hop per such volume, for the caller: the primary
// serves it through the caller's checks); for a node-wide caller, with
// those of this node's volumes that are not placed. A primary down or not
// answering fails the whole list (503): a list missing a volume's
// snapshots would let a CSI name check pass wrongly.
func (s *Server) findClusterSnapshots(w http.ResponseWriter, r *http.Request, match func(map[string]string) bool, name string) error {
	ps, err := s.Cluster.Placements(r.Context())
	if err != nil {
		return fmt.Errorf("%w: %w", errUnavailable, err)
	}
	pls := seenPlacements(r, ps, match, false)
	var apis map[string]string // node -> API address, of the nodes up; read once when needed
	out := api.List[api.Snapshot]{Items: []api.Snapshot{}}
	for _, pl := range pls {
		var snaps []api.Snapshot
		if v, err := s.pool.Volume(pl.Volume); err == nil {
			for _, sn := range v.Snapshots() {
				snaps = append(snaps, viewOf(r).snapshot(snapshotToAPI(sn)))
			}
		} else {
			if apis == nil {
				if apis, err = s.nodeAPIs(r); err != nil {
					return err
				}
			}
			if snaps, err = s.peerSnapshots(r, pl, apis[pl.Primary]); err != nil {
				return err
			}
		}
		for _, sn := range snaps {
			if name == "" || sn.Name == name {
				out.Items = append(out.Items, sn)
			}
		}
	}
	if principalOf(r).Tenant == "" {
		// This node's own volumes, made before it joined the cluster.
		for _, sn := range s.pool.FindSnapshots(match, name) {
			if _, placed := ps[sn.Volume]; !placed {
				out.Items = append(out.Items, viewOf(r).snapshot(snapshotToAPI(sn)))
			}
		}
		slices.SortStableFunc(out.Items, func(a, b api.Snapshot) int { return cmp.Compare(a.Volume, b.Volume) })
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

// nodeAPIs maps the name of each node up to its API address.
func (s *Server) nodeAPIs(r *http.Request) (map[string]string, error) {
	nodes, err := s.Cluster.Nodes(r.Context())
	if err != nil {
		return nil, fmt.Errorf("%w: %w", errUnavailable, err)
	}
	out := map[string]string{}
	for _, n := range nodes {
		if n.Up {
			out[n.Name] = n.API
		}
	}
	return out, nil
}

// peerSnapshots lists the snapshots of a placed volume of the caller's
// tenant that this node has no copy of, as its primary at addr answers
// them to the caller (in the caller's names). A volume gone meanwhile has
// none.
func (s *Server) peerSnapshots(r *http.Request, pl cluster.Placement, addr string) ([]api.Snapshot, error) {
	return peerList[api.Snapshot](s, r, pl, addr, "snapshots")
}

// peerList is what the volume's primary at addr answers the caller to GET
// /v1/volumes/{volume}/<what> (in the caller's names); a volume gone
// meanwhile has none.
func peerList[T any](s *Server, r *http.Request, pl cluster.Placement, addr, what string) ([]T, error) {
	name := viewOf(r).name(pl.Volume)
	if s.Peers == nil {
		return nil, fmt.Errorf("%s of volume %q: its copies are on other nodes, and this node carries no request to them: %w",
			what, name, errUnavailable)
	}
	uri := "/v1/volumes/" + url.PathEscape(name) + "/" + what
	resp, body, err := s.hop(r, pl.Primary, addr, http.MethodGet, uri, nil)
	if err != nil {
		return nil, err
	}
	switch resp.StatusCode {
	case http.StatusOK:
	case http.StatusNotFound:
		return nil, nil
	default:
		return nil, fmt.Errorf("%s of volume %q from its primary %s: %d %s: %w", what, name, pl.Primary, resp.StatusCode, body,
			errUnavailable)
	}
	var l api.List[T]
	if err := json.Unmarshal(body, &l); err != nil {
		return nil, fmt.Errorf("%s of volume %q from its primary %s: %v: %w", what, name, pl.Primary, err, errUnavailable)
	}
	return l.Items, nil
}

// findClusterAttachments answers a tenant's GET /v1/attachments on a
// cluster node: the attachments of each of its placed volumes matching
// match, which the volume's primary holds (a copy's node holds only the
// primary's replication attachment): this node's own when it is the
// primary, else asked of the primary (one hop per such volume). A primary
// down or not answering fails the whole list (503) rather than leave a
// volume's attachments out.
func (s *Server) findClusterAttachments(w http.ResponseWriter, r *http.Request, match func(map[string]string) bool) error {
	pls, err := s.tenantPlacements(r, match, false)
	if err != nil {
		return err
	}
	var apis map[string]string
	out := api.List[api.Attachment]{Items: []api.Attachment{}}
	for _, pl := range pls {
		if v, err := s.pool.Volume(pl.Volume); err == nil && pl.Primary == s.Cluster.Name() {
			for _, a := range v.Attachments() {
				out.Items = append(out.Items, viewOf(r).attachment(attachmentToAPI(a)))
			}
			continue
		}
		if apis == nil {
			if apis, err = s.nodeAPIs(r); err != nil {
				return err
			}
		}
		addr, up := apis[pl.Primary]
		if !up {
			return fmt.Errorf("attachments of volume %q: its primary %s is down: %w", viewOf(r).name(pl.Volume), pl.Primary,
				errUnavailable)
		}
		atts, err := peerList[api.Attachment](s, r, pl, addr, "attachments")
		if err != nil {
			return err
		}
		out.Items = append(out.Items, atts...)
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

// tenantPoolCounts are the volume count and the provisioned bytes (the sum
// of the disks' sizes) of the caller's tenant's placed volumes, those
// being deleted among them, as its volume list and its use count them.
func (s *Server) tenantPoolCounts(r *http.Request) (volumes int, provisioned int64, err error) {
	pls, err := s.tenantPlacements(r, nil, true)
	if err != nil {
		return 0, 0, err
	}
	for _, pl := range pls {
		for _, d := range pl.Spec.Disks {
			provisioned += d.Size
		}
	}
	return len(pls), provisioned, nil
}
