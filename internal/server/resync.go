package server

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"golang.org/x/time/rate"

	"github.com/quiverstorage/quiver/internal/cluster"
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
func (r *replicaSets) resyncLoop(ctx context.Context) {
	var mu sync.Mutex
	running := map[string]bool{}
	retry := map[string]time.Time{}
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
		pls, err := r.node.Placements(lctx)
		cancel()
		if err != nil {
			continue
		}
		me := r.node.Name()
		for name, p := range pls {
			if p.Primary != me || p.Deleting || p.Replicas <= 1 {
				continue
			}
			for _, c := range p.Copies {
				if c.Node == me || (c.State != cluster.CopyDegraded && c.State != cluster.CopyResyncing) {
					continue
				}
				key := name + "/" + c.Node
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
					err := r.resync(ctx, name, c.Node, p)
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
func (r *replicaSets) resync(ctx context.Context, volume, node string, p cluster.Placement) error {
	role, err := r.node.Role(ctx, volume)
	if err != nil || !role.IsPrimary(r.node.Name()) {
		return fmt.Errorf("resync %s on %s: not the primary (%v)", volume, node, err)
	}
	var target cluster.Target
	for _, b := range role.Behind {
		if b.Node == node {
			target = b
		}
	}
	if target.NBD == "" || target.Token == "" {
		return fmt.Errorf("resync %s on %s: the copy's node is down", volume, node)
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
		r.log.Warn("resync stopped; the copy stays degraded", "volume", volume, "copy", node, "err", err)
		if serr := r.node.SetCopyState(volume, node, role.Term, cluster.CopyDegraded, "resync stopped: "+err.Error(), nil); serr != nil {
			r.log.Debug("record the stopped resync", "volume", volume, "copy", node, "err", serr)
		}
		return err
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
		x, err := ent.set.BeginResync(ctx, replica.Copy{Node: node, Addr: target.NBD,
			Export: volume + "/" + d.Name + "/" + target.Token})
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
	_ = r.node.SetCopyState(volume, node, role.Term, cluster.CopyResyncing, "", progress())
	r.log.Info("resync started", "volume", volume, "copy", node, "bytes", total)
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
				_ = r.node.SetCopyState(volume, node, role.Term, cluster.CopyResyncing, "", progress())
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
	if runErr != nil {
		for _, x := range rs {
			x.Abort(runErr)
		}
		return fail(runErr)
	}
	if err := replica.Rejoin(rs, func() error { return r.node.MarkInSync(volume, node, role.Term) }); err != nil {
		if !errors.Is(err, replica.ErrBitmapLeft) {
			return fail(err)
		}
		r.log.Warn("copy in sync; a dirty bitmap was left", "volume", volume, "copy", node, "err", err)
	}
	r.metrics.resyncs.WithLabelValues("ok").Inc()
	r.log.Info("copy resynced: back in sync", "volume", volume, "copy", node, "copiedBytes", total,
		"dataBytes", sent, "took", time.Since(start).Round(time.Millisecond))
	return nil
}
