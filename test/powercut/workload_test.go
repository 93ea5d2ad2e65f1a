package powercut

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"

	"github.com/quiverstorage/quiver/internal/api"
	"github.com/quiverstorage/quiver/internal/client"
)

// Limits that keep a cycle short: reading back every disk and snapshot
// after each boot must stay cheap under TCG.
const (
	maxVolumes       = 3
	maxDisksPerVol   = 2
	maxSnapsPerVol   = 2
	maxWritesInBurst = 8
	// checkpointEvery: a write burst to a volume without a snapshot, and
	// one other burst in checkpointEvery, is followed by a snapshot of its
	// volume, so most cuts find a checkpoint with writes after it
	// (delta_test.go). Snapshots cost a TCG guest far more than writes: a
	// snapshot after every burst would leave little time to write.
	checkpointEvery = 24
)

// workload runs random steps against the quiver in the guest until the
// power is cut (cut becomes true) and returns nil then; any failure before
// the cut is returned. Each step updates the model as its replies arrive:
// a write enters the model before it is sent (it may land even if no reply
// comes), an operation is pending while in flight and applied when it
// completes.
func (l *lane) workload(ctx context.Context, cut *atomic.Bool) error {
	if err := l.resumeRekeys(ctx); err != nil {
		if cut.Load() {
			return nil
		}
		return err
	}
	for {
		err := l.step(ctx)
		if err != nil {
			if cut.Load() {
				return nil
			}
			return err
		}
		if cut.Load() {
			return nil
		}
	}
}

func (l *lane) step(ctx context.Context) error {
	m := l.model
	if len(m.vols) == 0 || l.rng.IntN(100) >= l.opsPct {
		if v, d, ok := l.pickDisk(); ok {
			if err := l.burst(v, d); err != nil {
				return err
			}
			if len(m.vols[v].snaps) == 0 || l.rng.IntN(checkpointEvery) == 0 {
				return l.checkpoint(ctx, v)
			}
			return nil
		}
	}
	names := m.volNames()
	var v string
	if len(names) > 0 {
		v = names[l.rng.IntN(len(names))]
	}
	switch op := l.rng.IntN(11); {
	case op == 0 && len(m.vols) < maxVolumes || len(m.vols) == 0:
		return l.createVolume(ctx)
	case op == 1 && len(m.vols) > 1:
		return l.deleteVolume(ctx, v)
	case op == 2 && len(m.vols[v].snaps) < maxSnapsPerVol:
		return l.createSnapshot(ctx, v)
	case op == 3 && len(m.vols[v].snaps) > 0:
		snaps := sortedKeys(m.vols[v].snaps)
		return l.deleteSnapshot(ctx, v, snaps[l.rng.IntN(len(snaps))])
	case op == 4 && len(m.vols) < maxVolumes:
		return l.clone(ctx, v)
	case op == 5 && len(m.vols[v].disks) < maxDisksPerVol:
		return l.addDisk(ctx, v)
	case op == 6:
		return l.attach(ctx, v)
	case op == 7:
		return l.checkLive(v)
	case op == 8 || op == 9:
		return l.deepRekey(ctx)
	case op == 10:
		return l.shallowRekey(ctx)
	}
	return nil
}

