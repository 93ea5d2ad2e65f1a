package apiserver

import (
	"context"
	"errors"
	"fmt"
	"net/http"

	"github.com/quiverstorage/quiver/internal/api"
	"github.com/quiverstorage/quiver/internal/cluster"
	"github.com/quiverstorage/quiver/internal/job"
)

// Drainer drains the node it runs on (docs/cluster.md, "Drain").
type Drainer interface {
	// PrepareDrain checks that every copy on the node has an eligible node
	// to go to and marks the node draining; a refusal changes nothing. It
	// returns the number of volumes to move.
	PrepareDrain(ctx context.Context) (int, error)
	// Drain moves the copies and marks the node drained (the job).
	Drain(ctx context.Context, j *job.Job) error
	// Undrain clears the drain mark of any node; it reports whether the
	// node was marked.
	Undrain(ctx context.Context, node string) (bool, error)
}

// errWrongNode: the request must go to another node.
var errWrongNode = errors.New("ask another node")

// drainNode starts the drain of a node, as a job: only the node itself
// runs it (it hands over the volumes it is the primary of). Elsewhere the
// answer is 409 WrongNode naming the node's API address.
func (s *Server) drainNode(w http.ResponseWriter, r *http.Request) error {
	node := r.PathValue("node")
	if s.Cluster == nil || s.Drainer == nil {
		return fmt.Errorf("drain %s: this server is a single node (started without cluster flags): there is no other node "+
			"to move its volumes to: %w", node, cluster.ErrNotSupported)
	}
	if node != s.Cluster.Name() {
		nodes, err := s.Cluster.Nodes(r.Context())
		if err != nil {
			return fmt.Errorf("%w: %w", errUnavailable, err)
		}
		for _, n := range nodes {
			if n.Name != node {
				continue
			}
			if !n.Up {
				return fmt.Errorf("drain %s: the node is down (its copies are rebuilt elsewhere after --rebuild-after); "+
					"a drain runs on the node itself: %w", node, cluster.ErrNotEnoughNodes)
			}
			return fmt.Errorf("drain %s: a drain runs on the node being drained; send it to %s's API at %s "+
				"(quiver --server %s node drain %s): %w", node, node, n.API, n.API, node, errWrongNode)
		}
		return fmt.Errorf("drain %s: no such node in the cluster: %w", node, cluster.ErrNodeNotFound)
	}
	moves, err := s.Drainer.PrepareDrain(r.Context())
	if err != nil {
		return err
	}
	return s.runJob(w, r, "drain", node, moves, s.Drainer.Drain, func() error {
		return s.writeNode(w, r, node)
	})
}

// undrainNode clears a node's drain mark, on any node: placement may use it
// again. A drain job still running stops at its next volume.
func (s *Server) undrainNode(w http.ResponseWriter, r *http.Request) error {
	node := r.PathValue("node")
	if s.Cluster == nil || s.Drainer == nil {
		return fmt.Errorf("undrain %s: this server is a single node: %w", node, cluster.ErrNotSupported)
	}
	if err := s.nodeExists(r.Context(), node); err != nil {
		return err
	}
	if _, err := s.Drainer.Undrain(r.Context(), node); err != nil {
		return fmt.Errorf("%w: %w", errUnavailable, err)
	}
	return s.writeNode(w, r, node)
}

func (s *Server) nodeExists(ctx context.Context, node string) error {
	nodes, err := s.Cluster.Nodes(ctx)
	if err != nil {
		return fmt.Errorf("%w: %w", errUnavailable, err)
	}
	for _, n := range nodes {
		if n.Name == node {
			return nil
		}
	}
	return fmt.Errorf("node %s: no such node in the cluster: %w", node, cluster.ErrNodeNotFound)
}

// writeNode answers with node as GET /v1/nodes lists it.
func (s *Server) writeNode(w http.ResponseWriter, r *http.Request, node string) error {
	nodes, err := s.Cluster.Nodes(r.Context())
	if err != nil {
		return fmt.Errorf("%w: %w", errUnavailable, err)
	}
	for _, n := range nodes {
		if n.Name == node {
			writeJSON(w, http.StatusOK, nodeToAPI(n, s.Cluster.Name()))
			return nil
		}
	}
	return fmt.Errorf("node %s: %w", node, cluster.ErrNodeNotFound)
}

func nodeToAPI(n cluster.NodeInfo, self string) api.Node {
	state := api.NodeDown
	if n.Up {
		state = api.NodeUp
	}
	return api.Node{Name: n.Name, Address: n.API, NBD: n.NBD, State: state, FailureDomain: n.FailureDomain,
		CapacityBytes: n.TotalBytes, FreeBytes: n.FreeBytes, Volumes: n.Volumes, Self: n.Name == self, Drain: n.Drain}
}
