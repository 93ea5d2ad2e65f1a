package replicated

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"golang.org/x/time/rate"

	"github.com/quiverstorage/quiver/internal/cluster"
	"github.com/quiverstorage/quiver/internal/job"
	"github.com/quiverstorage/quiver/internal/pool"
	"github.com/quiverstorage/quiver/internal/replica"
)

// resyncInterval is how often the primary looks for copies to bring back;
// resyncBackoff how long it waits after a resync that stopped.
const (
	resyncInterval = time.Second
	resyncBackoff  = 5 * time.Second
)

// resyncLoop brings back the degraded copies of the volumes this node is
// the primary of, once their nodes are up (docs/cluster.md, "Degraded mode
// and resync"): one resync per copy at a time, a failed one tried again
// after resyncBackoff.
func (r *Volumes) resyncLoop(ctx context.Context) {
	var mu sync.Mutex
	running := map[string]bool{}
	retry := map[string]time.Time{}
	downSince := map[string]time.Time{}
	replaceErr := map[string]string{} // the last error replacing a copy of a node being replaced, logged once
	t := time.NewTicker(resyncInterval)
	defer t.Stop()
	var wg sync.WaitGroup
	defer wg.Wait()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if !r.node.Up() {
			continue
		}
		lctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		pls, err := r.node.Volumes().Placements(lctx)
		cancel()
		if err != nil {
			continue
		}
		lctx, cancel = context.WithTimeout(ctx, 5*time.Second)
		nodes, err := r.node.Nodes(lctx)
		cancel()
		if err != nil {
			continue
		}
		up := map[string]bool{}
		for _, ni := range nodes {
			up[ni.Name] = ni.Up
		}
		lctx, cancel = context.WithTimeout(ctx, 5*time.Second)
		replacing, err := r.node.Replacements(lctx)
		cancel()
		if err != nil {
			continue
		}
		lctx, cancel = context.WithTimeout(ctx, 2*time.Minute)
		r.settleRound(lctx, pls)
		cancel()
		me := r.node.Name()
		for name, p := range pls {
			if p.Primary != me || p.Deleting || p.Replicas <= 1 {
				continue
			}
			r.forgetRemoved(name, p)
			for _, c := range p.Copies {
				key := name + "/" + c.Node
				if to, ok := replacing[c.Node]; ok && !up[c.Node] && c.Node != me {
					// `quiver node replace`: its node is gone for good;
					// replaced now, in sync or not, on the node named.
					err := r.replace(ctx, name, c.Node, to, p)
					if err != nil && err.Error() != replaceErr[key] {
						r.log.Warn("replace a copy of a node being replaced", "volume", name, "copy", c.Node, "new", to, "err", err)
					}
					if err != nil {
						replaceErr[key] = err.Error()
					} else {
						delete(replaceErr, key)
					}
					continue
				}
				rebuild := c.State == cluster.CopyRebuilding
				stale := c.State == cluster.CopyDegraded || c.State == cluster.CopyResyncing || rebuild
				// An in-sync copy on a node that is gone counts too: an
				// idle volume's copy stays in sync when its node dies
				// (no write failed on it), and the volume has one copy
				// fewer all the same.
				gone := !up[c.Node] && (stale || c.State == cluster.CopyInSync)
				if c.Node == me || (!stale && !gone) {
					delete(downSince, key)
					continue
				}
				if !up[c.Node] {
					// Gone: after RebuildAfter its copy is replaced by a
					// new one on another node.
					if _, ok := downSince[key]; !ok {
						downSince[key] = time.Now()
					}
					if r.rebuildAfter > 0 && time.Since(downSince[key]) > r.rebuildAfter {
						if err := r.replace(ctx, name, c.Node, "", p); err != nil {
							r.log.Warn("replace a copy whose node is gone", "volume", name, "copy", c.Node, "err", err)
						} else {
							delete(downSince, key)
						}
					}
					continue
				}
				delete(downSince, key)
				if rebuild && !r.copyMade(ctx, name, c.Node) {
					continue // the new node has not made its copy yet
				}
				mu.Lock()
				busy := running[key] || time.Now().Before(retry[key])
				if !busy {
					running[key] = true
				}
				mu.Unlock()
				if busy {
					continue
				}
				wg.Add(1)
				go func() {
					defer wg.Done()
					var err error
					if rebuild {
						// A rebuild is a job (GET /v1/jobs): its progress,
						// and a cancel that stops it (tried again later).
						j := r.jobs.Start("rebuild", name+"/"+c.Node, len(p.Spec.Disks), func(jctx context.Context, j *job.Job) error {
							return r.resync(jctx, name, c.Node, p, true, j)
						})
						err = j.Wait(ctx)
					} else {
						err = r.resync(ctx, name, c.Node, p, false, nil)
					}
					mu.Lock()
					delete(running, key)
					if err != nil {
						retry[key] = time.Now().Add(resyncBackoff)
					}
					mu.Unlock()
				}()
			}
		}
	}
}

