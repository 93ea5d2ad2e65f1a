package apiserver

import (
	"cmp"
	"net/http"
	"slices"

	"github.com/quiverstorage/quiver/internal/api"
)

// One view from every node (docs/cluster.md, "Any node's API"): a caller
// without a tenant asking any node of a cluster for the pool or the space
// of the volumes gets the cluster's answer, the same through every node,
// as a tenant's volume list and pool already are.

// clusterPool is the cluster's pool as etcd records it: the space each
// node last reported, the copies placed on it, and the placed volumes
// counted once each. etcd out of reach leaves the figures out, saying so:
// the node's own pool still answers (a CSI driver or a readiness check
// reads its ID and path).
func (s *Server) clusterPool(r *http.Request) *api.ClusterPool {
	out := &api.ClusterPool{Nodes: []api.PoolNode{}}
	nodes, err := s.Cluster.Nodes(r.Context())
	if err != nil {
		s.log.Warn("pool: list nodes", "err", err)
		out.Unavailable = "the cluster's state (etcd) is out of reach: " + err.Error()
		return out
	}
	ps, err := s.Cluster.Placements(r.Context())
	if err != nil {
		s.log.Warn("pool: list placements", "err", err)
		out.Unavailable = "the cluster's state (etcd) is out of reach: " + err.Error()
		return out
	}
	for _, n := range nodes {
		an := nodeToAPI(n, s.Cluster.Name())
		out.Nodes = append(out.Nodes, api.PoolNode{Name: an.Name, State: an.State, Drain: an.Drain,
			CapacityBytes: an.CapacityBytes, FreeBytes: an.FreeBytes, Copies: an.Volumes, Self: an.Self})
		out.TotalBytes += n.TotalBytes
		out.FreeBytes += n.FreeBytes
	}
	slices.SortFunc(out.Nodes, func(a, b api.PoolNode) int { return cmp.Compare(a.Name, b.Name) })
	for _, pl := range ps {
		out.Volumes++
		for _, d := range pl.Spec.Disks {
			out.ProvisionedBytes += d.Size
		}
	}
	return out
}
