package client

import (
	"context"
	"net/http"

	"github.com/quiverstorage/quiver/internal/api"
)

// ListNodes lists the storage nodes of the server's cluster, up and down; a
// single node lists itself.
func (c *Client) ListNodes(ctx context.Context) ([]api.Node, error) {
	var list api.List[api.Node]
	err := c.do(ctx, http.MethodGet, "/nodes", nil, nil, &list)
	return list.Items, err
}

// StartDrain starts the drain of node, a job on that node: send it to the
// node's own API (elsewhere the answer is a 409 WrongNode naming it).
func (c *Client) StartDrain(ctx context.Context, node string) (api.Job, error) {
	p, err := segment("node", node)
	if err != nil {
		return api.Job{}, err
	}
	return c.startJob(ctx, "/nodes/"+p+"/drain", nil)
}

// StartReplace starts the replace of node old, which is gone, by node new
// (a job): old's copies are rebuilt on new, then old is removed. Send it to
// any node that is up.
func (c *Client) StartReplace(ctx context.Context, old, new string) (api.Job, error) {
	p, err := segment("node", old)
	if err != nil {
		return api.Job{}, err
	}
	return c.startJob(ctx, "/nodes/"+p+"/replace", api.NodeReplace{New: new})
}

// Undrain clears node's drain mark and returns the node.
func (c *Client) Undrain(ctx context.Context, node string) (api.Node, error) {
	var n api.Node
	p, err := segment("node", node)
	if err != nil {
		return n, err
	}
	err = c.do(ctx, http.MethodDelete, "/nodes/"+p+"/drain", nil, nil, &n)
	return n, err
}

// AddNode adds an etcd member for the new node name (its peer URLs) and
// returns the flags the new node starts with (docs/cluster.md, "Adding and
// removing nodes").
func (c *Client) AddNode(ctx context.Context, name string, peerURLs []string) (api.NodeAdded, error) {
	var out api.NodeAdded
	err := c.do(ctx, http.MethodPost, "/nodes", nil, api.NodeAdd{Name: name, PeerURLs: peerURLs}, &out)
	return out, err
}

// RemoveNode removes node from the cluster: it must be drained and hold no
// copy. Send it to another node than the one removed.
func (c *Client) RemoveNode(ctx context.Context, node string) (api.NodeRemoved, error) {
	var out api.NodeRemoved
	p, err := segment("node", node)
	if err != nil {
		return out, err
	}
	err = c.do(ctx, http.MethodDelete, "/nodes/"+p, nil, nil, &out)
	return out, err
}
