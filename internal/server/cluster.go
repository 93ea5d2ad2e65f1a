package server

import (
	"context"
	"log/slog"
	"net"
	"path/filepath"

	"github.com/quiverstorage/quiver/internal/apiserver"
	"github.com/quiverstorage/quiver/internal/cluster"
	"github.com/quiverstorage/quiver/internal/pool"
	"github.com/quiverstorage/quiver/internal/replicated"
)

// join joins with the addresses the listeners got: the API's, and
// NBD's over TCP when served.
func join(ctx context.Context, cfg Config, p *pool.Pool, apiAddr net.Addr, nbdLns []net.Listener,
	log *slog.Logger) (*cluster.Node, error) {
	cc := cfg.Cluster
	cc.APIAddr = apiAddr.String()
	for _, l := range nbdLns {
		if l.Addr().Network() == "tcp" {
			cc.NBDAddr = l.Addr().String()
		}
	}
	if cc.StateDir == "" {
		cc.StateDir = filepath.Join(p.Dir(), "cluster")
	}
	cc.Logger = log
	node, err := cluster.Join(ctx, cc, replicated.Store(p))
	if err != nil {
		return nil, err
	}
	// A replicated volume's attachments move with it on failover: the
	// primary publishes each change before it takes effect.
	p.SetAttachmentsHook(node.Primaries().PublishAttachments)
	return node, nil
}

// The API drives a node's replicated volumes through these.
var (
	_ apiserver.Replicated = (*replicated.Volumes)(nil)
	_ apiserver.Drainer    = (*replicated.Volumes)(nil)
)
