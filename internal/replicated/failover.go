package replicated

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/quiverstorage/quiver/internal/cluster"
	"github.com/quiverstorage/quiver/internal/forward"
	"github.com/quiverstorage/quiver/internal/nbd"
	"github.com/quiverstorage/quiver/internal/pool"
	"github.com/quiverstorage/quiver/internal/replica"
)

// Clients and failover on a cluster node (docs/cluster.md): any node serves
// any replicated volume. The primary serves it from its pool, acknowledging
// only while its lease is surely held (primaryDisk); every other node
// forwards the client's requests to the primary of the moment (forward.Disk),
// and sends a request whose primary went away again to the next one.

// forward opens a client's export of volume by forwarding to its primary.
// The primary's refusal (a wrong token, an unknown disk) is answered as it
// came (nbd.Refused), and in the same time as a volume this node does not
// know: the open is signed as this node's hop (Node.SignHop), which the
// primary refuses at once (nbd.Config.Forwarded), and this node's NBD server
// holds the refusal from its client's open. Every disk follows the primary as soon
// as etcd names another (cluster.Primaries.WatchPrimary): the requests in flight go to
// the new primary at once, not after the request timeout.
func (e Exports) forward(ctx context.Context, name, volume string) (nbd.Export, error) {
	resolve := func(ctx context.Context) (string, error) {
		role, err := e.node.Primaries().Role(ctx, volume)
		if err != nil {
			return "", err
		}
		if !role.Placed {
			return "", fmt.Errorf("volume %q: %w", volume, cluster.ErrVolumeNotFound)
		}
		if role.PrimaryNBD == "" {
			return "", fmt.Errorf("volume %q: primary %s is down (a copy is promoted once its lease expires)", volume, role.Primary)
		}
		return role.PrimaryNBD, nil
	}
	d, err := forward.Open(ctx, name, resolve, forward.Options{Logger: e.log.With("volume", volume),
		RequestTimeout: 2*e.node.LeaseTTL() + 10*time.Second,
		Name:           e.node.SignHop,
		Moves:          func(ctx context.Context) <-chan struct{} { return e.node.Primaries().WatchPrimary(ctx, volume) }})
	if err != nil {
		return nbd.Export{}, fmt.Errorf("export %s: %w", nbd.RedactToken(name), err)
	}
	e.log.Debug("export forwarded to the primary", "volume", volume)
	return nbd.Export{Disk: d, Description: fmt.Sprintf("volume %s through its primary", volume)}, nil
}

// targetWait bounds how long a new primary waits for the in-sync copies to
// follow its term before it records the late ones out of sync.
const targetWait = 10 * time.Second

