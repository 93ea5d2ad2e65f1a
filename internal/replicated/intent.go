package replicated

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/quiverstorage/quiver/internal/api"
	"github.com/quiverstorage/quiver/internal/cluster"
	"github.com/quiverstorage/quiver/internal/pool"
)

// Intents of changes at the cut (docs/cluster.md, "Intents"): the primary
// records the change in etcd before it changes its own copy
// (cluster.Ops.BeginIntent) and removes the record when every in-sync copy
// applied it or was recorded diverged. A record left behind is settled by
// the volume's primary of the moment before any Set of the volume is made
// at its term (acquire), so before the volume serves a write: a change of
// the disks is finished on every in-sync copy, a snapshot and clones not
// placed are undone everywhere (cluster.SettleOf).

// errIntentOpen: the change at the cut ended without its outcome on every
// copy recorded in etcd; its intent must be settled. Errors are marked with
// it by intentOpen.
var errIntentOpen = errors.New("the change's outcome on the copies is not recorded")

// intentOpen marks err (its message unchanged) as errIntentOpen.
func intentOpen(err error) error { return openError{err} }

type openError struct{ error }

func (e openError) Unwrap() error        { return e.error }
func (e openError) Is(target error) bool { return target == errIntentOpen }

// intentsHere are the intents this process began, by ID: they are settled
// by this process's own code path, never by the settle loop.
type intentsHere struct {
	mu    sync.Mutex
	own   map[string]bool        // begun here, by ID
	locks map[string]*sync.Mutex // one settlement at a time, by volume
}

func (ih *intentsHere) owned(id string) bool {
	ih.mu.Lock()
	defer ih.mu.Unlock()
	return ih.own[id]
}

func (ih *intentsHere) lock(volume string) *sync.Mutex {
	ih.mu.Lock()
	defer ih.mu.Unlock()
	if ih.locks == nil {
		ih.locks = map[string]*sync.Mutex{}
	}
	if ih.locks[volume] == nil {
		ih.locks[volume] = &sync.Mutex{}
	}
	return ih.locks[volume]
}

// drop forgets an intent of this process whose record is gone.
func (ih *intentsHere) drop(id string) {
	ih.mu.Lock()
	defer ih.mu.Unlock()
	delete(ih.own, id)
}

func (ih *intentsHere) add(id string) {
	ih.mu.Lock()
	defer ih.mu.Unlock()
	if ih.own == nil {
		ih.own = map[string]bool{}
	}
	ih.own[id] = true
}

// intended runs change, this primary's change at the cut of volume (its own
// copy, then the copies'), under an intent recorded before it (ops, sent to
// cs.nodes). A change that fails before anything changed, or that ends with
// every copy's outcome recorded, removes the intent. One whose outcome is
// not recorded (errIntentOpen) is settled at once, the Sets still frozen;
// when even that fails, this node's handles of the volume at this term
// abandon every request from now on (as after a hand-over), and the intent
// is left to the next primary.
func (r *Volumes) intended(ctx context.Context, volume string, cs *cutState, ops []cluster.Op, change func() error) error {
	// primary/<volume>, which the intent's record compares, is taken here
	// when absent (a volume no client opened since it was placed).
	if _, err := r.node.Primaries().HoldPrimaryKey(ctx, volume); err != nil {
		return err
	}
	// abandon keeps the intent for the next primary: this node's handles
	// of the volume at this term abandon every request from now on (as
	// after a hand-over), so no write follows the cut here before the
	// intent is settled, and finishing it again changes nothing.
	abandon := func(why string, cause error) {
		r.retire(volume, cs.role.Term)
		for _, e := range cs.sets {
			e.set.Retire()
		}
		r.log.Error(why+": this node's requests of the volume at this term are abandoned; the next primary settles "+
			"its intent", "volume", volume, "term", cs.role.Term, "err", cause)
	}
	// The intent is this process's from before it is recorded: a
	// settlement meanwhile (another disk's Set being made) must not take
	// it for an orphan while its recording's outcome is being learnt.
	id := cluster.NewIntentID()
	r.intents.add(id)
	in, err := r.node.Ops().BeginIntentAs(ctx, volume, cs.role.Term, id, ops, cs.nodes)
	if errors.Is(err, cluster.ErrIntentLeft) {
		r.intents.drop(id)
		abandon("intent of unknown outcome", err)
		return err
	}
	if err != nil {
		r.intents.drop(id)
		if errors.Is(err, cluster.ErrIntentPending) {
			return fmt.Errorf("%w: %w", err, pool.ErrBusy)
		}
		return err
	}
	err = change()
	if errors.Is(err, errIntentOpen) {
		r.log.Warn("a change at the cut ended unrecorded: settling its intent now", "volume", volume, "op", ops[0].Kind,
			"err", err)
		if serr := r.settle(ctx, volume, in, cs.role.Term, true); serr != nil {
			abandon("intent not settled", serr)
			return errors.Join(err, serr)
		}
		r.intents.drop(in.ID)
		return err
	}
	// Remove the intent before the gates open: once writes follow the
	// cut, finishing the change again (a rollback) would undo them.
	var eerr error
	for try := 0; try < 10; try++ {
		if eerr = r.node.Ops().EndIntent(ctx, volume, cs.role.Term, in); eerr == nil || errors.Is(eerr, cluster.ErrNotPrimary) {
			break
		}
		time.Sleep(time.Second)
	}
	if eerr != nil {
		abandon("the intent of a change done could not be removed", eerr)
		return err
	}
	r.intents.drop(in.ID)
	return err
}

