package server

import (
	"context"
	"errors"
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
	volume, disk, ok := liveExport(name)
	if !ok {
		return e.Exports.Open(ctx, name, peer)
	}
	role, err := e.node.Role(ctx, volume)
	if err != nil {
		// Without etcd this node cannot know whether it is the primary:
		// refuse rather than write one copy.
		return nbd.Export{}, fmt.Errorf("export %s: %w", volume+"/"+disk, err)
	}
	if !role.Placed || role.Replicas <= 1 {
		return e.Exports.Open(ctx, name, peer)
	}
	if !role.IsPrimary(e.node.Name()) {
		if role.Token != "" && exportToken(name) == role.Token {
			// The primary's connection to this node's copy.
			return e.Exports.Open(ctx, name, peer)
		}
		// A client: its requests go to the primary of the moment
		// (failover.go). A copy is written by its primary only.
		return e.forward(ctx, name, volume)
	}
	prim, err := e.node.HoldPrimary(ctx, volume)
	if errors.Is(err, cluster.ErrNotPrimary) {
		return e.forward(ctx, name, volume) // failed over since Role
	}
	if err != nil {
		return nbd.Export{}, fmt.Errorf("export %s: %w", volume+"/"+disk, err)
	}
	ex, err := e.Exports.Open(ctx, name, peer)
	if err != nil {
		return ex, err
	}
	if !ex.Disk.ReadOnly() {
		targets, err := e.targets(ctx, volume, prim.Term)
		if err != nil {
			_ = ex.Disk.Close()
			return nbd.Export{}, fmt.Errorf("export %s: %w", volume+"/"+disk, err)
		}
		if len(targets) > 0 {
			term := prim.Term
			copies := make([]replica.Copy, len(targets))
			for i, t := range targets {
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
		}
	}
	ex.Disk = &primaryDisk{Disk: ex.Disk, node: e.node, prim: prim}
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
