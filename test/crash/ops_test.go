package crash

import (
	"context"
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/quiverstorage/quiver/internal/api"
	"github.com/quiverstorage/quiver/internal/client"
)

const (
	mib = int64(1) << 20
	// maxOwned is how many volumes a worker keeps before it deletes some,
	// so that the pool, and each verification, stays small.
	maxOwned = 5
	// maxSnaps is how many snapshots a volume keeps before one is deleted.
	maxSnaps = 3
	// maxDisks bounds the disks of a volume in the workload.
	maxDisks = 4
)

var diskNames = []string{"root", "data", "logs", "swap", "scratch"}

// op is one API call with what it does to the model. alts holds the state of
// every volume the call touches once it has succeeded (nil: the volume is
// gone). The model is changed only when the call returns success; a call
// interrupted by the kill may or may not have happened, and for each volume
// in alts independently (a bulk clone makes any subset of its names).
type op struct {
	kind string
	desc string
	alts map[string]*volState
	// src is the volume a clone reads from.
	src string
	// call sends the request and checks what the server answered against
	// alts; a wrong answer is a *wrongAnswer.
	call func(ctx context.Context, c *client.Client) error
	// retry marks calls that may be sent again after a crash and must then
	// succeed with the same outcome (idempotent creates, absolute updates).
	retry bool
}

// wrongAnswer is a success answer that disagrees with the model.
type wrongAnswer struct{ msg string }

func (e *wrongAnswer) Error() string { return e.msg }

func wrong(format string, args ...any) error { return &wrongAnswer{msg: fmt.Sprintf(format, args...)} }

// worker issues operations on the volumes whose names start with its prefix,
// one at a time. Workers own disjoint volumes, so their operations commute
// and each volume is touched by at most one uncertain operation per crash.
type worker struct {
	prefix string
	rng    *rand.Rand
	seq    int // names are never reused, so an uncertain create is unambiguous
	keys   int // idempotency keys handed out
}

// key names one create request: the op sends it on every try, so a retry
// after a crash gets the object the first try made, while any other create
// of a taken name is a conflict.
func (w *worker) key() client.CallOption {
	w.keys++
	return client.IdempotencyKey(w.prefix + "req" + strconv.Itoa(w.keys))
}

func (w *worker) fresh(kind string) string {
	w.seq++
	return w.prefix + kind + strconv.Itoa(w.seq)
}

func (w *worker) owned(m model) []string {
	var out []string
	for _, n := range sortedKeys(m) {
		if strings.HasPrefix(n, w.prefix) {
			out = append(out, n)
		}
	}
	return out
}

func pick[T any](r *rand.Rand, s []T) T { return s[r.IntN(len(s))] }

// diskSize is a few MiB, a multiple of 512 but rarely of a MiB.
func (w *worker) diskSize() int64 { return (1+w.rng.Int64N(3))*mib + w.rng.Int64N(64)*512 }

// next chooses the next operation from the model as it stands.
func (w *worker) next(m model) *op {
	own := w.owned(m)
	switch {
	case len(own) == 0:
		return w.create()
	case len(own) > maxOwned:
		return w.deleteVolume(pick(w.rng, own))
	}
	type choice struct {
		weight int
		make   func(name string, v *volState) *op
	}
	choices := []choice{
		{10, func(string, *volState) *op { return w.create() }},
		{18, w.snapshot},
		{8, w.cloneFromSnapshot},
		{6, w.cloneFromLive},
		{5, w.bulkClone},
		{14, w.rollback},
		{7, w.deleteSnapshot},
		{5, func(n string, _ *volState) *op { return w.deleteVolume(n) }},
		{7, w.addDisk},
		{8, w.growDisk},
		{3, w.removeDisk},
		{4, w.update},
	}
	total := 0
	for _, c := range choices {
		total += c.weight
	}
	for range 20 {
		n := pick(w.rng, own)
		r := w.rng.IntN(total)
		for _, c := range choices {
			if r -= c.weight; r < 0 {
				if o := c.make(n, m[n]); o != nil {
					return o
				}
				break
			}
		}
	}
	return w.create()
}

func (w *worker) create() *op {
	name := w.fresh("v")
	v := &volState{Capacity: 64 * mib, Labels: map[string]string{"owner": strings.TrimSuffix(w.prefix, "-"), "gen": "0"},
		Snaps: map[string]snapState{}}
	for _, d := range diskNames[:1+w.rng.IntN(3)] {
		v.Disks = append(v.Disks, disk{Name: d, Size: w.diskSize()})
	}
	spec := api.VolumeSpec{Name: name, Capacity: v.Capacity, Labels: maps.Clone(v.Labels), Disks: apiDisks(v.Disks)}
	key := w.key()
	return &op{kind: "create", desc: "create " + name, alts: map[string]*volState{name: v}, retry: true,
		call: func(ctx context.Context, c *client.Client) error {
			got, err := c.CreateVolume(ctx, spec, key)
			if err != nil {
				return err
			}
			return checkVolume(name, v, got)
		}}
}

