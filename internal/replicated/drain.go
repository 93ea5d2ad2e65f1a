package replicated

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/quiverstorage/quiver/internal/cluster"
	"github.com/quiverstorage/quiver/internal/job"
	"github.com/quiverstorage/quiver/internal/pool"
	"github.com/quiverstorage/quiver/internal/replica"
)

// Drain of this node (docs/cluster.md, "Drain"): a job on the node being
// drained moves each of its copies to another eligible node, rebuilt there
// by the volume's primary, then hands over the volumes it is the primary of
// (HandOver) and removes its own copies.

// maxDrainRounds bounds the plans a drain makes: each round moves the
// copies the node holds when it starts (a failover meanwhile can make it
// the primary of a volume again, or a create may have placed one just
// before the node was marked).
const maxDrainRounds = 5

// PrepareDrain checks that every copy on this node has somewhere to go,
// and marks the node draining: placement skips it from then on. A copy with
// nowhere to go refuses the drain with nothing changed. It returns how many
// volumes the drain moves.
func (r *Volumes) PrepareDrain(ctx context.Context) (int, error) {
	me := r.node.Name()
	moves, err := r.node.Volumes().PlanDrain(ctx, me)
	if err != nil {
		return 0, err
	}
	if err := r.node.SetDrain(ctx, me, cluster.DrainRunning); err != nil {
		return 0, err
	}
	return len(moves), nil
}

// Undrain clears node's drain mark (cluster.Node.Undrain).
func (r *Volumes) Undrain(ctx context.Context, node string) (bool, error) {
	return r.node.Undrain(ctx, node)
}

// Drain moves every copy away from this node (the job of `quiver node
// drain`), then marks it drained. Its progress is the bytes the new copies'
// rebuilds copied, and one item per volume moved. It stops when the node is
// undrained meanwhile.
func (r *Volumes) Drain(ctx context.Context, j *job.Job) error {
	me := r.node.Name()
	for round := 0; ; round++ {
		moves, err := r.node.Volumes().PlanDrain(ctx, me)
		if err != nil {
			return err
		}
		if len(moves) == 0 {
			break
		}
		if round >= maxDrainRounds {
			var left []string
			for _, m := range moves {
				left = append(left, m.Volume)
			}
			return fmt.Errorf("drain %s: copies of %s still here after %d rounds", me, strings.Join(left, ", "), round)
		}
		for _, m := range moves {
			state, err := r.node.Drained(ctx, me)
			if err != nil {
				return err
			}
			if state == "" {
				return fmt.Errorf("drain %s: the node was undrained meanwhile; the copies moved so far stay moved", me)
			}
			if err := r.move(ctx, m, j); err != nil {
				if errors.Is(err, cluster.ErrVolumeNotFound) {
					r.log.Info("drain: volume gone meanwhile", "volume", m.Volume)
					continue
				}
				return fmt.Errorf("drain %s: volume %s: %w", me, m.Volume, err)
			}
			j.Done(m.Volume)
		}
	}
	if err := r.node.SetDrain(ctx, me, cluster.DrainDone); err != nil {
		return err
	}
	r.log.Info("node drained: it holds no copy", "node", me)
	return nil
}

