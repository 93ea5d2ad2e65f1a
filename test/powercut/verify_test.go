package powercut

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/quiverstorage/quiver/internal/api"
)

// verify checks the pool after a boot against the model: every volume,
// disk, snapshot and attachment of a completed operation is there, whole,
// with the content the model allows, and nothing else is, except what the
// operation in flight at the cut would have made (then whole) or removed.
// It then brings the model up to what it found: the pending operation
// happened or not, and each live block holds what was read, which is
// stable now. Volumes whose token the test lost (an attach or create cut
// before its reply) get a new attachment.
func (l *lane) verify(ctx context.Context) error {
	m, c := l.model, l.mc.api
	p := m.pending
	if p == nil {
		p = &pendingOp{}
	}
	vols, err := c.ListVolumes(ctx, "")
	if err != nil {
		return fmt.Errorf("list volumes: %w", err)
	}
	present := map[string]bool{}
	for _, v := range vols {
		present[v.Name] = true
		if m.vols[v.Name] == nil {
			if v.Name != p.newVolume {
				return fmt.Errorf("volume %s is in the pool, but its create never completed, or its delete completed before the cut (in flight: %q)", v.Name, p.what)
			}
			m.vols[v.Name] = p.newVol
			l.stats.pendingHappened++
		}
	}
	for _, name := range m.volNames() {
		if present[name] {
			continue
		}
		if name != p.delVolume {
			return fmt.Errorf("volume %s is lost (in flight: %q)", name, p.what)
		}
		delete(m.vols, name)
		l.stats.pendingHappened++
	}
	for _, name := range m.volNames() {
		if err := l.verifyVolume(ctx, name, p); err != nil {
			return fmt.Errorf("volume %s (in flight at the cut: %q): %w", name, p.what, err)
		}
	}
	m.pending = nil
	return nil
}

