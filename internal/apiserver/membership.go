package apiserver

import (
	"context"
	"fmt"
	"net/http"

	"github.com/quiverstorage/quiver/internal/api"
	"github.com/quiverstorage/quiver/internal/cluster"
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
	out := api.NodeRemoved{Name: rm.Name, NodeID: rm.NodeID, EtcdMembers: rm.EtcdMembers}
	if rm.MemberID != 0 {
		out.MemberID = fmt.Sprintf("%x", rm.MemberID)
	}
	s.log.Info("node removed from the cluster", "removed", node, "nodeID", rm.NodeID, "member", out.MemberID)
	writeJSON(w, http.StatusOK, out)
	return nil
}
