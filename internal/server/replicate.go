package server

import (
	"context"
	"fmt"
	"log/slog"
	"strings"

	"github.com/quiverstorage/quiver/internal/cluster"
	"github.com/quiverstorage/quiver/internal/nbd"
	"github.com/quiverstorage/quiver/internal/replica"
)

// replicatedExports serves a cluster node's exports: on the primary of a
// replicated volume, each read-write disk handle also writes every in-sync
// copy (replica.Disk); anywhere else, and for snapshots, the pool's handle
// as it is.
type replicatedExports struct {
	nbd.Exports
	node *cluster.Node
	log  *slog.Logger
}

var _ nbd.Exports = replicatedExports{}

func (e replicatedExports) Open(ctx context.Context, name, peer string) (nbd.Export, error) {
	ex, err := e.Exports.Open(ctx, name, peer)
	if err != nil || ex.Disk.ReadOnly() {
		return ex, err
	}
	volume, disk, ok := liveExport(name)
	if !ok {
		return ex, nil
	}
	term, targets, primary, err := e.node.Replication(ctx, volume)
	if err != nil {
		// Without etcd this node cannot know it is still the primary:
		// refuse rather than write one copy.
		_ = ex.Disk.Close()
		return nbd.Export{}, fmt.Errorf("export %s: %w", volume+"/"+disk, err)
	}
	if !primary || len(targets) == 0 {
		return ex, nil
	}
	copies := make([]replica.Copy, len(targets))
	for i, t := range targets {
		copies[i] = replica.Copy{Node: t.Node, Addr: t.NBD, Export: volume + "/" + disk + "/" + t.Token}
	}
	d, err := replica.Open(ctx, ex.Disk, copies, replica.Options{
		OutOfSync: func(node string, cause error) error { return e.node.MarkOutOfSync(volume, node, term, cause) },
	})
	if err != nil {
		_ = ex.Disk.Close()
		return nbd.Export{}, fmt.Errorf("export %s: %w", volume+"/"+disk, err)
	}
	e.log.Debug("replicated export opened", "volume", volume, "disk", disk, "term", term, "inSync", d.InSync())
	ex.Disk = d
	return ex, nil
}

// liveExport splits <volume>/<disk>[/<token>]; snapshots (<volume>@<snap>)
// are not live.
func liveExport(name string) (volume, disk string, ok bool) {
	parts := strings.Split(name, "/")
	if len(parts) < 2 || strings.Contains(parts[0], "@") {
		return "", "", false
	}
	return parts[0], parts[1], true
}