// resync brings copy node of volume back in sync, when its node is up:
// every disk's dirty granules are copied while I/O goes on, then the copy
// rejoins the in-sync set in one etcd transaction (replica.Rejoin).
func (r *Volumes) resync(ctx context.Context, volume, node string, p cluster.Placement, rebuild bool, j *job.Job) error {
	state, what := cluster.CopyResyncing, "resync"
	if rebuild {
		state, what = cluster.CopyRebuilding, "rebuild"
	}
	role, err := r.node.Primaries().Role(ctx, volume)
	if err != nil || !role.IsPrimary(r.node.Name()) {
		return fmt.Errorf("resync %s on %s: not the primary (%v)", volume, node, err)
	}
	var target cluster.Target
	for _, b := range role.Behind {
		if b.Node == node {
			target = b
		}
	}
	if target.NBD == "" {
		return fmt.Errorf("resync %s on %s: the copy's node is down", volume, node)
	}
	if target.Term < role.Term {
		// After a failover the copy attaches for this primary at its
		// term (cluster's followTerm); until then it refuses this
		// primary's sessions.
		return fmt.Errorf("resync %s on %s: the copy has not followed term %d yet", volume, node, role.Term)
	}
	v, err := r.pool.Volume(volume)
	if err != nil {
		return err
	}
	start := time.Now()
	r.metrics.resyncActive.Inc()
	defer r.metrics.resyncActive.Dec()
	fail := func(err error) error {
		r.metrics.resyncs.WithLabelValues("stopped").Inc()
		r.log.Warn(what+" stopped; the copy stays out of sync", "volume", volume, "copy", node, "err", err)
		after := cluster.CopyDegraded
		if rebuild {
			after = cluster.CopyRebuilding
		}
		reason := err.Error()
		if !errors.Is(err, replica.ErrResync) {
			reason = what + " stopped: " + reason
		}
		if serr := r.node.Copies().SetCopyState(volume, node, role.Term, after, reason, nil); serr != nil {
			// The copy stays out of the in-sync set all the same; its
			// record may still say resyncing until the next try.
			r.log.Warn("record the stopped "+what, "volume", volume, "copy", node, "err", serr)
			return errors.Join(err, fmt.Errorf("record the copy %s: %w", after, serr))
		}
		return err
	}
	if target.Whole || rebuild {
		// It may have missed a change of the disks at the cut (cut.go),
		// or been made from an older spec.
		if err := r.conform(ctx, v, node, role.Term); err != nil {
			return fail(err)
		}
	}
	// An old primary's copy, back under the primary promoted in its
	// place: this node's bitmaps hold every change since, its activity
	// logs where it may hold what this node lacks.
	activity := target.ActivityFor(role.Term)
	if rebuild {
		activity = nil
	}
	from := "dirty bitmap"
	switch {
	case rebuild:
		from = "whole copy"
	case target.Whole && activity != nil:
		from = "dirty bitmap and the old primary's activity log"
	case target.Whole:
		from = "whole copy"
	}
	var rs []*replica.Resync
	var total int64
	var locals []pool.Disk
	var wait func(context.Context, int) error
	if r.rate > 0 {
		lim := rate.NewLimiter(rate.Limit(r.rate), int(max(r.rate, replica.DefaultGranule)))
		wait = lim.WaitN
	}
	for _, d := range p.Spec.Disks {
		local, err := v.OpenDisk(d.Name)
		if err != nil {
			return fail(err)
		}
		defer local.Close()
		locals = append(locals, local)
		ent, err := r.acquire(ctx, volume, d.Name, role, local.Size())
		if err != nil {
			return fail(err)
		}
		defer r.release(ent)
		if err := markBeyondBitmap(ent.set, node, d.Name, local.Size(), rebuild || target.Whole, activity); err != nil {
			return fail(err)
		}
		x, err := ent.set.BeginResync(ctx, r.copyOf(volume, d.Name, role.Term, target))
		if err != nil {
			for _, x := range rs {
				x.Abort(err)
			}
			return fail(err)
		}
		rs = append(rs, x)
		total += x.Total()
	}
	progress := func() *cluster.Progress {
		var done int64
		for _, x := range rs {
			done += x.Copied()
		}
		return &cluster.Progress{DoneBytes: done, TotalBytes: total}
	}
	// The start is a change of the copy's state, recorded as the primary
	// at role.Term of an out-of-sync copy: when it cannot be, this node
	// may no longer be that primary, and the copy is left as it is.
	if err := r.node.Copies().SetCopyState(volume, node, role.Term, state, "", progress()); err != nil {
		for _, x := range rs {
			x.Abort(err)
		}
		return fail(fmt.Errorf("record the %s started: %w", what, err))
	}
	r.log.Info(what+" started", "volume", volume, "copy", node, "bytes", total, "from", from)
	var reported int64
	var reportFailed bool
	report := func() {
		pr := progress()
		// Progress is best effort: the copy goes back in sync only
		// through Rejoin's own transaction.
		if err := r.node.Copies().SetCopyState(volume, node, role.Term, state, "", pr); err != nil && !reportFailed {
			reportFailed = true
			r.log.Warn("record the progress of a "+what+" (logged once)", "volume", volume, "copy", node, "err", err)
		}
		if j != nil {
			j.Add(pr.DoneBytes - reported)
			reported = pr.DoneBytes
		}
	}
	if j != nil {
		j.AddTotal(total)
	}
	stop := make(chan struct{})
	var pw sync.WaitGroup
	pw.Add(1)
	go func() {
		defer pw.Done()
		t := time.NewTicker(time.Second)
		defer t.Stop()
		for {
			select {
			case <-stop:
				return
			case <-t.C:
				report()
			}
		}
	}()
	var runErr error
	var sent int64
	for i := range rs {
		err := rs[i].Run(ctx, locals[i], wait)
		r.metrics.resyncBytes.Add(float64(rs[i].Copied()))
		sent += rs[i].Sent()
		if err != nil {
			runErr = err
			break
		}
	}
	close(stop)
	pw.Wait()
	report()
	if runErr != nil {
		for _, x := range rs {
			x.Abort(runErr)
		}
		return fail(runErr)
	}
	if err := replica.Rejoin(rs, func() error { return r.node.Copies().MarkInSync(volume, node, role.Term) }); err != nil {
		if !errors.Is(err, replica.ErrBitmapLeft) {
			return fail(err)
		}
		r.log.Warn("copy in sync; a dirty bitmap was left", "volume", volume, "copy", node, "err", err)
	}
	r.metrics.resyncs.WithLabelValues("ok").Inc()
	r.log.Info("copy "+what+" done: back in sync", "volume", volume, "copy", node, "copiedBytes", total,
		"dataBytes", sent, "from", from, "took", time.Since(start).Round(time.Millisecond))
	return nil
}

