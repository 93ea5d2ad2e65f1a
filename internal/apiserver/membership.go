package apiserver

import (
	"context"
	"fmt"
	"net/http"

	"github.com/quiverstorage/quiver/internal/api"
	"github.com/quiverstorage/quiver/internal/cluster"
	"github.com/quiverstorage/quiver/internal/job"
)

// Membership adds and removes the cluster's nodes (docs/cluster.md,
// "Adding and removing nodes"). *cluster.Node implements it.
type Membership interface {
	// AddMember adds an etcd member (a learner) for a new node and returns
	// the flags it starts with.
	AddMember(ctx context.Context, name string, peerURLs []string) (cluster.AddedMember, error)
	// RemoveNode removes a drained node that holds no copy: its records,
	// then its etcd member; a refusal changes nothing.
	RemoveNode(ctx context.Context, node string) (cluster.RemovedNode, error)
	// PlanReplace checks a replace of a node that is gone by another
	// node, changing nothing, and says what it rebuilds.
	PlanReplace(ctx context.Context, old, new string) (cluster.ReplacePlan, error)
	// ReplaceNode rebuilds the copies of old on new, then removes old as
	// RemoveNode does (the job).
	ReplaceNode(ctx context.Context, old, new string, pr cluster.ReplaceProgress) (cluster.RemovedNode, error)
}

var _ Membership = (*cluster.Node)(nil)

// addNode adds an etcd member for a new node, on any node with an embedded
// member, and answers the new node's --initial-cluster flags.
func (s *Server) addNode(w http.ResponseWriter, r *http.Request) error {
	var req api.NodeAdd
	if err := decode(r, &req); err != nil {
		return err
	}
	if s.Cluster == nil || s.Membership == nil {
		return fmt.Errorf("add node %s: this server is a single node (started without cluster flags): start a cluster "+
			"first (docs/cluster.md): %w", req.Name, cluster.ErrNotSupported)
	}
	m, err := s.Membership.AddMember(r.Context(), req.Name, req.PeerURLs)
	if err != nil {
		return err
	}
	s.log.Info("node added to etcd; it joins when it starts", "added", m.Name, "member", fmt.Sprintf("%x", m.MemberID),
		"peers", m.PeerURLs)
	writeJSON(w, http.StatusCreated, api.NodeAdded{Name: m.Name, MemberID: fmt.Sprintf("%x", m.MemberID), PeerURLs: m.PeerURLs,
		InitialCluster: m.InitialCluster, InitialClusterState: cluster.ClusterStateExisting,
		Flags: []string{"--initial-cluster", m.InitialCluster, "--initial-cluster-state", cluster.ClusterStateExisting}})
	return nil
}

// removeNode removes a drained node from the cluster, on any other node: a
// node does not remove itself (its own etcd member would stop under the
// request).
func (s *Server) removeNode(w http.ResponseWriter, r *http.Request) error {
	node := r.PathValue("node")
	if s.Cluster == nil || s.Membership == nil {
		return fmt.Errorf("remove node %s: this server is a single node: %w", node, cluster.ErrNotSupported)
	}
	if node == s.Cluster.Name() {
		nodes, err := s.Cluster.Nodes(r.Context())
		if err != nil {
			return fmt.Errorf("%w: %w", errUnavailable, err)
		}
		other := "another node's API"
		for _, n := range nodes {
			if n.Name != node && n.Up {
				other = fmt.Sprintf("%s's API at %s (quiver --server %s node remove %s)", n.Name, n.API, n.API, node)
				break
			}
		}
		return fmt.Errorf("remove node %s: a node does not remove itself (its etcd member would stop under the request); "+
			"send it to %s: %w", node, other, errWrongNode)
	}
	rm, err := s.Membership.RemoveNode(r.Context(), node)
	if err != nil {
		return err
	}
	out := nodeRemovedToAPI(rm)
	s.log.Info("node removed from the cluster", "removed", node, "nodeID", rm.NodeID, "member", out.MemberID)
	writeJSON(w, http.StatusOK, out)
	return nil
}

// replaceNode replaces a node that is gone by another one, as a job on the
// node that takes the request (any node: the one replaced is down): the
// copies of the node gone are rebuilt on the other one, then the node gone
// is removed (its records and its etcd member). A refusal answers at once
// with nothing changed.
func (s *Server) replaceNode(w http.ResponseWriter, r *http.Request) error {
	old := r.PathValue("node")
	var req api.NodeReplace
	if err := decode(r, &req); err != nil {
		return err
	}
	if req.New == "" {
		return &badRequest{field: "new", msg: "new: the node that takes the copies of " + old + " is required"}
	}
	if s.Cluster == nil || s.Membership == nil {
		return fmt.Errorf("replace node %s: this server is a single node: %w", old, cluster.ErrNotSupported)
	}
	plan, err := s.Membership.PlanReplace(r.Context(), old, req.New)
	if err != nil {
		return err
	}
	s.log.Info("node replace starts", "replaced", old, "new", req.New, "volumes", len(plan.Rebuild),
		"stuck", len(plan.Stuck), "forgotten", plan.Forgotten)
	var rm cluster.RemovedNode
	return s.runJob(w, r, "replace", old+" -> "+req.New, len(plan.Rebuild), func(ctx context.Context, j *job.Job) error {
		var err error
		rm, err = s.Membership.ReplaceNode(ctx, old, req.New, j)
		return err
	}, func() error {
		writeJSON(w, http.StatusOK, nodeRemovedToAPI(rm))
		return nil
	})
}

func nodeRemovedToAPI(rm cluster.RemovedNode) api.NodeRemoved {
	out := api.NodeRemoved{Name: rm.Name, NodeID: rm.NodeID, EtcdMembers: rm.EtcdMembers}
	if rm.MemberID != 0 {
		out.MemberID = fmt.Sprintf("%x", rm.MemberID)
	}
	return out
}