// followedRole returns this node's role as the primary of volume at term,
// once each in-sync copy has followed the term (made an attachment for this
// primary at term, which fences the older terms' on that copy). A copy
// still at an older term after targetWait is recorded out of sync. Every
// replication Set is made from a role returned by followedRole: it never
// writes a copy through an older term's token.
func followedRole(ctx context.Context, node *cluster.Node, volume string, term uint64) (cluster.Role, error) {
	deadline := time.Now().Add(targetWait)
	for {
		role, err := node.Primaries().Role(ctx, volume)
		if err != nil {
			return cluster.Role{}, err
		}
		if role.Term != term || !role.IsPrimary(node.Name()) {
			return cluster.Role{}, fmt.Errorf("volume %q moved to %s at term %d: %w", volume, role.Primary, role.Term, cluster.ErrNotPrimary)
		}
		var late []cluster.Target
		for _, t := range role.Targets {
			if t.Term < term {
				late = append(late, t)
			}
		}
		if len(late) == 0 {
			return role, nil
		}
		if time.Now().After(deadline) {
			for _, t := range late {
				if err := node.Copies().MarkOutOfSync(volume, t.Node, term,
					fmt.Errorf("copy did not follow term %d within %s", term, targetWait)); err != nil {
					return cluster.Role{}, err
				}
			}
			continue
		}
		select {
		case <-ctx.Done():
			return cluster.Role{}, ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// leaseHolder is what a primaryDisk asks of its node (cluster.Node):
// whether the lease under which it became the primary is surely held.
type leaseHolder interface {
	Holds(p cluster.Primacy) bool
	LeaseTTL() time.Duration
	Logger() *slog.Logger
}

var _ leaseHolder = (*cluster.Node)(nil)

// primaryHandle returns the handle through which the primary at prim serves
// a client its disk d (the pool's, through metrics): a read-write handle
// writes through the disk's replication Set (set; release runs once it is
// closed), and every handle is fenced by the lease (primaryDisk), retired
// telling whether the volume was handed over since.
func primaryHandle(d pool.Disk, set *replica.Set, release func(), lease leaseHolder, prim cluster.Primacy,
	retired func() bool) pool.Disk {
	if set != nil {
		d = &setDisk{disk: set.Disk(d), release: release}
	}
	return &primaryDisk{disk: d, lease: lease, prim: prim, retired: retired}
}

// primaryDisk is the primary's handle of a replicated volume's disk: a
// request is acknowledged only while this node surely holds the lease under
// which it is the primary (docs/cluster.md, "Lease fencing"). When the lease
// is short, the answer waits for a renewal, up to one TTL; without one the
// request is abandoned (nbd.ErrAbandon: the connection closes, unanswered,
// and the client sends it again to the new primary). A request that a copy
// failed and that could not be recorded (replica.ErrNotAcknowledged: etcd
// out of reach) is abandoned too, never failed: the new primary may well
// apply it.
//
// Every request goes through the check: reads, holes and the allocation
// map included (an old primary's answer could be stale, or fail a write
// the new primary applied). It implements each method of pool.Disk itself
// and embeds nothing, so a method added to pool.Disk does not compile here
// until it is fenced; it offers no capability (pool.Capabilities), whose
// requests would be answered without the check.
type primaryDisk struct {
	disk  pool.Disk
	lease leaseHolder
	prim  cluster.Primacy
	// retired says whether this node handed the volume over (a drain)
	// since prim: every request is abandoned then, whatever it did here.
	retired func() bool
}

var _ pool.Disk = (*primaryDisk)(nil)

func (d *primaryDisk) ack(err error) error {
	if d.retired != nil && d.retired() {
		return fmt.Errorf("%w: the volume was handed over to another primary after term %d", nbd.ErrAbandon, d.prim.Term)
	}
	if errors.Is(err, replica.ErrNotAcknowledged) {
		return fmt.Errorf("%w: %w", nbd.ErrAbandon, err)
	}
	if err != nil {
		return err
	}
	if d.lease.Holds(d.prim) {
		return nil
	}
	start := time.Now()
	deadline := start.Add(d.lease.LeaseTTL())
	for time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
		if d.lease.Holds(d.prim) {
			d.lease.Logger().Info("lease renewed: acknowledging a request held meanwhile", "term", d.prim.Term,
				"held", time.Since(start))
			return nil
		}
	}
	return fmt.Errorf("%w: the lease of term %d may have expired: not acknowledged", nbd.ErrAbandon, d.prim.Term)
}

// Size and ReadOnly are the handle's, fixed when it was opened: the server
// reads them to negotiate, not to answer a request.
func (d *primaryDisk) Size() int64    { return d.disk.Size() }
func (d *primaryDisk) ReadOnly() bool { return d.disk.ReadOnly() }

func (d *primaryDisk) ReadAt(p []byte, off int64) error { return d.ack(d.disk.ReadAt(p, off)) }
func (d *primaryDisk) WriteAt(p []byte, off int64, fua bool) error {
	return d.ack(d.disk.WriteAt(p, off, fua))
}
func (d *primaryDisk) Flush() error { return d.ack(d.disk.Flush()) }
func (d *primaryDisk) Trim(off, length int64, fua bool) error {
	return d.ack(d.disk.Trim(off, length, fua))
}
func (d *primaryDisk) Zero(off, length int64, flags pool.ZeroFlags) error {
	return d.ack(d.disk.Zero(off, length, flags))
}
func (d *primaryDisk) Cache(off, length int64) error { return d.ack(d.disk.Cache(off, length)) }

// Extents is fenced like a read: a READ over holes (structured replies) and
// BLOCK_STATUS answer from the map alone.
func (d *primaryDisk) Extents(off, length int64, limit int) ([]pool.Extent, error) {
	ext, err := d.disk.Extents(off, length, limit)
	if err := d.ack(err); err != nil {
		return nil, err
	}
	return ext, nil
}

// Capabilities: none. The handle's requests all go through ack.
func (d *primaryDisk) Capabilities() pool.Capabilities { return pool.Capabilities{} }

// Close closes the handle whatever the lease: it answers no client.
func (d *primaryDisk) Close() error { return d.disk.Close() }