// move moves one copy of this node to m.To: the new copy is placed and
// rebuilt (by the primary), then this node hands the volume over when it is
// its primary, or leaves the placement, and deletes its copy.
func (r *Volumes) move(ctx context.Context, m cluster.Move, j *job.Job) error {
	me := r.node.Name()
	p, ok, err := r.node.Volumes().Placement(ctx, m.Volume)
	if err != nil {
		return err
	}
	if !ok {
		return fmt.Errorf("volume %q: %w", m.Volume, cluster.ErrVolumeNotFound)
	}
	var total int64
	for _, d := range p.Spec.Disks {
		total += d.Size
	}
	j.AddTotal(total)
	var reported int64
	if err := r.node.Volumes().AddCopy(ctx, m.Volume, m.To, "moves the copy on "+me+" (drain)"); err != nil {
		return err
	}
	r.log.Info("drain: copy placed; waiting for its rebuild", "volume", m.Volume, "to", m.To)
	err = r.node.Copies().WaitCopyInSync(ctx, m.Volume, m.To, func(pr cluster.Progress) {
		if d := min(pr.DoneBytes, total) - reported; d > 0 {
			j.Add(d)
			reported += d
		}
	})
	if err != nil {
		return err
	}
	j.Add(total - reported)
	// The primary may have changed since the plan (a failover).
	for attempt := 0; ; attempt++ {
		p, ok, err = r.node.Volumes().Placement(ctx, m.Volume)
		if err != nil {
			return err
		}
		if !ok {
			return fmt.Errorf("volume %q: %w", m.Volume, cluster.ErrVolumeNotFound)
		}
		if p.Primary != me {
			err = r.node.Volumes().RemoveCopy(ctx, m.Volume, me)
		} else {
			var to string
			if to, err = r.HandOver(ctx, m.Volume); err == nil {
				r.log.Info("drain: primary handed over", "volume", m.Volume, "to", to)
			}
		}
		if err == nil {
			break
		}
		// ErrNotReady: a record changed under the Txn; ErrDegraded: the
		// new copy's node has not followed the term yet; ErrNotPrimary:
		// the volume moved on meanwhile (the next round removes this
		// node's copy as a copy's).
		if attempt >= 20 || !(errors.Is(err, cluster.ErrNotReady) || errors.Is(err, cluster.ErrDegraded) ||
			errors.Is(err, cluster.ErrNotPrimary)) {
			return err
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(500 * time.Millisecond):
		}
	}
	return r.removeLocal(ctx, m.Volume)
}

// HandOver hands volume, of which this node is the primary, over to an
// in-sync copy on another node (cluster.Primaries.HandOver) with no change in
// flight: every disk's Set is frozen, the new primary recorded at the next
// term, the Sets retired (each later request on this node is abandoned,
// unapplied, and its client sends it again to the new primary), then the
// gates open. An acknowledged change was applied on every in-sync copy
// before the freeze; none is applied here or through this node after.
// When the hand-over's etcd transaction has an unknown outcome and etcd
// does not tell in time whether it applied, or tells that the volume moved
// on otherwise, the Sets are retired all the same and the error returned:
// the gates reopen only on a node that etcd shows still the primary.
func (r *Volumes) HandOver(ctx context.Context, volume string) (string, error) {
	v, err := r.pool.Volume(volume)
	if err != nil {
		return "", err
	}
	prim, err := r.node.Primaries().HoldPrimaryKey(ctx, volume)
	if err != nil {
		return "", err
	}
	role, err := followedRole(ctx, r.node, volume, prim.Term)
	if err != nil {
		return "", err
	}
	// Thaw before release: the last release closes a Set, which takes
	// its gate.
	var thaws []func()
	var ents []*setEntry
	defer func() {
		for _, t := range thaws {
			t()
		}
		for _, e := range ents {
			r.release(e)
		}
	}()
	var sets []*replica.Set
	for _, d := range v.Info().Disks {
		ent, err := r.acquire(ctx, volume, d.Name, role, d.Size)
		if err != nil {
			return "", err
		}
		ents = append(ents, ent)
		thaws = append(thaws, ent.set.Freeze())
		sets = append(sets, ent.set)
	}
	to, term, err := r.node.Primaries().HandOver(ctx, volume, prim.Term)
	if err != nil && !errors.Is(err, cluster.ErrNotPrimary) && !errors.Is(err, cluster.ErrUnknownOutcome) {
		// Not handed over, and this node is still the primary at
		// prim.Term: the gates open and the Sets go on.
		return "", err
	}
	// Handed over, or moved on otherwise, or etcd did not tell in time:
	// this node may no longer be the primary, so none of its requests of
	// the volume is acknowledged from now on.
	r.retire(volume, prim.Term)
	for _, s := range sets {
		s.Retire()
	}
	if err != nil {
		r.log.Warn("hand-over not known to have applied: this node's requests of the volume are abandoned from now on",
			"volume", volume, "term", prim.Term, "err", err)
		return "", err
	}
	r.log.Info("handed over: this node's requests of the volume are abandoned from now on", "volume", volume,
		"to", to, "term", term)
	return to, nil
}