func checkVolume(name string, want *volState, got api.Volume) error {
	if got.Name != name {
		return wrong("answered volume %q, want %q", got.Name, name)
	}
	if d := sameVolume(want, got); d != "" {
		return wrong("volume %s: %s", name, d)
	}
	return nil
}

func (w *worker) snapshot(vol string, cur *volState) *op {
	if len(cur.Snaps) >= maxSnaps {
		return w.deleteSnapshot(vol, cur)
	}
	snap := w.fresh("s")
	v := cur.clone()
	v.Snaps[snap] = snapState{Disks: slices.Clone(cur.Disks), Capacity: cur.Capacity}
	async := w.rng.IntN(3) == 0
	key := w.key()
	return &op{kind: "snapshot", desc: fmt.Sprintf("snapshot %s@%s async=%v", vol, snap, async),
		alts: map[string]*volState{vol: v}, retry: true,
		call: func(ctx context.Context, c *client.Client) error {
			if async {
				return startAndWait(ctx, c, func() (api.Job, error) { return c.StartSnapshot(ctx, vol, snap, key) })
			}
			got, err := c.CreateSnapshot(ctx, vol, snap, key)
			if err != nil {
				return err
			}
			if got.Name != snap || got.Volume != vol || !slices.Equal(disksOf(got.Disks), withoutData(cur.Disks)) {
				return wrong("snapshot %s@%s answered %+v, want disks %v", vol, snap, got, cur.Disks)
			}
			return nil
		}}
}

// startAndWait starts a job and polls it to its end.
func startAndWait(ctx context.Context, c *client.Client, start func() (api.Job, error)) error {
	job, err := start()
	if err != nil {
		return err
	}
	_, err = c.WaitJob(ctx, job.ID, 2*time.Millisecond, nil)
	return err
}

// cloneOp clones names from vol (at snapshot snap, or live when snap is
// empty) whose state is cur.
func (w *worker) cloneOp(kind, vol, snap string, cur *volState, names []string) *op {
	from := snapState{Disks: cur.Disks, Capacity: cur.Capacity}
	if snap != "" {
		from = cur.Snaps[snap]
	}
	reqLabels := map[string]string{"from": vol}
	labels := maps.Clone(cur.Labels)
	if labels == nil {
		labels = map[string]string{}
	}
	maps.Copy(labels, reqLabels)
	alts := map[string]*volState{}
	for _, n := range names {
		alts[n] = &volState{Capacity: from.Capacity, Labels: maps.Clone(labels), Disks: slices.Clone(from.Disks),
			Source: &api.Source{Volume: vol, Snapshot: snap}, Snaps: map[string]snapState{}}
	}
	spec := api.CloneSpec{Source: api.Source{Volume: vol, Snapshot: snap}, Names: names, Labels: reqLabels}
	async := w.rng.IntN(3) == 0
	key := w.key()
	return &op{kind: kind, desc: fmt.Sprintf("clone %s@%s -> %v async=%v", vol, snap, names, async), alts: alts, src: vol, retry: true,
		call: func(ctx context.Context, c *client.Client) error {
			if async {
				return startAndWait(ctx, c, func() (api.Job, error) { return c.StartClone(ctx, spec, key) })
			}
			got, err := c.Clone(ctx, spec, key)
			if err != nil {
				return err
			}
			if len(got) != len(names) {
				return wrong("clone answered %d volumes, want %d", len(got), len(names))
			}
			for i, g := range got {
				if err := checkVolume(names[i], alts[names[i]], g); err != nil {
					return err
				}
			}
			return nil
		}}
}

func (w *worker) cloneFromSnapshot(vol string, cur *volState) *op {
	if len(cur.Snaps) == 0 {
		return nil
	}
	return w.cloneOp("clone-snapshot", vol, pick(w.rng, sortedKeys(cur.Snaps)), cur, []string{w.fresh("c")})
}

func (w *worker) cloneFromLive(vol string, cur *volState) *op {
	return w.cloneOp("clone-live", vol, "", cur, []string{w.fresh("c")})
}

func (w *worker) bulkClone(vol string, cur *volState) *op {
	names := make([]string, 2+w.rng.IntN(4))
	for i := range names {
		names[i] = w.fresh("c")
	}
	snap := ""
	if len(cur.Snaps) > 0 && w.rng.IntN(2) == 0 {
		snap = pick(w.rng, sortedKeys(cur.Snaps))
	}
	return w.cloneOp("clone-bulk", vol, snap, cur, names)
}