// checkLive reads back one disk of v, live or of a snapshot, while the
// power is on: it must hold exactly what the model says (every write was
// acknowledged, and reads see them all), with no cut in between to blame.
// A write that reached another volume's disk or a snapshot shows here,
// before a cut can hide which step caused it.
func (l *lane) checkLive(v string) error {
	vm := l.model.vols[v]
	if vm.token == "" {
		return nil
	}
	type target struct{ snap, disk string }
	var ts []target
	for _, d := range vm.diskNames() {
		ts = append(ts, target{"", d})
	}
	for _, s := range sortedKeys(vm.snaps) {
		for _, d := range sortedKeys(vm.snaps[s]) {
			ts = append(ts, target{s, d})
		}
	}
	if len(ts) == 0 {
		return nil
	}
	t := ts[l.rng.IntN(len(ts))]
	want := vm.snaps[t.snap][t.disk]
	what := v + "/" + t.disk
	if t.snap == "" {
		want = vm.disks[t.disk].current()
	} else {
		what = v + "@" + t.snap + "/" + t.disk
	}
	got, err := l.readDisk(v, t.snap, t.disk, vm.token, vm.diskBlocks())
	if err != nil {
		return fmt.Errorf("live check of %s: %w", what, err)
	}
	for b := range got {
		if got[b] != want[b] {
			return fmt.Errorf("live check (no cut since the writes): %s block %d holds write %d (%s), want %d",
				what, b, got[b], l.model.where(got[b]), want[b])
		}
	}
	l.model.note("checked %s", what)
	l.stats.blocksChecked += len(got)
	return nil
}

// pickDisk picks a live disk of a volume the test holds a token for.
func (l *lane) pickDisk() (string, string, bool) {
	var cands [][2]string
	for _, v := range l.model.volNames() {
		vm := l.model.vols[v]
		if vm.token == "" {
			continue
		}
		for _, d := range vm.diskNames() {
			cands = append(cands, [2]string{v, d})
		}
	}
	if len(cands) == 0 {
		return "", "", false
	}
	c := cands[l.rng.IntN(len(cands))]
	return c[0], c[1], true
}

// burst writes 1 to maxWritesInBurst blocks of one disk, one in sixteen
// with FUA, then sends a FLUSH a third of the time (each FUA or FLUSH
// flushes the whole disk cache, so they are kept rare enough for the cache
// to hold unflushed data at some cuts). It checks that every FLUSH
// after plain writes reached the pool's disk as a FLUSH of its own.
func (l *lane) burst(v, d string) error {
	cl, err := l.conn(v, d)
	if err != nil {
		return err
	}
	dm := l.model.vols[v].disks[d]
	for range 1 + l.rng.IntN(maxWritesInBurst) {
		blk := l.rng.IntN(len(dm.blocks))
		l.model.nextID++
		id := l.model.nextID
		b := &dm.blocks[blk]
		b.later = append(b.later, id) // it may land from now on
		fua := l.rng.IntN(16) == 0
		l.model.sentTo[id] = fmt.Sprintf("%s/%s block %d", v, d, blk)
		l.model.note("write %d to %s/%s block %d (fua %v)", id, v, d, blk, fua)
		if err := cl.write(stamp(l.model.run, id, blk), int64(blk)*blockSize, fua); err != nil {
			return fmt.Errorf("write %d to block %d of %s/%s: %w", id, blk, v, d, err)
		}
		l.stats.writes++
		if fua {
			b.durable, b.later = id, nil
			l.stats.fua++
		} else {
			l.unflushed[v+"/"+d] = true
		}
	}
	if l.rng.IntN(3) != 0 {
		return nil
	}
	before := l.mc.disk.snapshotStats().Flushes
	if err := cl.flush(); err != nil {
		return fmt.Errorf("flush %s/%s: %w", v, d, err)
	}
	dm.flushed()
	l.model.note("flush %s/%s acknowledged", v, d)
	l.stats.flushes++
	if l.unflushed[v+"/"+d] {
		l.stats.flushesChecked++
		if l.mc.disk.snapshotStats().Flushes == before {
			l.stats.flushesNotReachingDisk++
		}
		delete(l.unflushed, v+"/"+d)
	}
	return nil
}

// begin marks op as in flight; done applies it to the model.
func (l *lane) begin(p *pendingOp) {
	l.model.pending = p
	l.stats.ops++
	l.model.note("begin %s", p.what)
}

func (l *lane) done() {
	l.model.note("done %s", l.model.pending.what)
	l.model.pending = nil
	l.stats.opsDone++
}