// settleFirst settles the volume's intent if one is left behind by another
// primary, or by an earlier process of this node, and this node is the
// volume's primary: before a Set of the volume is made.
func (r *Volumes) settleFirst(ctx context.Context, volume string) error {
	in, ok, err := r.node.Ops().VolumeIntent(ctx, volume)
	if err != nil || !ok || !cluster.NeedsSettling(in, r.intents.owned(in.ID)) {
		return err
	}
	mu := r.intents.lock(volume)
	mu.Lock()
	defer mu.Unlock()
	if in, ok, err = r.node.Ops().VolumeIntent(ctx, volume); err != nil || !ok || !cluster.NeedsSettling(in, r.intents.owned(in.ID)) {
		return err
	}
	pr, err := r.node.Primaries().HoldPrimaryKey(ctx, volume)
	if errors.Is(err, cluster.ErrNotPrimary) {
		return nil // another node's to settle
	}
	if err != nil {
		return err
	}
	return r.settle(ctx, volume, in, pr.Term, false)
}

// settle finishes or undoes in (cluster.SettleOf) as the primary of volume
// at term. No write reached the volume's copies since the cut: the intent's
// primary held the Sets frozen until it went, and this primary makes no Set
// before the intent is settled. atCut: settled by the primary that began
// it, the Sets still frozen, after its own change of the disks (which it
// holds the pool's hold of) succeeded.
func (r *Volumes) settle(ctx context.Context, volume string, in cluster.Intent, term uint64, atCut bool) error {
	role, err := r.node.Primaries().Role(ctx, volume)
	if err != nil {
		return err
	}
	if !role.IsPrimary(r.node.Name()) || role.Term != term {
		return fmt.Errorf("settle the intent on %s: %w", volume, cluster.ErrNotPrimary)
	}
	var nodes []string
	for _, t := range role.Targets {
		nodes = append(nodes, t.Node)
	}
	if len(in.Ops) == 0 {
		return r.node.Ops().SettledIntent(ctx, volume, term, in, nil) // nothing to do: not written so
	}
	how := cluster.SettleOf(in)
	r.log.Warn("settling the intent of a change at the cut", "volume", volume, "intent", in.ID, "op", in.Ops[0].Kind,
		"name", in.Ops[0].Name, "by", in.Primary, "at", in.Term, "term", term, "settle", how.String(), "copies", nodes)
	if how == cluster.SettleUndo {
		return r.undoIntent(ctx, volume, in, term, cluster.HoldersOf(in, r.node.Name()), true)
	}
	v, err := r.pool.Volume(volume)
	if err != nil {
		return err
	}
	op := in.Ops[0]
	op.Nodes = nodes
	var lerr error
	if !atCut {
		lerr = poolStore{r.pool}.ApplyOp(ctx, volume, op)
	}
	if lerr != nil {
		// This copy cannot take the change: it stays as it is, and is the
		// truth; every in-sync copy, which may hold the change, is made
		// this copy's again by its resync (conform, then whole).
		r.log.Warn("the intent's change failed here: the copies are made this one's", "volume", volume, "err", lerr)
		for _, n := range nodes {
			if err := r.node.Copies().MarkDiverged(volume, n, term, fmt.Errorf("%s %s was left unfinished and failed on the "+
				"new primary: %w", op.Kind, op.Name, lerr)); err != nil {
				return err
			}
		}
	} else {
		each, err := r.node.Ops().RunOpEach(ctx, volume, term, op)
		if err != nil {
			return err
		}
		for _, n := range nodes {
			if cause := each[n]; cause != nil {
				if err := r.node.Copies().MarkDiverged(volume, n, term, fmt.Errorf("%s %s, left unfinished, failed on this copy "+
					"(it is copied whole by its resync): %w", op.Kind, op.Name, cause)); err != nil {
					return err
				}
			}
		}
	}
	for _, b := range role.Behind {
		if b.Node == in.Primary && b.Node != r.node.Name() && b.WasPrimary != 0 {
			// The intent's primary changed its own disks at the cut,
			// which no activity log records: its resync is whole.
			if err := r.node.Copies().MarkDiverged(volume, b.Node, term, fmt.Errorf("%s %s was left unfinished by it "+
				"as the primary: it is copied whole by its resync", op.Kind, op.Name)); err != nil {
				return err
			}
		}
	}
	info := v.Info()
	specs := make([]api.DiskSpec, 0, len(info.Disks))
	for _, d := range info.Disks {
		specs = append(specs, api.DiskSpec{Name: d.Name, Size: d.Size, Shared: d.Shared})
	}
	if err := r.node.Volumes().UpdateDisks(ctx, volume, term, info.Capacity, specs); err != nil {
		return err
	}
	return r.node.Ops().SettledIntent(ctx, volume, term, in, nil)
}