func (w *worker) rollback(vol string, cur *volState) *op {
	if len(cur.Snaps) == 0 {
		return nil
	}
	snap := pick(w.rng, sortedKeys(cur.Snaps))
	s := cur.Snaps[snap]
	v := cur.clone()
	v.Disks = slices.Clone(s.Disks)
	v.Capacity = max(cur.Capacity, s.Capacity)
	async := w.rng.IntN(3) == 0
	return &op{kind: "rollback", desc: fmt.Sprintf("rollback %s to %s async=%v", vol, snap, async),
		alts: map[string]*volState{vol: v}, retry: true,
		call: func(ctx context.Context, c *client.Client) error {
			if async {
				return startAndWait(ctx, c, func() (api.Job, error) { return c.StartRollback(ctx, vol, snap) })
			}
			got, err := c.Rollback(ctx, vol, snap)
			if err != nil {
				return err
			}
			return checkVolume(vol, v, got)
		}}
}

func (w *worker) deleteSnapshot(vol string, cur *volState) *op {
	if len(cur.Snaps) == 0 {
		return nil
	}
	snap := pick(w.rng, sortedKeys(cur.Snaps))
	v := cur.clone()
	delete(v.Snaps, snap)
	return &op{kind: "delete-snapshot", desc: fmt.Sprintf("delete snapshot %s@%s", vol, snap),
		alts: map[string]*volState{vol: v},
		call: func(ctx context.Context, c *client.Client) error { return c.DeleteSnapshot(ctx, vol, snap) }}
}

func (w *worker) deleteVolume(vol string) *op {
	return &op{kind: "delete", desc: "delete " + vol, alts: map[string]*volState{vol: nil},
		call: func(ctx context.Context, c *client.Client) error {
			_, err := c.DeleteVolume(ctx, vol, client.Recursive())
			return err
		}}
}

func (w *worker) addDisk(vol string, cur *volState) *op {
	if len(cur.Disks) >= maxDisks {
		return nil
	}
	var free []string
	for _, n := range diskNames {
		if !cur.hasDisk(n) {
			free = append(free, n)
		}
	}
	d := disk{Name: pick(w.rng, free), Size: w.diskSize()}
	if cur.totalSize()+d.Size > cur.Capacity {
		return nil
	}
	v := cur.clone()
	v.Disks = append(v.Disks, d)
	key := w.key()
	return &op{kind: "add-disk", desc: fmt.Sprintf("add disk %s/%s %d", vol, d.Name, d.Size),
		alts: map[string]*volState{vol: v}, retry: true,
		call: func(ctx context.Context, c *client.Client) error {
			got, err := c.AddDisk(ctx, vol, api.DiskSpec{Name: d.Name, Size: d.Size}, key)
			if err != nil {
				return err
			}
			return checkVolume(vol, v, got)
		}}
}

func (w *worker) growDisk(vol string, cur *volState) *op {
	if len(cur.Disks) == 0 {
		return nil
	}
	i := w.rng.IntN(len(cur.Disks))
	by := (1 + w.rng.Int64N(2048)) * 512
	if cur.totalSize()+by > cur.Capacity {
		return nil
	}
	v := cur.clone()
	v.Disks[i].Size += by
	d := v.Disks[i]
	return &op{kind: "grow-disk", desc: fmt.Sprintf("grow disk %s/%s to %d", vol, d.Name, d.Size),
		alts: map[string]*volState{vol: v}, retry: true,
		call: func(ctx context.Context, c *client.Client) error {
			got, err := c.GrowDisk(ctx, vol, d.Name, d.Size)
			if err != nil {
				return err
			}
			return checkVolume(vol, v, got)
		}}
}

func (w *worker) removeDisk(vol string, cur *volState) *op {
	if len(cur.Disks) == 0 {
		return nil
	}
	name := pick(w.rng, cur.Disks).Name
	v := cur.clone()
	v.Disks = slices.DeleteFunc(v.Disks, func(d disk) bool { return d.Name == name })
	return &op{kind: "remove-disk", desc: fmt.Sprintf("remove disk %s/%s", vol, name),
		alts: map[string]*volState{vol: v},
		call: func(ctx context.Context, c *client.Client) error {
			got, err := c.RemoveDisk(ctx, vol, name)
			if err != nil {
				return err
			}
			return checkVolume(vol, v, got)
		}}
}

func (w *worker) update(vol string, cur *volState) *op {
	v := cur.clone()
	var u api.VolumeUpdate
	if w.rng.IntN(2) == 0 {
		v.Capacity += 16 * mib
		capacity := v.Capacity
		u.Capacity = &capacity
	}
	if u.Capacity == nil || w.rng.IntN(2) == 0 {
		if v.Labels == nil {
			v.Labels = map[string]string{}
		}
		v.Labels["gen"] = strconv.Itoa(w.seq)
		u.Labels = maps.Clone(v.Labels)
	}
	return &op{kind: "update", desc: fmt.Sprintf("update %s capacity=%d labels=%v", vol, v.Capacity, u.Labels),
		alts: map[string]*volState{vol: v}, retry: true,
		call: func(ctx context.Context, c *client.Client) error {
			got, err := c.UpdateVolume(ctx, vol, u)
			if err != nil {
				return err
			}
			return checkVolume(vol, v, got)
		}}
}