func (l *lane) createVolume(ctx context.Context) error {
	name := l.model.name("v")
	nv := newVol(map[string]*diskModel{})
	nv.encrypted = l.rng.IntN(2) == 0
	n := nv.diskBlocks()
	size := int64(n) * blockSize
	spec := api.VolumeSpec{Name: name, Capacity: 8 * size, Encrypt: nv.encrypted}
	for d := range 1 + l.rng.IntN(2) {
		dn := fmt.Sprintf("d%d", d)
		nv.disks[dn] = newDisk(n, nil)
		spec.Disks = append(spec.Disks, api.DiskSpec{Name: dn, Size: size})
	}
	l.begin(&pendingOp{what: "create volume " + name, newVolume: name, newVol: nv})
	if _, err := l.mc.api.CreateVolume(ctx, spec); err != nil {
		return fmt.Errorf("create volume %s: %w", name, err)
	}
	l.model.vols[name] = nv
	l.done()
	return l.attach(ctx, name)
}

// deleteVolume detaches every attachment of v, which quiver requires
// first, then deletes it.
func (l *lane) deleteVolume(ctx context.Context, v string) error {
	l.closeConns(v)
	vm := l.model.vols[v]
	for _, id := range sortedKeys(vm.atts) {
		l.begin(&pendingOp{what: "detach " + v + " " + id, vol: v, detach: id})
		if err := l.mc.api.Detach(ctx, v, id); err != nil {
			return fmt.Errorf("detach %s %s: %w", v, id, err)
		}
		delete(vm.atts, id)
		vm.token = ""
		l.done()
	}
	l.begin(&pendingOp{what: "delete volume " + v, delVolume: v})
	if _, err := l.mc.api.DeleteVolume(ctx, v, client.Recursive()); err != nil {
		if l.refused(v, err) {
			return l.attach(ctx, v)
		}
		return fmt.Errorf("delete volume %s: %w", v, err)
	}
	delete(l.model.vols, v)
	l.done()
	return nil
}

func (l *lane) createSnapshot(ctx context.Context, v string) error {
	vm := l.model.vols[v]
	name := l.model.name("s")
	vals := map[string][]uint64{}
	for d, dm := range vm.disks {
		vals[d] = dm.current()
	}
	l.begin(&pendingOp{what: "snapshot " + v + "@" + name, vol: v, newSnap: name, snapVals: vals})
	if _, err := l.mc.api.CreateSnapshot(ctx, v, name); err != nil {
		if l.refused(v, err) {
			return nil
		}
		return fmt.Errorf("snapshot %s@%s: %w", v, name, err)
	}
	vm.snaps[name] = vals
	l.done()
	return nil
}

// checkpoint takes a snapshot of v between its writes, as a backup
// schedule does: every snapshot is a change-tracking checkpoint, and each
// boot checks the delta from it (delta_test.go). With maxSnapsPerVol
// snapshots already, the oldest goes first.
func (l *lane) checkpoint(ctx context.Context, v string) error {
	vm := l.model.vols[v]
	if len(vm.snaps) >= maxSnapsPerVol {
		oldest := ""
		for s := range vm.snaps {
			if oldest == "" || objNumber(s) < objNumber(oldest) {
				oldest = s
			}
		}
		if err := l.deleteSnapshot(ctx, v, oldest); err != nil {
			return err
		}
	}
	return l.createSnapshot(ctx, v)
}

// objNumber is the number in a name made by model.name: names made later
// have higher numbers.
func objNumber(name string) int {
	n, _ := strconv.Atoi(strings.TrimLeft(name, "abcdefghijklmnopqrstuvwxyz"))
	return n
}