// undoIntent deletes the clones of in that are not placed, or its
// snapshot, here and on holders (the nodes that may hold a part: those down are asked again by
// the settle loop), and records the intent settled with the nodes still
// pending. here: this node's own part too.
func (r *Volumes) undoIntent(ctx context.Context, volume string, in cluster.Intent, term uint64, holders []string,
	here bool) error {
	placed := map[string]string{}
	for _, op := range in.Ops {
		if op.Kind != cluster.OpClone {
			continue
		}
		if p, ok, err := r.node.Volumes().Placement(ctx, op.Name); err != nil {
			return err
		} else if ok {
			placed[op.Name] = p.UID
		}
	}
	ups, err := r.node.Nodes(ctx)
	if err != nil {
		return err
	}
	up := map[string]bool{}
	for _, n := range ups {
		up[n.Name] = n.Up
	}
	var ask []string
	for _, n := range holders {
		if up[n] {
			ask = append(ask, n)
		}
	}
	answered := map[string]error{}
	for _, n := range ask {
		answered[n] = nil
	}
	for _, undo := range cluster.UndoOps(in, placed) {
		if here {
			var err error
			if undo.Kind == cluster.OpUnclone {
				err = r.node.Ops().UndoClone(ctx, volume, undo)
			} else {
				err = poolStore{r.pool}.ApplyOp(ctx, volume, undo)
			}
			if err != nil {
				return err
			}
		}
		undo.Nodes = ask
		each, err := r.node.Ops().RunOpEach(ctx, volume, term, undo)
		if err != nil {
			return err
		}
		for _, n := range ask {
			if each[n] != nil {
				answered[n] = each[n]
			}
		}
	}
	p, _, err := r.node.Volumes().Placement(ctx, volume)
	if err != nil {
		return err
	}
	placement := []string{p.Primary}
	for _, c := range p.Copies {
		placement = append(placement, c.Node)
	}
	pending := cluster.StillPending(holders, answered, placement)
	if len(pending) > 0 {
		r.log.Warn("change undone; nodes down keep their part until they are back", "volume", volume, "pending", pending)
	}
	return r.node.Ops().SettledIntent(ctx, volume, term, in, pending)
}

// settleRound is one round of the resync loop for intents: each left
// behind on a volume this node is the primary of is settled (settleFirst),
// and an undone one asks its pending nodes again once they are up.
func (r *Volumes) settleRound(ctx context.Context, pls map[string]cluster.Placement) {
	all, err := r.node.Ops().Intents(ctx)
	if err != nil {
		return
	}
	me := r.node.Name()
	for volume, in := range all {
		p, ok := pls[volume]
		if !ok || p.Primary != me {
			continue
		}
		var err error
		if in.Settled {
			mu := r.intents.lock(volume)
			mu.Lock()
			err = r.undoIntent(ctx, volume, in, p.Term, in.Pending, false)
			mu.Unlock()
		} else {
			err = r.settleFirst(ctx, volume)
		}
		if err != nil && ctx.Err() == nil {
			r.log.Warn("settle an intent (tried again)", "volume", volume, "intent", in.ID, "err", err)
		}
	}
}

// crashPoint calls the step hook of Options.AtStep, if any, with the step
// of a change at the cut this process reached.
func (r *Volumes) crashPoint(point string) {
	if r.atStep != nil {
		r.atStep(point)
	}
}
