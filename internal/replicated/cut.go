package replicated

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"

	"github.com/quiverstorage/quiver/internal/api"
	"github.com/quiverstorage/quiver/internal/cluster"
	"github.com/quiverstorage/quiver/internal/pool"
)

// cutState is what a change at the cut sees: this primary's role (every
// copy in sync, read again once frozen) and the frozen Sets by disk.
type cutState struct {
	role  cluster.Role
	nodes []string // the in-sync copies other than this node
	sets  map[string]*setEntry
}

// atCut runs change on a replicated volume this node is the primary of,
// with every disk's Set frozen: no change in flight on the primary or on
// any copy, new ones held until change returns (the volume's I/O gate
// spanning its copies, docs/cluster.md). A volume with a copy out of sync
// is refused (cluster.ErrDegraded) before anything changes. Afterwards the
// Sets of the disks in reset are dropped from the map, so the next handle
// makes a Set of the disk as it is now (its size); handles open across the
// change keep theirs.
func (r *Volumes) atCut(ctx context.Context, volume, what string, reset func() []string,
	change func(ctx context.Context, cs *cutState) error) error {
	v, err := r.pool.Volume(volume)
	if err != nil {
		return err
	}
	role, err := r.primaryRole(ctx, volume, what)
	if err != nil {
		return err
	}
	cs := &cutState{sets: map[string]*setEntry{}}
	var thaws []func()
	defer func() {
		// Thaw before the release: the last release closes a Set, which
		// waits for its gate.
		for _, t := range thaws {
			t()
		}
		if reset != nil {
			r.forget(volume, reset())
		}
		for _, e := range cs.sets {
			r.release(e)
		}
	}()
	for _, d := range v.Info().Disks {
		ent, err := r.acquire(ctx, volume, d.Name, role, d.Size)
		if err != nil {
			return err
		}
		cs.sets[d.Name] = ent
		thaws = append(thaws, ent.set.Freeze())
	}
	// Frozen: read the in-sync set again, as etcd has it now (a copy
	// unreachable when its Set was made has just left it).
	if cs.role, err = r.primaryRole(ctx, volume, what); err != nil {
		return err
	}
	for _, t := range cs.role.Targets {
		cs.nodes = append(cs.nodes, t.Node)
	}
	return change(ctx, cs)
}

// forget drops the Sets of the disks of volume from the map: the next
// acquire makes new ones.
func (r *Volumes) forget(volume string, disks []string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, d := range disks {
		delete(r.m, volume+"/"+d)
	}
}

// applyAtCut sends op to the in-sync copies, after this primary changed its
// own copy the same way at the cut. A copy that failed it, or did not
// answer, is recorded diverged (out of sync, to be copied whole by its
// resync) and written no more, before the cut ends: never silently
// divergent. Sets of disks the primary no longer has write no copy.
// The error says what could not be recorded: then the change is done here
// but the copies' state is unknown to etcd, and the caller fails.
func (r *Volumes) applyAtCut(ctx context.Context, volume string, cs *cutState, op cluster.Op, disks []pool.DiskInfo) error {
	op.Nodes = cs.nodes
	each, err := r.node.Ops().RunOpEach(ctx, volume, cs.role.Term, op)
	if err != nil {
		each = map[string]error{}
		for _, n := range cs.nodes {
			each[n] = err
		}
	}
	var errs error
	for _, n := range cs.nodes {
		cause := each[n]
		if cause == nil {
			continue
		}
		cause = fmt.Errorf("%s %s at the cut failed on this copy (it is copied whole by its resync): %w", op.Kind, op.Name, cause)
		r.log.Warn("copy failed a change at the cut: recorded diverged", "volume", volume, "copy", n, "op", op.Kind, "err", cause)
		if err := r.node.Copies().MarkDiverged(volume, n, cs.role.Term, cause); err != nil {
			errs = errors.Join(errs, fmt.Errorf("record the copy on %s diverged: %w", n, err))
		}
		for _, e := range cs.sets {
			e.set.Leave(n)
		}
	}
	for name, e := range cs.sets {
		if !slices.ContainsFunc(disks, func(d pool.DiskInfo) bool { return d.Name == name }) {
			for _, n := range cs.nodes {
				e.set.Leave(n) // the disk is gone here and on the copies
			}
		}
	}
	if errs != nil {
		return intentOpen(errs)
	}
	specs := make([]api.DiskSpec, 0, len(disks))
	var capacity int64
	if v, err := r.pool.Volume(volume); err == nil {
		capacity = v.Info().Capacity
	}
	for _, d := range disks {
		specs = append(specs, api.DiskSpec{Name: d.Name, Size: d.Size, Shared: d.Shared})
	}
	if err := r.node.Volumes().UpdateDisks(ctx, volume, cs.role.Term, capacity, specs); err != nil {
		return intentOpen(err)
	}
	return nil
}