// markBeyondBitmap marks in the bitmap of copy node what its resync must
// copy besides the changes the bitmap holds: nothing for a copy that only
// fell behind under this primary; for a copy that is not whole-known
// (whole: a rebuild's new copy, a diverged copy, or one that fell behind
// under an older primary), every granule, unless it is an old primary's
// whose activity log of disk this node trusts (activity, from
// cluster.Target.ActivityFor), then the extents that log holds.
func markBeyondBitmap(set *replica.Set, node, disk string, size int64, whole bool, activity *cluster.CopyActivity) error {
	if !whole {
		return nil
	}
	if activity != nil {
		if extents, ok := activity.Disks[disk]; ok {
			a := replica.Activity{Term: activity.Term, Extent: activity.Extent, Extents: extents}
			return set.MarkRanges(node, a.Ranges(size))
		}
	}
	return set.MarkWhole(node)
}

// replace moves the copy of a node gone longer than rebuildAfter, or being
// replaced, to another node, prefer when it is eligible
// (cluster.ReplaceCopy), and forgets its dirty bitmaps here.
func (r *Volumes) replace(ctx context.Context, volume, gone, prefer string, p cluster.Placement) error {
	v, err := r.pool.Volume(volume)
	if err != nil {
		return err
	}
	next, err := r.node.Copies().ReplaceCopy(ctx, volume, gone, prefer, p.Term)
	if err != nil {
		return err
	}
	uid := v.Info().UID
	r.mu.Lock()
	var sets []*replica.Set
	for _, d := range p.Spec.Disks {
		if e := r.m[volume+"/"+d.Name]; e != nil {
			sets = append(sets, e.set)
		}
	}
	r.mu.Unlock()
	for _, s := range sets {
		_ = s.Forget(gone)
	}
	for _, d := range p.Spec.Disks {
		_ = r.pool.FS().Remove(replica.BitmapPath(uid, d.Name, gone))
	}
	r.log.Info("rebuild placed", "volume", volume, "gone", gone, "new", next)
	return nil
}

// copyMade says whether node has made its copy of volume (its attachment
// for the primary is recorded).
func (r *Volumes) copyMade(ctx context.Context, volume, node string) bool {
	role, err := r.node.Primaries().Role(ctx, volume)
	if err != nil {
		return false
	}
	for _, b := range role.Behind {
		if b.Node == node {
			return b.NBD != "" && b.Term >= role.Term
		}
	}
	return false
}
