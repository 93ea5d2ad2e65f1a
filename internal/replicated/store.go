package replicated

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/quiverstorage/quiver/internal/api"
	"github.com/quiverstorage/quiver/internal/cluster"
	"github.com/quiverstorage/quiver/internal/pool"
	"github.com/quiverstorage/quiver/internal/qos"
	"github.com/quiverstorage/quiver/internal/replica"
)

// poolStore is the pool as the cluster sees it: the copies this node holds.
type poolStore struct{ p *pool.Pool }

// Store is the pool p as the cluster sees it (cluster.Join's Store).
func Store(p *pool.Pool) cluster.Store { return poolStore{p} }

var _ cluster.Store = poolStore{}

func (s poolStore) PoolID() string {
	info, err := s.p.Info()
	if err != nil {
		return ""
	}
	return info.ID
}

func (s poolStore) Usage() (total, free int64, err error) { return s.p.FS().Usage() }

func (s poolStore) CreateCopy(ctx context.Context, spec api.VolumeSpec) (string, error) {
	// The tenant recorded in the placement: the copy's manifest carries it,
	// so the tenant check holds on every copy (docs/security.md).
	ps := pool.VolumeSpec{Name: spec.Name, Capacity: spec.Capacity, Labels: spec.Labels, Replicas: spec.Replicas,
		Tenant: spec.Tenant}
	for _, d := range spec.Disks {
		ps.Disks = append(ps.Disks, pool.DiskSpec{Name: d.Name, Size: d.Size, Shared: d.Shared})
	}
	if spec.QoS != nil {
		ps.QoS = qos.Limits(*spec.QoS)
	}
	info, _, err := s.p.Create(ctx, ps)
	return info.UID, err
}

func (s poolStore) DeleteCopy(ctx context.Context, name, uid string) error {
	v, err := s.p.Volume(name)
	if errors.Is(err, pool.ErrVolumeNotFound) {
		return nil
	}
	if err != nil {
		return err
	}
	if v.Info().UID != uid {
		return nil // not the copy the cluster made: leave it
	}
	for _, a := range v.Attachments() {
		if strings.HasPrefix(a.Node, replicaNodePrefix) {
			if err := v.Detach(a.ID); err != nil && !errors.Is(err, pool.ErrAttachmentNotFound) {
				return err
			}
		}
	}
	err = s.p.Delete(ctx, name)
	if errors.Is(err, pool.ErrVolumeNotFound) {
		err = nil
	}
	if err == nil {
		// The dirty bitmaps and activity logs of the copy's primary days
		// go with it.
		err = errors.Join(s.p.FS().RemoveAll(replica.BitmapDir(uid)), s.p.FS().RemoveAll(replica.ActivityDir(uid)))
	}
	return err
}

// DeleteUnplacedClone deletes the local volume name when its manifest says
// it is a clone of volume: a clone made at the cut of a replicated volume
// whose placement never happened (its intent is undone, intent.go).
func (s poolStore) DeleteUnplacedClone(ctx context.Context, volume, name string) error {
	v, err := s.p.Volume(name)
	if errors.Is(err, pool.ErrVolumeNotFound) {
		return nil
	}
	if err != nil {
		return err
	}
	if src := v.Info().Source; src == nil || src.Volume != volume {
		return nil // not a clone of volume: not ours
	}
	return s.DeleteCopy(ctx, name, v.Info().UID)
}

// LocalCopies lists the pool's volumes for the stale-copy check. A volume
// is in use while it has an attachment other than the ones a copy made for
// its primaries, or one of those with a connection open.
func (s poolStore) LocalCopies() []cluster.LocalCopy {
	var out []cluster.LocalCopy
	for _, info := range s.p.List(nil) {
		lc := cluster.LocalCopy{Name: info.Name, UID: info.UID, Replicas: info.Replicas}
		if info.Broken != "" {
			lc.UID = ""
		}
		for _, d := range info.Disks {
			lc.Disks = append(lc.Disks, d.Name)
			lc.Allocated += d.Allocated
		}
		if v, err := s.p.Volume(info.Name); err == nil {
			var who []string
			for _, a := range v.Attachments() {
				if !strings.HasPrefix(a.Node, replicaNodePrefix) || a.Conns > 0 {
					who = append(who, fmt.Sprintf("%s (attachment %s, %d connections)", a.Node, a.ID, a.Conns))
				}
			}
			lc.InUse = strings.Join(who, "; ")
		} else {
			lc.UID = "" // gone or broken meanwhile: not a candidate
		}
		out = append(out, lc)
	}
	return out
}

// replicaNodePrefix starts the node name of the attachments a copy makes
// for its primary.
const replicaNodePrefix = "replica-"