// Rollback rolls a replicated volume this node is the primary of back to a
// snapshot on every copy at one cut: frozen, every in-sync copy is asked
// whether it holds the snapshot (the same UID); one that does not refuses
// the rollback (cluster.ErrCopyMismatch) with nothing changed. Then this
// copy rolls back (pool.Hold.Rollback: durable on return), then every
// in-sync copy does; a copy that fails is recorded diverged. h is the
// volume's hold, released on return.
func (r *Volumes) Rollback(ctx context.Context, h *pool.Hold, volume, snapshot string, force bool,
	prog pool.Progress) (pool.VolumeInfo, error) {
	defer h.Release()
	v, err := r.pool.Volume(volume)
	if err != nil {
		return pool.VolumeInfo{}, err
	}
	what := "rollback " + volume + " to " + snapshot
	var info pool.VolumeInfo
	before := v.Info().Disks
	reset := func() []string { return diskNames(before, info.Disks) }
	err = r.atCut(ctx, volume, what, reset, func(ctx context.Context, cs *cutState) error {
		snap, err := v.Snapshot(snapshot)
		if err != nil {
			return err
		}
		check := cluster.Op{Kind: cluster.OpCheckSnapshot, Name: snapshot, UID: snap.UID, Nodes: cs.nodes}
		each, err := r.node.Ops().RunOpEach(ctx, volume, cs.role.Term, check)
		if err != nil {
			return fmt.Errorf("%s: %w", what, err)
		}
		var lack []string
		for _, n := range cs.nodes {
			if each[n] != nil {
				lack = append(lack, each[n].Error())
			}
		}
		if len(lack) > 0 {
			return fmt.Errorf("%s: refused, nothing changed: %s; the copies must hold the same snapshot (a copy "+
				"rebuilt on another node has none of the older ones): %w", what, strings.Join(lack, "; "), cluster.ErrCopyMismatch)
		}
		op := cluster.Op{Kind: cluster.OpRollback, Name: snapshot, UID: snap.UID}
		return r.intended(ctx, volume, cs, []cluster.Op{op}, func() error {
			if info, err = h.Rollback(ctx, snapshot, force, prog); err != nil {
				return err
			}
			r.crashPoint("rollback:after-local")
			return r.applyAtCut(ctx, volume, cs, op, info.Disks)
		})
	})
	if err != nil {
		return pool.VolumeInfo{}, err
	}
	r.log.Info("rolled back on every copy", "volume", volume, "snapshot", snapshot)
	return info, nil
}

// AddDisk adds an empty disk to a replicated volume on every copy at one
// cut (pool.Volume.AddDiskWith here first; durable on return).
func (r *Volumes) AddDisk(ctx context.Context, volume string, d pool.DiskSpec, idem pool.Idempotency) (pool.VolumeInfo, error) {
	op := cluster.Op{Kind: cluster.OpAddDisk, Name: d.Name, Disk: &api.DiskSpec{Name: d.Name, Size: d.Size, Shared: d.Shared}}
	return r.diskChange(ctx, volume, "add disk "+d.Name+" to "+volume, nil, op, func(v *pool.Volume) (pool.VolumeInfo, error) {
		return v.AddDiskWith(ctx, d, idem)
	})
}

// GrowDisk grows a disk of a replicated volume on every copy at one cut.
// A client connected before sees the old size until it connects again
// (NBD gives the size at the handshake).
func (r *Volumes) GrowDisk(ctx context.Context, volume, disk string, size int64) (pool.VolumeInfo, error) {
	op := cluster.Op{Kind: cluster.OpGrowDisk, Name: disk, Disk: &api.DiskSpec{Name: disk, Size: size}}
	return r.diskChange(ctx, volume, "grow disk "+disk+" of "+volume, []string{disk}, op, func(v *pool.Volume) (pool.VolumeInfo, error) {
		return v.GrowDisk(ctx, disk, size)
	})
}

// RemoveDisk removes a disk of a replicated volume on every copy at one
// cut; while writers are connected it is refused (pool.ErrInUse) unless
// force.
func (r *Volumes) RemoveDisk(ctx context.Context, volume, disk string, force bool) (pool.VolumeInfo, error) {
	op := cluster.Op{Kind: cluster.OpRemoveDisk, Name: disk, Disk: &api.DiskSpec{Name: disk}}
	return r.diskChange(ctx, volume, "remove disk "+disk+" of "+volume, []string{disk}, op, func(v *pool.Volume) (pool.VolumeInfo, error) {
		return v.RemoveDiskWith(ctx, disk, force)
	})
}