// retire records that this node's primacy of volume at term (and before)
// ended by a hand-over: its primaryDisk handles abandon every request.
func (r *Volumes) retire(volume string, term uint64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.retired == nil {
		r.retired = map[string]uint64{}
	}
	r.retired[volume] = max(r.retired[volume], term)
}

// retiredAt says whether this node handed volume over at term or later.
func (r *Volumes) retiredAt(volume string, term uint64) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	t, ok := r.retired[volume]
	return ok && term <= t
}

// copyLeftWait is how long the drained node waits, after its copy left the
// placement, before it deletes it: the primary's resync loop (every
// resyncInterval) stops writing it first, so no client request meets the
// copy gone (it would still be acknowledged: the copy is out of the in-sync
// set, so the primary just drops it).
const copyLeftWait = 3 * resyncInterval

// removeLocal deletes this node's copy of volume once it left the
// placement, ending its attachments here first (a replicated volume's
// attachments live on with its primary, in etcd), and then clears the
// removal from etcd.
func (r *Volumes) removeLocal(ctx context.Context, volume string) error {
	uid, err := r.node.Volumes().RemovingUID(ctx, volume)
	if err != nil {
		return err
	}
	if uid != "" {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(copyLeftWait):
		}
		v, err := r.pool.Volume(volume)
		switch {
		case errors.Is(err, pool.ErrVolumeNotFound):
		case err != nil:
			return err
		case v.Info().UID == uid:
			for _, a := range v.Attachments() {
				if err := v.Detach(a.ID); err != nil && !errors.Is(err, pool.ErrAttachmentNotFound) {
					return fmt.Errorf("end attachment %s of the removed copy: %w", a.ID, err)
				}
			}
			if err := r.pool.Delete(ctx, volume); err != nil && !errors.Is(err, pool.ErrVolumeNotFound) {
				return fmt.Errorf("delete the removed copy: %w", err)
			}
			if err := r.pool.FS().RemoveAll(replica.BitmapDir(uid)); err != nil {
				r.log.Warn("remove the dirty bitmaps of a removed copy", "volume", volume, "err", err)
			}
			if err := r.pool.FS().RemoveAll(replica.ActivityDir(uid)); err != nil {
				r.log.Warn("remove the activity logs of a removed copy", "volume", volume, "err", err)
			}
			r.log.Info("drain: copy deleted here", "volume", volume)
		}
	}
	return r.node.Volumes().RemovedCopy(ctx, volume)
}

// forgetRemoved stops the Sets of volume (this node is its primary, p its
// placement) writing or tracking copies that left the placement.
func (r *Volumes) forgetRemoved(volume string, p cluster.Placement) {
	r.mu.Lock()
	var sets []*replica.Set
	for _, d := range p.Spec.Disks {
		if e := r.m[volume+"/"+d.Name]; e != nil && e.term == p.Term {
			sets = append(sets, e.set)
		}
	}
	r.mu.Unlock()
	for _, s := range sets {
		for _, node := range s.Nodes() {
			if !slices.ContainsFunc(p.Copies, func(c cluster.CopyInfo) bool { return c.Node == node }) {
				if err := s.Remove(node); err != nil {
					r.log.Warn("forget a copy that left the placement", "volume", volume, "copy", node, "err", err)
				} else {
					r.log.Info("copy left the placement: no longer written", "volume", volume, "copy", node)
				}
			}
		}
	}
}