func (l *lane) verifyVolume(ctx context.Context, name string, p *pendingOp) error {
	c := l.mc.api
	vm := l.model.vols[name]
	v, err := c.GetVolume(ctx, name)
	if err != nil {
		return err
	}
	inRekey, mixed, err := l.verifyEncryption(name, v)
	if err != nil {
		return err
	}
	if inRekey {
		l.stats.volsInRekey++
	}
	if mixed {
		l.stats.volsMixedKeys++
	}
	// Disks.
	got := map[string]int64{}
	for _, d := range v.Disks {
		got[d.Name] = d.Size
	}
	if p.vol == name && p.newDisk != "" {
		if _, ok := got[p.newDisk]; ok {
			vm.disks[p.newDisk] = newDisk(vm.diskBlocks(), nil)
			l.stats.pendingHappened++
		}
	}
	size := int64(vm.diskBlocks()) * blockSize
	if err := sameDisks(got, vm.diskNames(), size); err != nil {
		return err
	}
	// Snapshots.
	snaps, err := c.ListSnapshots(ctx, name)
	if err != nil {
		return err
	}
	gotSnaps := map[string]api.Snapshot{}
	for _, s := range snaps {
		gotSnaps[s.Name] = s
	}
	if p.vol == name && p.newSnap != "" {
		if _, ok := gotSnaps[p.newSnap]; ok {
			vm.snaps[p.newSnap] = p.snapVals
			l.stats.pendingHappened++
		}
	}
	if p.vol == name && p.delSnap != "" {
		if _, ok := gotSnaps[p.delSnap]; !ok {
			delete(vm.snaps, p.delSnap)
			l.stats.pendingHappened++
		}
	}
	for s := range gotSnaps {
		if vm.snaps[s] == nil {
			return fmt.Errorf("snapshot %s is in the pool, but it was never taken, or its delete completed before the cut", s)
		}
	}
	for _, s := range sortedKeys(vm.snaps) {
		gs, ok := gotSnaps[s]
		if !ok {
			return fmt.Errorf("snapshot %s is lost", s)
		}
		sd := map[string]int64{}
		for _, d := range gs.Disks {
			sd[d.Name] = d.Size
		}
		if err := sameDisks(sd, sortedKeys(vm.snaps[s]), size); err != nil {
			return fmt.Errorf("snapshot %s: %w", s, err)
		}
	}
	// Attachments.
	atts, err := c.ListAttachments(ctx, name)
	if err != nil {
		return err
	}
	gotAtts := map[string]string{}
	for _, a := range atts {
		gotAtts[a.ID] = a.Node
	}
	for id, node := range gotAtts {
		if _, ok := vm.atts[id]; ok {
			continue
		}
		if p.vol == name && p.attach == node {
			vm.atts[id] = node // its token never reached the test
			l.stats.pendingHappened++
			continue
		}
		return fmt.Errorf("attachment %s (node %s) is in the pool, but no attach of it completed, or its detach completed before the cut", id, node)
	}
	for id, node := range vm.atts {
		if _, ok := gotAtts[id]; !ok {
			if p.vol == name && p.detach == id {
				delete(vm.atts, id)
				vm.token = "" // it may have been the test's
				l.stats.pendingHappened++
				continue
			}
			return fmt.Errorf("attachment %s (node %s) is lost", id, node)
		}
	}
	if vm.token == "" {
		l.model.pending = nil // the attach below completes before any cut
		if err := l.attach(ctx, name); err != nil {
			return err
		}
	}
	// Content.
	live := map[string][]uint64{}
	for _, d := range vm.diskNames() {
		vals, err := l.readDisk(name, "", d, vm.token, vm.diskBlocks())
		if err != nil {
			return err
		}
		live[d] = vals
		dm := vm.disks[d]
		for b, v := range vals {
			if !dm.blocks[b].allowed(v) {
				return fmt.Errorf("disk %s block %d holds write %d (%s); allowed: durable %d or later %v", d, b, v, l.model.where(v), dm.blocks[b].durable, dm.blocks[b].later)
			}
			if v != dm.blocks[b].durable {
				l.stats.laterLanded++
			}
			dm.blocks[b] = blockModel{durable: v}
		}
		l.stats.blocksChecked += len(vals)
	}
	read := map[string]map[string][]uint64{}
	for _, s := range sortedKeys(vm.snaps) {
		read[s] = map[string][]uint64{}
		for _, d := range sortedKeys(vm.snaps[s]) {
			vals, err := l.readDisk(name, s, d, vm.token, vm.diskBlocks())
			if err != nil {
				return err
			}
			read[s][d] = vals
			if want := vm.snaps[s][d]; !slices.Equal(vals, want) {
				for b := range vals {
					if vals[b] != want[b] {
						return fmt.Errorf("snapshot %s disk %s block %d holds write %d (%s), want %d (what the disk held when the snapshot was taken)", s, d, b, vals[b], l.model.where(vals[b]), want[b])
					}
				}
			}
			l.stats.blocksChecked += len(vals)
		}
	}
	return l.verifyDeltas(ctx, name, live, read)
}

func sameDisks(got map[string]int64, want []string, size int64) error {
	var names []string
	for n, s := range got {
		names = append(names, n)
		if s != size {
			return fmt.Errorf("disk %s has %d bytes, want %d", n, s, size)
		}
	}
	slices.Sort(names)
	if !slices.Equal(names, want) {
		return fmt.Errorf("disks %v, want %v", names, want)
	}
	return nil
}

// readDisk reads a disk of n blocks (of a snapshot when snap is not empty)
// in one NBD request and names the write each block holds.
func (l *lane) readDisk(vol, snap, disk, token string, n int) ([]uint64, error) {
	export := vol
	if snap != "" {
		export += "@" + snap
	}
	export += "/" + disk + "/" + token
	cl, err := dialNBD(l.mc.nbdAddr, export)
	if err != nil {
		return nil, err
	}
	defer cl.close()
	if size := int64(n) * blockSize; cl.size != size {
		return nil, fmt.Errorf("%s: export of %d bytes, want %d", redact(export), cl.size, size)
	}
	buf := make([]byte, n*blockSize)
	if err := cl.read(buf, 0); err != nil {
		return nil, fmt.Errorf("read %s: %w", redact(export), err)
	}
	vals := make([]uint64, n)
	var errs []error
	for b := range vals {
		v, err := decode(l.model.run, b, buf[b*blockSize:(b+1)*blockSize])
		if err != nil {
			errs = append(errs, fmt.Errorf("%s block %d: %w", redact(export), b, err))
		}
		vals[b] = v
	}
	return vals, errors.Join(errs...)
}