// Update changes a replicated volume's capacity, labels or QoS limits on
// every copy at one cut: here first (pool.Volume.Update, durable on
// return), then on every in-sync copy (applyAtCut, a copy that fails it is
// recorded diverged, and conformed by its resync), under an intent
// recorded before the change here. The caller has recorded the change in
// the volume's spec in etcd (cluster.Volumes.UpdateSpec).
func (r *Volumes) Update(ctx context.Context, volume string, u api.VolumeUpdate) (pool.VolumeInfo, error) {
	v, err := r.pool.Volume(volume)
	if err != nil {
		return pool.VolumeInfo{}, err
	}
	op := cluster.Op{Kind: cluster.OpUpdate, Name: volume, Update: &u}
	var info pool.VolumeInfo
	err = r.atCut(ctx, volume, "update "+volume, nil, func(ctx context.Context, cs *cutState) error {
		return r.intended(ctx, volume, cs, []cluster.Op{op}, func() error {
			if err := applyUpdate(ctx, v, &u); err != nil {
				return err
			}
			info = v.Info()
			r.crashPoint(op.Kind + ":after-local")
			return r.applyAtCut(ctx, volume, cs, op, info.Disks)
		})
	})
	if err != nil {
		return pool.VolumeInfo{}, err
	}
	r.log.Info("volume updated on every copy", "volume", volume)
	return info, nil
}

// settingsOf is the update that gives a copy info's capacity, labels and
// QoS limits.
func settingsOf(info pool.VolumeInfo) *api.VolumeUpdate {
	q := api.QoS(info.QoS)
	u := cluster.UpdateOf(api.VolumeSpec{Capacity: info.Capacity, Labels: info.Labels, QoS: &q})
	return &u
}

// diskChange runs local, a change of this copy's disks, at the cut, then
// the same change, op, on every in-sync copy (applyAtCut), under an intent
// recorded before the local change. A local change that changed nothing
// (an idempotent retry, a grow to the same size) is still sent: the copies
// answer it the same way.
func (r *Volumes) diskChange(ctx context.Context, volume, what string, reset []string, op cluster.Op,
	local func(v *pool.Volume) (pool.VolumeInfo, error)) (pool.VolumeInfo, error) {
	v, err := r.pool.Volume(volume)
	if err != nil {
		return pool.VolumeInfo{}, err
	}
	var info pool.VolumeInfo
	err = r.atCut(ctx, volume, what, func() []string { return reset }, func(ctx context.Context, cs *cutState) error {
		// A disk change leaves the volume's capacity as it is.
		op.Capacity = v.Info().Capacity
		return r.intended(ctx, volume, cs, []cluster.Op{op}, func() error {
			var err error
			if info, err = local(v); err != nil {
				return err
			}
			op.Capacity = info.Capacity
			r.crashPoint(op.Kind + ":after-local")
			return r.applyAtCut(ctx, volume, cs, op, info.Disks)
		})
	})
	if err != nil {
		return pool.VolumeInfo{}, err
	}
	r.log.Info("disks changed on every copy", "volume", volume, "op", what)
	return info, nil
}

// diskNames lists the names of before and after that differ (a disk in one
// only, or of another size), sorted.
func diskNames(before, after []pool.DiskInfo) []string {
	size := map[string]int64{}
	for _, d := range before {
		size[d.Name] = d.Size
	}
	var out []string
	seen := map[string]bool{}
	for _, d := range after {
		seen[d.Name] = true
		if s, ok := size[d.Name]; !ok || s != d.Size {
			out = append(out, d.Name)
		}
	}
	for _, d := range before {
		if !seen[d.Name] {
			out = append(out, d.Name)
		}
	}
	sort.Strings(out)
	return out
}

// conform has the copy on node make its disk set this primary's (sizes
// included) before its resync copies it whole.
func (r *Volumes) conform(ctx context.Context, v *pool.Volume, node string, term uint64) error {
	info := v.Info()
	op := cluster.Op{Kind: cluster.OpConformDisks, Name: info.Name, Capacity: info.Capacity, Nodes: []string{node},
		Update: settingsOf(info)}
	for _, d := range info.Disks {
		op.Disks = append(op.Disks, api.DiskSpec{Name: d.Name, Size: d.Size, Shared: d.Shared})
	}
	return r.node.Ops().RunOp(ctx, info.Name, term, op)
}
