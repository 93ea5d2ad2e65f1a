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
