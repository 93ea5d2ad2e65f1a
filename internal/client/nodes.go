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