// AttachForPrimary makes the attachment through which the primary writes
// this copy, one per term (a newer term's attachment is newer: its first
// write fences the older primary's on this copy). A retry finds it again
// by its idempotency key.
func (s poolStore) AttachForPrimary(ctx context.Context, volume, primary string, term uint64) error {
	v, err := s.p.Volume(volume)
	if err != nil {
		return err
	}
	node := replicaAttachment(primary, term)
	a, _, err := v.AttachWith(node, api.ModeReadWrite, pool.Idempotency{Key: node})
	if err != nil {
		return err
	}
	// The writer role goes to this term's attachment now, before the
	// primary's first write: from here on the copy refuses the writes of
	// every older term's attachment (term fencing at the copy).
	_, err = v.Transfer(a.ID)
	return err
}

// ActivityOf reads the activity logs (replica.ActivityLog) of this node's
// copy of volume, local UID uid, written as its primary at term: a disk's
// log is listed only when it is there, readable, trusted and of that term,
// with one extent size for all.
func (s poolStore) ActivityOf(volume, uid string, term uint64) *cluster.CopyActivity {
	v, err := s.p.Volume(volume)
	if err != nil || v.Info().UID != uid {
		return nil
	}
	out := &cluster.CopyActivity{Term: term, Disks: map[string][]int64{}}
	for _, d := range v.Info().Disks {
		a, err := replica.ReadActivity(s.p.FS(), replica.ActivityPath(uid, d.Name))
		if err != nil || a.Untrusted || a.Term != term || (out.Extent != 0 && a.Extent != out.Extent) {
			continue
		}
		out.Extent = a.Extent
		out.Disks[d.Name] = append([]int64{}, a.Extents...)
	}
	if len(out.Disks) == 0 {
		return nil
	}
	return out
}

// replicaAttachment names the attachment a copy makes for primary at term.
func replicaAttachment(primary string, term uint64) string {
	return fmt.Sprintf("%s%s-term-%d", replicaNodePrefix, primary, term)
}

// AdoptAttachments takes over the volume's attachments as its old primary
// published them, when this node is promoted (pool.Volume.AdoptAttachments).
func (s poolStore) AdoptAttachments(ctx context.Context, volume string, state []byte) error {
	v, err := s.p.Volume(volume)
	if err != nil {
		return err
	}
	return v.AdoptAttachments(state)
}

// ApplyOp applies an operation of the volume's primary to this copy: the
// snapshot (or its deletion) with the primary's name and UID. The primary
// holds the volume's I/O gate meanwhile, so no write reaches this copy
// while it captures: the same cut as the primary's. A retry finds the
// snapshot made (its idempotency key is its UID).
func (s poolStore) ApplyOp(ctx context.Context, volume string, op cluster.Op) error {
	v, err := s.p.Volume(volume)
	if err != nil {
		return err
	}
	switch op.Kind {
	case cluster.OpSnapshot:
		_, _, err := v.CreateSnapshotWith(ctx, op.Name, pool.Idempotency{Key: "replica-" + op.UID, UID: op.UID}, nil)
		return err
	case cluster.OpDeleteSnapshot:
		snap, err := v.Snapshot(op.Name)
		if errors.Is(err, pool.ErrSnapshotNotFound) {
			return nil
		}
		if err != nil {
			return err
		}
		if op.UID != "" && snap.UID != op.UID {
			return fmt.Errorf("snapshot %s@%s here is %s, not the primary's %s", volume, op.Name, snap.UID, op.UID)
		}
		err = v.DeleteSnapshot(ctx, op.Name)
		if errors.Is(err, pool.ErrSnapshotNotFound) {
			return nil
		}
		return err
	}
	return applyCutOp(ctx, v, op)
}

// CloneCopy makes op.Name, a clone of this node's copy of volume, while its
// primary holds the source's I/O gate (the same cut as the primary's
// clone): of the snapshot op.Snapshot, which must be the primary's (same
// UID), or of the live copy. Durable on return (pool.Clone); a retry finds
// the clone by its idempotency key.
func (s poolStore) CloneCopy(ctx context.Context, volume string, op cluster.Op) (string, error) {
	if op.Snapshot != "" {
		v, err := s.p.Volume(volume)
		if err != nil {
			return "", err
		}
		snap, err := v.Snapshot(op.Snapshot)
		if err != nil {
			return "", fmt.Errorf("this copy lacks it: %w", err)
		}
		if snap.UID != op.SnapshotUID {
			return "", fmt.Errorf("snapshot %s@%s here is %s, not the primary's %s: %w", volume, op.Snapshot, snap.UID,
				op.SnapshotUID, cluster.ErrCopyMismatch)
		}
	}
	req := pool.CloneRequest{Source: pool.Source{Volume: volume, Snapshot: op.Snapshot}, Names: []string{op.Name},
		Labels: op.Labels, Idempotency: pool.Idempotency{Key: "replica-" + op.UID}}
	made, err := s.p.Clone(ctx, req, nil)
	if err != nil {
		return "", err
	}
	return made[0].UID, nil
}
