package apiserver

import (
	"fmt"
	"net/http"

	"github.com/quiverstorage/quiver/internal/api"

	"github.com/quiverstorage/quiver/internal/pool"
	"github.com/quiverstorage/quiver/internal/quantity"
)

// provisioned is the sum of the virtual sizes of every disk of every
// volume: what the VMs may write, against what the pool holds.
func (s *Server) provisioned() int64 {
	var n int64
	for _, v := range s.pool.List(nil) {
		for _, d := range v.Disks {
			n += d.Size
		}
	}
	return n
}

// getUsage answers GET /v1/usage: the space of this node's volumes, or on
// a cluster node the cluster's (clusterUsage); a request carried here from
// another node gets this node's own, its part of that node's answer.
func (s *Server) getUsage(w http.ResponseWriter, r *http.Request) error {
	match, err := selector(r)
	if err != nil {
		return err
	}
	if s.Cluster != nil && !isHop(r) {
		return s.clusterUsage(w, r, match)
	}
	out, err := s.localUsage(match)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

// localUsage is the space of this node's volumes that match (nil: all),
// each item marked with the node's name on a cluster.
func (s *Server) localUsage(match func(map[string]string) bool) (api.SpaceUsage, error) {
	u, err := s.pool.SpaceUsage(match)
	if err != nil {
		return api.SpaceUsage{}, err
	}
	info, err := s.pool.Info()
	if err != nil {
		return api.SpaceUsage{}, err
	}
	var node string
	if s.Cluster != nil {
		node = s.Cluster.Name()
	}
	out := api.SpaceUsage{Items: make([]api.ObjectUsage, 0, len(u.Objects)), SharedBytes: u.Shared, Exact: u.Exact,
		PoolSizeBytes: info.TotalBytes, PoolUsedBytes: info.TotalBytes - info.FreeBytes}
	for _, o := range u.Objects {
		ou := api.ObjectUsage{Volume: o.Volume, Snapshot: o.Snapshot, Node: node, ProvisionedBytes: o.Provisioned,
			AllocatedBytes: o.Allocated, UniqueBytes: o.Unique, Disks: make([]api.DiskUsage, 0, len(o.Disks))}
		for _, d := range o.Disks {
			ou.Disks = append(ou.Disks, api.DiskUsage{Name: d.Name, ProvisionedBytes: d.Provisioned,
				AllocatedBytes: d.Allocated, UniqueBytes: d.Unique})
		}
		out.Items = append(out.Items, ou)
	}
	return out, nil
}

// checkOvercommit refuses to provision add more bytes when the pool would
// then be provisioned past MaxOvercommit times its size (0: no limit).
// Thin provisioning is the point of a pool, so the limit is a choice of the
// operator (--max-overcommit); the check is advisory under concurrency (two
// creates at once may both pass).
func (s *Server) checkOvercommit(add int64) error {
	if s.MaxOvercommit <= 0 || add <= 0 {
		return nil
	}
	info, err := s.pool.Info()
	if err != nil || info.TotalBytes <= 0 {
		return nil // the create itself will report the pool's trouble
	}
	after := s.provisioned() + add
	if ratio := float64(after) / float64(info.TotalBytes); ratio > s.MaxOvercommit {
		return fmt.Errorf("this would provision %s on a pool of %s (%.2fx), above the server's --max-overcommit %.2fx: delete volumes, grow the pool, or raise the limit: %w",
			quantity.Format(after), quantity.Format(info.TotalBytes), ratio, s.MaxOvercommit, pool.ErrNoSpace)
	}
	return nil
}

// cloneSize is what a clone of src provisions per name: the sizes of the
// snapshot's disks, or of the live volume's. An unknown source is 0 (the
// clone reports it).
func (s *Server) cloneSize(src pool.Source) int64 {
	v, err := s.pool.Volume(src.Volume)
	if err != nil {
		return 0
	}
	var disks []pool.DiskInfo
	if src.Snapshot == "" {
		disks = v.Info().Disks
	} else {
		for _, sn := range v.Snapshots() {
			if sn.Name == src.Snapshot {
				disks = sn.Disks
			}
		}
	}
	var n int64
	for _, d := range disks {
		n += d.Size
	}
	return n
}