func (l *lane) deleteSnapshot(ctx context.Context, v, s string) error {
	vm := l.model.vols[v]
	l.begin(&pendingOp{what: "delete snapshot " + v + "@" + s, vol: v, delSnap: s})
	if err := l.mc.api.DeleteSnapshot(ctx, v, s); err != nil {
		if l.refused(v, err) {
			return nil
		}
		return fmt.Errorf("delete snapshot %s@%s: %w", v, s, err)
	}
	delete(vm.snaps, s)
	l.done()
	return nil
}

// clone clones a snapshot of v when it has one (half of the time), else v
// itself; the clone holds exactly what its source held.
func (l *lane) clone(ctx context.Context, v string) error {
	vm := l.model.vols[v]
	name := l.model.name("c")
	src := api.Source{Volume: v}
	disks := map[string]*diskModel{}
	if len(vm.snaps) > 0 && l.rng.IntN(2) == 0 {
		snaps := sortedKeys(vm.snaps)
		src.Snapshot = snaps[l.rng.IntN(len(snaps))]
		for d, vals := range vm.snaps[src.Snapshot] {
			disks[d] = newDisk(0, vals)
		}
	} else {
		for d, dm := range vm.disks {
			disks[d] = newDisk(0, dm.current())
		}
	}
	nv := newVol(disks)
	nv.encrypted = vm.encrypted // a clone shares its source's data key
	what := "clone " + v
	if src.Snapshot != "" {
		what += "@" + src.Snapshot
	}
	l.begin(&pendingOp{what: what + " to " + name, newVolume: name, newVol: nv})
	if _, err := l.mc.api.Clone(ctx, api.CloneSpec{Source: src, Names: []string{name}}); err != nil {
		if l.refused(v, err) {
			return nil
		}
		return fmt.Errorf("%s to %s: %w", what, name, err)
	}
	l.model.vols[name] = nv
	l.done()
	return nil
}

func (l *lane) addDisk(ctx context.Context, v string) error {
	vm := l.model.vols[v]
	name := l.model.name("d")
	l.begin(&pendingOp{what: "add disk " + v + "/" + name, vol: v, newDisk: name})
	if _, err := l.mc.api.AddDisk(ctx, v, api.DiskSpec{Name: name, Size: int64(vm.diskBlocks()) * blockSize}); err != nil {
		if l.refused(v, err) {
			return nil
		}
		return fmt.Errorf("add disk %s/%s: %w", v, name, err)
	}
	vm.disks[name] = newDisk(vm.diskBlocks(), nil)
	l.done()
	return nil
}

// attach creates an rw attachment of v; its token becomes the one the test
// writes and reads v with (the previous one is fenced at the first write).
func (l *lane) attach(ctx context.Context, v string) error {
	vm := l.model.vols[v]
	node := l.model.name("n")
	l.begin(&pendingOp{what: "attach " + v + " for " + node, vol: v, attach: node})
	a, err := l.mc.api.Attach(ctx, v, api.AttachmentSpec{Node: node, Mode: api.ModeReadWrite})
	if err != nil {
		return fmt.Errorf("attach %s for %s: %w", v, node, err)
	}
	if a.Token == "" {
		return fmt.Errorf("attach %s for %s: no token in the reply", v, node)
	}
	vm.atts[a.ID] = node
	l.closeConns(v)
	vm.token = a.Token
	l.done()
	return nil
}

// conn returns the open NBD connection to a disk, dialling it on first use.
func (l *lane) conn(v, d string) (*nbdClient, error) {
	key := v + "/" + d
	if cl := l.conns[key]; cl != nil {
		return cl, nil
	}
	cl, err := dialNBD(l.mc.nbdAddr, key+"/"+l.model.vols[v].token)
	if err != nil {
		return nil, err
	}
	l.conns[key] = cl
	return cl, nil
}

func (l *lane) closeConns(v string) {
	for key, cl := range l.conns {
		if v == "" || strings.HasPrefix(key, v+"/") {
			cl.close()
			delete(l.conns, key)
		}
	}
}

func sortedKeys[V any](m map[string]V) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}
