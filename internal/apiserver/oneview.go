package apiserver

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"slices"
	"sync"
	"time"

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

// usageTimeout bounds the wait for each node's part of a cluster's space
// usage (it reads every extent map of that node's pool).
const usageTimeout = 60 * time.Second

// clusterUsage answers GET /v1/usage on a cluster node: each placed volume
// the selector matches is measured on its primary's copy (this node's
// pool, or the primary's answer to a hop, one per node, in parallel), the
// same answer through every node, with this node's own volumes that are
// not placed. A volume being deleted is left out (its space goes with
// it). A node that does not answer is named with its volumes
// (NodeSpaceUsage.Missing), the others' still answered: a space report is
// worth having while a node is down.
func (s *Server) clusterUsage(w http.ResponseWriter, r *http.Request, match func(map[string]string) bool) error {
	ps, err := s.Cluster.Placements(r.Context())
	if err != nil {
		return fmt.Errorf("%w: %w", errUnavailable, err)
	}
	me := s.Cluster.Name()
	want := map[string][]string{} // node -> the volumes it measures
	for _, pl := range seenPlacements(r, ps, match, false) {
		want[pl.Primary] = append(want[pl.Primary], pl.Volume)
	}
	for _, v := range s.pool.List(match) {
		if _, placed := ps[v.Name]; !placed {
			want[me] = append(want[me], v.Name)
		}
	}
	var apis map[string]string
	for node := range want {
		if node != me && apis == nil {
			if apis, err = s.nodeAPIs(r); err != nil {
				return err
			}
		}
	}
	parts, errs := map[string]api.SpaceUsage{}, map[string]error{}
	if _, ok := want[me]; ok {
		part, err := s.localUsage(match)
		if err != nil {
			return err // this node's own pool failed: no answer of its own to give
		}
		parts[me] = part
	}
	var mu sync.Mutex // parts and errs, from here
	var wg sync.WaitGroup
	for node := range want {
		if node == me {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			part, err := s.peerUsage(r, node, apis[node])
			mu.Lock()
			defer mu.Unlock()
			parts[node], errs[node] = part, err
		}()
	}
	wg.Wait()
	out := api.SpaceUsage{Items: []api.ObjectUsage{}, Nodes: []api.NodeSpaceUsage{}}
	answered := 0
	for _, node := range slices.Sorted(maps.Keys(want)) {
		vols := want[node]
		slices.Sort(vols)
		nu := api.NodeSpaceUsage{Node: node}
		if err := errs[node]; err != nil {
			nu.Error, nu.Missing = err.Error(), vols
			out.Nodes = append(out.Nodes, nu)
			continue
		}
		part := parts[node]
		measured := map[string]bool{}
		for _, it := range part.Items {
			if _, ok := slices.BinarySearch(vols, it.Volume); ok {
				it.Node = node
				out.Items = append(out.Items, it)
				measured[it.Volume] = true
			}
		}
		for _, v := range vols {
			if !measured[v] {
				nu.Missing = append(nu.Missing, v)
			}
		}
		nu.SharedBytes, nu.Exact, nu.PoolSizeBytes, nu.PoolUsedBytes = part.SharedBytes, part.Exact, part.PoolSizeBytes, part.PoolUsedBytes
		out.SharedBytes += part.SharedBytes
		out.PoolSizeBytes += part.PoolSizeBytes
		out.PoolUsedBytes += part.PoolUsedBytes
		out.Exact = part.Exact && (answered == 0 || out.Exact)
		answered++
		out.Nodes = append(out.Nodes, nu)
	}
	// By volume, each volume's items in its node's order (the volume
	// before its snapshots).
	slices.SortStableFunc(out.Items, func(a, b api.ObjectUsage) int { return cmp.Compare(a.Volume, b.Volume) })
	writeJSON(w, http.StatusOK, out)
	return nil
}

// peerUsage is node's own space usage (GET /v1/usage with r's selector,
// carried there for r's caller, which node answers from its own pool).
func (s *Server) peerUsage(r *http.Request, node, addr string) (api.SpaceUsage, error) {
	switch {
	case node == "":
		return api.SpaceUsage{}, errors.New("these volumes have no primary now")
	case s.Peers == nil:
		return api.SpaceUsage{}, errors.New("this node carries no request to other nodes")
	case addr == "":
		return api.SpaceUsage{}, fmt.Errorf("node %s is down", node)
	}
	ctx, cancel := context.WithTimeout(r.Context(), usageTimeout)
	defer cancel()
	uri := "/v1/usage"
	if q := r.URL.RawQuery; q != "" {
		uri += "?" + q
	}
	resp, body, err := s.hop(r.WithContext(ctx), node, addr, http.MethodGet, uri, nil)
	if err != nil {
		return api.SpaceUsage{}, err
	}
	if resp.StatusCode != http.StatusOK {
		return api.SpaceUsage{}, fmt.Errorf("node %s answered %d: %s", node, resp.StatusCode, bytes.TrimSpace(body))
	}
	var u api.SpaceUsage
	if err := json.Unmarshal(body, &u); err != nil {
		return api.SpaceUsage{}, fmt.Errorf("node %s's answer: %w", node, err)
	}
	return u, nil
}
