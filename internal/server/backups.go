package server

import (
	"context"
	"fmt"
	"strings"

	"github.com/quiverstorage/quiver/internal/backup"
	"github.com/quiverstorage/quiver/internal/nbd"
	"github.com/quiverstorage/quiver/internal/pool"
)

// backupExports serves the disks of backups read-only, straight from their
// store, beside the pool's exports (docs/backup.md, "Booting from a
// backup"):
//
//	backup:<id>/<disk>            in the server's only target
//	backup:<target>:<id>/<disk>
//
// A backup holds every tenant's data and NBD carries no admin credential,
// so they are served only where exports need no token (loopback and the
// unix socket of a node without --nbd-require-token).
type backupExports struct {
	next         nbd.Exports
	svc          *backup.Service
	requireToken bool
}

const backupExportPrefix = "backup:"

func (e backupExports) List(ctx context.Context) ([]nbd.ExportInfo, error) { return e.next.List(ctx) }

func (e backupExports) Open(ctx context.Context, name, peer string) (nbd.Export, error) {
	rest, ok := strings.CutPrefix(name, backupExportPrefix)
	if !ok {
		return e.next.Open(ctx, name, peer)
	}
	if e.requireToken {
		return nbd.Export{}, fmt.Errorf("backup exports are served only where NBD needs no token (loopback): %w", pool.ErrUnauthorized)
	}
	ref, disk, ok := strings.Cut(rest, "/")
	if !ok || disk == "" || strings.Contains(disk, "/") {
		return nbd.Export{}, fmt.Errorf("export %q: want backup:[<target>:]<id>/<disk>: %w", name, pool.ErrInvalid)
	}
	target, id, hasTarget := strings.Cut(ref, ":")
	if !hasTarget {
		target, id = e.svc.Default(), ref
		if target == "" {
			return nbd.Export{}, fmt.Errorf("export %q: the server has several backup targets: name one (backup:<target>:<id>/<disk>): %w",
				name, pool.ErrInvalid)
		}
	}
	if err := pool.ValidateName("disk", disk); err != nil {
		return nbd.Export{}, err
	}
	repo, err := e.svc.Repo(ctx, target)
	if err != nil {
		return nbd.Export{}, err
	}
	d, err := repo.OpenDisk(ctx, id, disk)
	if err != nil {
		return nbd.Export{}, err
	}
	return nbd.Export{Disk: d, Description: fmt.Sprintf("disk %s of backup %s in %s, read-only", disk, id, target)}, nil
}
