package server

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"

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
	node   *cluster.Node
	log    *slog.Logger
	ranges *rangeLocks
}

// rangeLocks holds one replica.RangeLock per disk, shared by every handle
// of the disk. Locks are kept for the server's life: one small map entry per
// replicated disk ever opened.
type rangeLocks struct {
	mu sync.Mutex
	m  map[string]*replica.RangeLock
}

func (r *rangeLocks) get(volume, disk string) *replica.RangeLock {
	r.mu.Lock()
	defer r.mu.Unlock()
	k := volume + "/" + disk
	if r.m[k] == nil {
		r.m[k] = replica.NewRangeLock()
	}
	return r.m[k]
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
	role, err := e.node.Role(ctx, volume)
	if err != nil {
		// Without etcd this node cannot know whether it is the primary:
		// refuse rather than write one copy.
		_ = ex.Disk.Close()
		return nbd.Export{}, fmt.Errorf("export %s: %w", volume+"/"+disk, err)
	}
	if !role.Placed || role.Replicas <= 1 {
		return ex, nil
	}
	if !role.IsPrimary(e.node.Name()) {
		// A copy is written by its primary only: anything else would make
		// it diverge.
		if role.Token == "" || exportToken(name) != role.Token {
			_ = ex.Disk.Close()
			return nbd.Export{}, fmt.Errorf("export %s: volume %s is replicated and written through its primary %s (NBD %s): %w",
				volume+"/"+disk, volume, role.Primary, role.PrimaryNBD, cluster.ErrNotPrimary)
		}
		return ex, nil
	}
	if len(role.Targets) == 0 {
		return ex, nil // degraded: no other copy in sync
	}
	term := role.Term
	copies := make([]replica.Copy, len(role.Targets))
	for i, t := range role.Targets {
		copies[i] = replica.Copy{Node: t.Node, Addr: t.NBD, Export: volume + "/" + disk + "/" + t.Token}
	}
	d, err := replica.Open(ctx, ex.Disk, copies, replica.Options{
		OutOfSync: func(node string, cause error) error { return e.node.MarkOutOfSync(volume, node, term, cause) },
		Ranges:    e.ranges.get(volume, disk),
	})
	if err != nil {
		_ = ex.Disk.Close()
		return nbd.Export{}, fmt.Errorf("export %s: %w", volume+"/"+disk, err)
	}
	e.log.Debug("replicated export opened", "volume", volume, "disk", disk, "term", term, "inSync", d.InSync())
	ex.Disk = d
	return ex, nil
}

// exportToken is the token part of <volume>/<disk>/<token>, or "".
func exportToken(name string) string {
	parts := strings.Split(name, "/")
	if len(parts) < 3 {
		return ""
	}
	return parts[2]
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
