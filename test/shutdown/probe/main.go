// Command probe runs the storage layer (internal/pool) on a directory of an
// XFS filesystem with the power cut test's workload (small disks, stamped
// 4 KiB writes, some through RWF_NOWAIT, some with FUA, trims and zeroes,
// flushes, writebacks without a flush, snapshots, rollbacks, clones of
// snapshots and of live volumes, deletes, the clone race) and checks every
// image against a model of what each block may hold:
//
//   - every few steps it flushes every disk and reads every image back with
//     O_DIRECT, which reads the blocks the file maps on the device, not the
//     page cache: each block must hold exactly its newest write. A write
//     that reached a block shared with another image shows there at once;
//     through the page cache it would show only after the cache was dropped,
//     as after a power cut;
//
//   - with -crash MOUNTPOINT it crashes the filesystem over and over: after
//     a random time (a third of the time a random time into a pool
//     operation, a third of the time during a flush) it shuts XFS down
//     without flushing its log (XFS_IOC_GOINGDOWN), unmounts it, mounts it
//     again (log recovery) and opens the pool, then checks that every
//     volume and snapshot of a completed operation is there, the operation
//     in flight whole or absent, and every block holds its last durable
//     write (FUA, or flushed) or a later one written to that block.
//
//     probe -dir /mnt/xfs/pool -crash /mnt/xfs -seconds 60 -seed 1
//
// It prints its progress, and at the end one line, "probe: PASS ...",
// "probe: FAIL ..." (then the history of the failed block and the last
// events) or "probe: ERROR ..."; the exit status is 0, 1 or 2.
// test/shutdown runs it on the host and inside a guest.
//
// Imports from quiver: fscap, pool, testfs.
package main

import (
	"context"
	"encoding/binary"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/quiverstorage/quiver/internal/pool"
	"github.com/quiverstorage/quiver/internal/testfs"
)

const (
	blockSize = 4096
	maxVols   = 10
	maxSnaps  = 3
)

func main() {
	dir := flag.String("dir", "", "an empty directory on the filesystem to test (the pool is made there)")
	seconds := flag.Int("seconds", 60, "how long to run")
	seed := flag.Uint64("seed", 0, "the workload's seed (0: from the clock)")
	blocks := flag.Int("blocks", 64, "blocks of 4 KiB per disk (the power cut test's disks have 64)")
	verifyEvery := flag.Int("verify-every", 8, "workload steps between checks of every image")
	mnt := flag.String("crash", "", "the mount point of dir's XFS: shut it down as a crash would, mount it again and check, over and over (needs root)")
	window := flag.Duration("window", 2*time.Second, "with -crash, the longest run of the workload before a crash")
	opWindow := flag.Duration("op-window", 20*time.Millisecond, "with -crash, a third of the crashes come at most this long into a pool operation, a third during a flush (if the window has not ended first)")
	flag.Parse()
	if *dir == "" {
		fmt.Println("probe: -dir is required")
		os.Exit(2)
	}
	if *seed == 0 {
		*seed = uint64(time.Now().UnixNano())
	}
	w := &workload{rng: rand.New(rand.NewPCG(*seed, 0x51)), seed: *seed, blocks: *blocks,
		vols: map[string]*volModel{}, sentTo: map[uint64]string{}}
	if *mnt != "" {
		_, fstype, err := testfs.MountSource(*mnt)
		if err == nil && fstype != "xfs" {
			err = fmt.Errorf("%s is %s, not XFS: -crash needs XFS_IOC_GOINGDOWN", *mnt, fstype)
		}
		if err != nil {
			fmt.Printf("probe: %v\n", err)
			os.Exit(2)
		}
		w.mnt, w.opWindow = *mnt, *opWindow
	}
	err := w.run(*dir, time.Duration(*seconds)*time.Second, *window, *verifyEvery)
	var mm *mismatch
	switch {
	case errors.As(err, &mm):
		fmt.Printf("probe: FAIL seed=%d after %s: %v\n", *seed, w.summary(), err)
		for _, l := range w.history(mm) {
			fmt.Println("probe:   " + l)
		}
		for _, l := range w.diagnose(mm) {
			fmt.Println("probe: " + l)
		}
		os.Exit(1)
	case err != nil:
		fmt.Printf("probe: ERROR seed=%d after %s: %v\n", *seed, w.summary(), err)
		os.Exit(2)
	}
	fmt.Printf("probe: PASS seed=%d %s\n", *seed, w.summary())
}

// diskModel holds, per block, the id of the write it holds (0: zeros):
// durable is the last one a FUA write or a FLUSH made durable, later the
// ones written since. With no crash since, a block holds its newest write;
// after one, durable or any of later.
type diskModel []blockModel

type blockModel struct {
	durable uint64
	later   []uint64
}

func (b blockModel) newest() uint64 {
	if len(b.later) > 0 {
		return b.later[len(b.later)-1]
	}
	return b.durable
}

// flushed makes every write to the disk durable.
func (dm diskModel) flushed() {
	for i := range dm {
		dm[i] = blockModel{durable: dm[i].newest()}
	}
}

// captured is what a snapshot or clone of the disk holds: its newest
// writes, all durable.
func (dm diskModel) captured() diskModel {
	out := make(diskModel, len(dm))
	for i := range dm {
		out[i] = blockModel{durable: dm[i].newest()}
	}
	return out
}

type volModel struct {
	disks map[string]diskModel
	snaps map[string]map[string]diskModel
	vol   *pool.Volume
	open  map[string]pool.Disk
}

type workload struct {
	rng      *rand.Rand
	seed     uint64
	blocks   int
	p        *pool.Pool
	dir      string
	vols     map[string]*volModel
	nextID   uint64
	nextName int
	sentTo   map[uint64]string // write id -> volume/disk block
	log      []string          // the last events

	// Crash mode: the filesystem mounted at mnt is shut down (armCrash)
	// and mounted again (recoverPool) over and over.
	mnt     string
	down    atomic.Bool // the filesystem is going or gone down
	pending *pending

	crashErr     error
	crashInOp    func()        // crash a random time into the next operation
	crashInFlush func()        // crash while the next flush runs
	crashNow     func()        // this cycle's crash, now
	crashTimer   *time.Timer   // what brings this cycle's crash
	opWindow     time.Duration // how long into it, at most

	crashes, inflightSeen, zeroes, rollbacks, races                                                     int
	writes, nowait, fua, flushes, writebacks, clones, liveClones, snaps, deletes, checks, blocksChecked int
}

func (w *workload) note(format string, a ...any) {
	w.log = append(w.log, fmt.Sprintf(format, a...))
	if len(w.log) > 4000 {
		w.log = slices.Clone(w.log[2000:])
	}
}

func (w *workload) summary() string {
	return fmt.Sprintf("%d crashes (%d operations in flight at one happened), %d writes (%d nowait, %d fua), %d trims and zeroes, %d flushes, %d writebacks, %d clones (%d of live volumes, %d of them races), %d snapshots, %d rollbacks, %d deletes, %d checks of every image, %d blocks checked",
		w.crashes, w.inflightSeen, w.writes, w.nowait, w.fua, w.zeroes, w.flushes, w.writebacks, w.clones, w.liveClones, w.races, w.snaps, w.rollbacks, w.deletes, w.checks, w.blocksChecked)
}

// errDown says a step stopped because the filesystem went down.
var errDown = errors.New("the filesystem went down")

func (w *workload) run(dir string, d, window time.Duration, verifyEvery int) error {
	ctx := context.Background()
	w.dir = dir
	p, err := pool.Init(ctx, dir, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		return fmt.Errorf("make the pool: %w", err)
	}
	w.p = p
	defer func() {
		if w.p != nil {
			w.p.Close()
		}
	}()
	if !p.Caps().Reflink {
		return fmt.Errorf("the filesystem of %s has no reflink", dir)
	}
	if err := w.create(); err != nil {
		return err
	}
	deadline := time.Now().Add(d)
	last := time.Now()
	for time.Now().Before(deadline) {
		var crash func()
		if w.mnt != "" {
			crash = w.armCrash(window)
			switch w.rng.IntN(3) {
			case 0:
				w.crashInOp = crash
			case 1:
				w.crashInFlush = crash
			}
		}
		for step := 1; time.Now().Before(deadline) && !w.down.Load(); step++ {
			err := w.step()
			if err == nil && step%verifyEvery == 0 {
				err = w.check()
			}
			var mm *mismatch
			if err != nil && !errors.Is(err, errDown) && (!w.down.Load() || errors.As(err, &mm)) {
				return err // an error of its own, not the crash's
			}
			if time.Since(last) > 10*time.Second {
				last = time.Now()
				fmt.Printf("probe: %s\n", w.summary())
			}
		}
		if crash == nil {
			break
		}
		crash() // now, if the deadline came first
		w.crashInOp, w.crashInFlush = nil, nil
		w.crashes++
		if err := w.recoverPool(ctx); err != nil {
			return err
		}
	}
	return w.check()
}

func (w *workload) names() []string {
	var out []string
	for n := range w.vols {
		out = append(out, n)
	}
	sort.Strings(out)
	return out
}

func (w *workload) pick() (string, *volModel) {
	ns := w.names()
	n := ns[w.rng.IntN(len(ns))]
	return n, w.vols[n]
}

func (w *workload) newName() string {
	w.nextName++
	return fmt.Sprintf("c%d", w.nextName)
}

func (w *workload) step() error {
	if w.rng.IntN(10) < 6 {
		n, vm := w.pick()
		return w.burst(n, vm)
	}
	switch r := w.rng.IntN(13); {
	case r >= 11:
		return w.cloneRace()
	case r == 10:
		return w.rollback()
	case r < 3:
		return w.cloneLive()
	case r < 5:
		return w.snapshot()
	case r < 7:
		return w.cloneSnapshot()
	case r < 8:
		return w.deleteSnapshot()
	default:
		if len(w.vols) > maxVols/2 {
			return w.deleteVolume()
		}
		return w.create()
	}
}

func (w *workload) attach(name string, vm *volModel) error {
	v, err := w.p.Volume(name)
	if err != nil {
		return err
	}
	vm.vol, vm.open = v, map[string]pool.Disk{}
	for d := range vm.disks {
		h, err := v.OpenDisk(d)
		if err != nil {
			return fmt.Errorf("open %s/%s: %w", name, d, err)
		}
		vm.open[d] = h
	}
	return nil
}

// pending is the pool operation under way: after a crash it may have
// happened or not, and must be whole if it did.
type pending struct {
	what   string
	volume string // the volume it makes or deletes
	snap   string // the snapshot it makes or deletes, if any
	make   bool   // it makes volume (or snap); else it deletes it
	// rollback: it rolls volume back to snap, whose content is disks
	rollback bool
	model    *volModel
	disks    map[string]diskModel // the snapshot's, when it makes one
}

// op runs a pool operation: fn does it, and on success done applies it to
// the model. If fn fails because the filesystem went down, the operation
// stays pending for the check after the crash.
func (w *workload) op(p *pending, fn func() error, done func() error) error {
	w.pending = p
	if w.crashInOp != nil { // this cycle ends in the middle of an operation
		time.AfterFunc(time.Duration(w.rng.Int64N(int64(w.opWindow))), w.crashInOp)
		w.crashInOp = nil
	}
	if err := fn(); err != nil {
		if w.down.Load() {
			return errDown
		}
		return fmt.Errorf("%s: %w", p.what, err)
	}
	w.pending = nil
	w.note("%s", p.what)
	return done()
}

func (w *workload) create() error {
	if len(w.vols) >= maxVols {
		return nil
	}
	name := w.newName()
	size := int64(w.blocks) * blockSize
	spec := pool.VolumeSpec{Name: name, Capacity: 8 * size, Disks: []pool.DiskSpec{{Name: "d0", Size: size}, {Name: "d1", Size: size}}}
	vm := &volModel{disks: map[string]diskModel{"d0": make(diskModel, w.blocks), "d1": make(diskModel, w.blocks)},
		snaps: map[string]map[string]diskModel{}}
	return w.op(&pending{what: "create " + name, volume: name, make: true, model: vm}, func() error {
		_, _, err := w.p.Create(context.Background(), spec)
		return err
	}, func() error {
		w.vols[name] = vm
		return w.attach(name, vm)
	})
}

func stamp(buf []byte, id uint64) {
	for i := 0; i < len(buf); i += 8 {
		binary.LittleEndian.PutUint64(buf[i:], id)
	}
}

func (w *workload) burst(name string, vm *volModel) error {
	ds := []string{"d0", "d1"}
	d := ds[w.rng.IntN(2)]
	h, dm := vm.open[d], vm.disks[d]
	buf := make([]byte, blockSize)
	for range 1 + w.rng.IntN(8) {
		if w.rng.IntN(10) == 0 {
			if err := w.zero(name, d, h, dm); err != nil {
				return err
			}
			continue
		}
		blk := w.rng.IntN(w.blocks)
		w.nextID++
		id := w.nextID
		stamp(buf, id)
		fua := w.rng.IntN(16) == 0
		w.sentTo[id] = fmt.Sprintf("%s/%s block %d", name, d, blk)
		dm[blk].later = append(dm[blk].later, id) // it may land from now on
		how := "write"
		done := false
		if nb := h.Capabilities().Nonblocking; nb != nil && !fua && w.rng.IntN(2) == 0 {
			switch err := nb.TryWriteAt(buf, int64(blk)*blockSize); {
			case err == nil:
				done, how = true, "nowait write"
				w.nowait++
			case w.down.Load():
				return errDown
			case !errors.Is(err, pool.ErrWouldBlock):
				return fmt.Errorf("try write %d to %s/%s: %w", id, name, d, err)
			}
		}
		if !done {
			if err := h.WriteAt(buf, int64(blk)*blockSize, fua); err != nil {
				if w.down.Load() {
					return errDown
				}
				return fmt.Errorf("write %d to %s/%s: %w", id, name, d, err)
			}
		}
		w.writes++
		if fua {
			dm[blk] = blockModel{durable: id}
			w.fua++
			how += " fua"
		}
		w.note("%s %d to %s/%s block %d", how, id, name, d, blk)
	}
	if w.rng.IntN(3) == 0 {
		// As the kernel's flusher does a moment after the writes in a
		// VM's life (here it would wait 30 s, longer than a crash cycle):
		// copy-on-write remaps happen, in XFS's log in memory only.
		if err := w.writeback(name, d); err != nil {
			return err
		}
	}
	if w.rng.IntN(3) == 0 {
		return w.flush(name, d, h, dm)
	}
	return nil
}

// flush flushes a disk and makes its writes durable in the model; if this
// cycle is to end during a flush, the crash comes now.
func (w *workload) flush(name, d string, h pool.Disk, dm diskModel) error {
	if w.crashInFlush != nil {
		go w.crashInFlush()
		w.crashInFlush = nil
	}
	if err := h.Flush(); err != nil {
		if w.down.Load() {
			return errDown
		}
		return fmt.Errorf("flush %s/%s: %w", name, d, err)
	}
	dm.flushed()
	w.flushes++
	w.note("flush %s/%s", name, d)
	return nil
}

// zero trims or zeroes 1 to 3 blocks of disk d (FUA one time in four):
// they read as zeros (write 0) from then on.
func (w *workload) zero(name, d string, h pool.Disk, dm diskModel) error {
	n := 1 + w.rng.IntN(3)
	blk := w.rng.IntN(w.blocks - n + 1)
	for b := blk; b < blk+n; b++ {
		dm[b].later = append(dm[b].later, 0)
	}
	fua := w.rng.IntN(4) == 0
	off, length := int64(blk)*blockSize, int64(n)*blockSize
	how := "trim"
	var err error
	if w.rng.IntN(2) == 0 {
		err = h.Trim(off, length, fua)
	} else {
		how = "zero"
		flags := pool.ZeroFlags(0)
		if w.rng.IntN(2) == 0 {
			flags |= pool.ZeroMayTrim
		}
		if fua {
			flags |= pool.ZeroFUA
		}
		err = h.Zero(off, length, flags)
	}
	if err != nil {
		if w.down.Load() {
			return errDown
		}
		return fmt.Errorf("%s blocks %d-%d of %s/%s: %w", how, blk, blk+n-1, name, d, err)
	}
	if fua {
		for b := blk; b < blk+n; b++ {
			dm[b] = blockModel{}
		}
		how += " fua"
	}
	w.zeroes++
	w.note("%s %s/%s blocks %d-%d", how, name, d, blk, blk+n-1)
	return nil
}

// rollback rolls a volume back to one of its snapshots.
func (w *workload) rollback() error {
	n, vm, s := w.withSnapshot()
	if vm == nil {
		return w.snapshot()
	}
	disks := vm.snaps[s]
	return w.op(&pending{what: fmt.Sprintf("rollback %s to %s", n, s), volume: n, snap: s, rollback: true, disks: disks}, func() error {
		_, err := vm.vol.Rollback(context.Background(), s, nil)
		return err
	}, func() error {
		vm.disks = captureDisks(disks)
		w.rollbacks++
		return nil
	})
}

func captureDisks(m map[string]diskModel) map[string]diskModel {
	out := map[string]diskModel{}
	for d, b := range m {
		out[d] = b.captured()
	}
	return out
}

func (w *workload) cloneLive() error {
	_, _, err := w.cloneLiveOf()
	return err
}

// cloneRace is the clone leak's sequence (docs/durability.md) in one step:
// a live clone, writes to the clone written back (its copy on write
// remaps it in XFS's log in memory), then writes to the source and a flush
// of every disk of it. A first write into a block the clone's remap left
// to the source alone must not go in place before that remap is durable,
// or the clone shows the source's data after a crash.
func (w *workload) cloneRace() error {
	// In crash mode the race ends the cycle: its crash comes right after
	// the source's flush, before anything else forces the log.
	ends := w.crashTimer != nil && w.crashTimer.Stop()
	if ends {
		defer func() {
			w.crashNow()
		}()
	}
	src, name, err := w.cloneLiveOf()
	if err != nil || name == "" {
		return err
	}
	w.races++
	cm := w.vols[name]
	if err := w.burst(name, cm); err != nil {
		return err
	}
	for d := range cm.disks {
		if err := w.writeback(name, d); err != nil {
			return err
		}
	}
	// The staging file of the live capture shares the blocks too until XFS
	// frees it in the background; wait for the source to own them alone.
	for deadline := time.Now().Add(2 * time.Second); time.Now().Before(deadline) && w.sharesBlocks(src); {
		time.Sleep(20 * time.Millisecond)
	}
	sm := w.vols[src]
	if err := w.burst(src, sm); err != nil {
		return err
	}
	for d, h := range sm.open {
		if err := w.flush(src, d, h, sm.disks[d]); err != nil {
			return err
		}
	}
	if ends {
		return errDown // the deferred crash
	}
	return nil
}

// cloneLiveOf clones a volume picked at random (or deletes one when the
// pool is full: then name is empty) and returns both names.
func (w *workload) cloneLiveOf() (src, name string, err error) {
	if len(w.vols) >= maxVols {
		return "", "", w.deleteVolume()
	}
	src, sm := w.pick()
	name = w.newName()
	vm := &volModel{disks: captureDisks(sm.disks), snaps: map[string]map[string]diskModel{}}
	err = w.op(&pending{what: fmt.Sprintf("clone %s to %s", src, name), volume: name, make: true, model: vm}, func() error {
		_, err := w.p.Clone(context.Background(), pool.CloneRequest{Source: pool.Source{Volume: src}, Names: []string{name}}, nil)
		return err
	}, func() error {
		w.vols[name] = vm
		w.clones++
		w.liveClones++
		return w.attach(name, vm)
	})
	return src, name, err
}

func (w *workload) snapshot() error {
	n, vm := w.pick()
	if len(vm.snaps) >= maxSnaps {
		return w.deleteSnapshot()
	}
	w.nextName++
	s := fmt.Sprintf("s%d", w.nextName)
	disks := captureDisks(vm.disks)
	return w.op(&pending{what: fmt.Sprintf("snapshot %s@%s", n, s), volume: n, snap: s, make: true, disks: disks}, func() error {
		_, _, err := vm.vol.CreateSnapshot(context.Background(), s, nil)
		return err
	}, func() error {
		vm.snaps[s] = disks
		w.snaps++
		return nil
	})
}

func (w *workload) withSnapshot() (string, *volModel, string) {
	for _, n := range w.names() {
		vm := w.vols[n]
		if len(vm.snaps) > 0 && w.rng.IntN(2) == 0 {
			var ss []string
			for s := range vm.snaps {
				ss = append(ss, s)
			}
			sort.Strings(ss)
			return n, vm, ss[w.rng.IntN(len(ss))]
		}
	}
	return "", nil, ""
}

func (w *workload) cloneSnapshot() error {
	if len(w.vols) >= maxVols {
		return w.deleteVolume()
	}
	src, sm, s := w.withSnapshot()
	if sm == nil {
		return w.snapshot()
	}
	name := w.newName()
	vm := &volModel{disks: captureDisks(sm.snaps[s]), snaps: map[string]map[string]diskModel{}}
	return w.op(&pending{what: fmt.Sprintf("clone %s@%s to %s", src, s, name), volume: name, make: true, model: vm}, func() error {
		_, err := w.p.Clone(context.Background(), pool.CloneRequest{Source: pool.Source{Volume: src, Snapshot: s}, Names: []string{name}}, nil)
		return err
	}, func() error {
		w.vols[name] = vm
		w.clones++
		return w.attach(name, vm)
	})
}

func (w *workload) deleteSnapshot() error {
	n, vm, s := w.withSnapshot()
	if vm == nil {
		return nil
	}
	return w.op(&pending{what: fmt.Sprintf("delete snapshot %s@%s", n, s), volume: n, snap: s}, func() error {
		return vm.vol.DeleteSnapshot(context.Background(), s)
	}, func() error {
		delete(vm.snaps, s)
		w.deletes++
		return nil
	})
}

func (w *workload) deleteVolume() error {
	if len(w.vols) < 2 {
		return nil
	}
	n, vm := w.pick()
	for _, h := range vm.open {
		_ = h.Close()
	}
	vm.open = nil
	return w.op(&pending{what: "delete " + n, volume: n}, func() error {
		return w.p.Delete(context.Background(), n)
	}, func() error {
		delete(w.vols, n)
		w.deletes++
		return nil
	})
}

// writeback writes back the dirty pages of a disk's image without
// flushing it (sync_file_range): no log force, no cache flush.
func (w *workload) writeback(name, d string) error {
	f, err := os.Open(w.imagePath(name + "/" + d))
	if err != nil {
		if w.down.Load() {
			return errDown
		}
		return err
	}
	defer f.Close()
	err = unix.SyncFileRange(int(f.Fd()), 0, 0,
		unix.SYNC_FILE_RANGE_WAIT_BEFORE|unix.SYNC_FILE_RANGE_WRITE|unix.SYNC_FILE_RANGE_WAIT_AFTER)
	if err != nil {
		if w.down.Load() {
			return errDown
		}
		return fmt.Errorf("writeback %s/%s: %w", name, d, err)
	}
	w.writebacks++
	w.note("writeback %s/%s", name, d)
	return nil
}

// mismatch is a block that holds what the model says it must not.
type mismatch struct {
	image   string
	block   int
	got     uint64 // ^0: not one write's stamp
	allowed []uint64
	when    string
}

func (m *mismatch) Error() string {
	return fmt.Sprintf("%s: %s block %d holds write %d; allowed %v", m.when, m.image, m.block, m.got, m.allowed)
}

// check flushes every live disk, then reads every image (live disks and
// snapshots) with O_DIRECT and compares it with the model: with no crash
// since, each block must hold exactly its newest write.
func (w *workload) check() error {
	for _, n := range w.names() {
		for d, h := range w.vols[n].open {
			if err := h.Flush(); err != nil {
				if w.down.Load() {
					return errDown
				}
				return fmt.Errorf("flush %s/%s: %w", n, d, err)
			}
			w.vols[n].disks[d].flushed()
		}
	}
	w.checks++
	err := w.compareAll("check with no crash since the writes")
	if err != nil && w.down.Load() {
		var mm *mismatch
		if !errors.As(err, &mm) {
			return errDown
		}
	}
	return err
}

// compareAll reads every image of the model with O_DIRECT and checks each
// block against what it may hold: its durable write or a later one (just
// the durable one after a check's flush), then takes what it read as
// durable.
func (w *workload) compareAll(when string) error {
	for _, n := range w.names() {
		vm := w.vols[n]
		for d, dm := range vm.disks {
			if err := w.compare(filepath.Join(w.dir, "volumes", n, "disks", d+".img"), n+"/"+d, dm, when); err != nil {
				return err
			}
		}
		for s, disks := range vm.snaps {
			for d, dm := range disks {
				if err := w.compare(filepath.Join(w.dir, "volumes", n, "snapshots", s, d+".img"), n+"@"+s+"/"+d, dm, when); err != nil {
					return err
				}
			}
		}
	}
	return nil
}

func (w *workload) compare(path, image string, dm diskModel, when string) error {
	f, err := os.OpenFile(path, os.O_RDONLY|unix.O_DIRECT, 0)
	if err != nil {
		return fmt.Errorf("open %s: %w", image, err)
	}
	defer f.Close()
	size := len(dm) * blockSize
	buf, err := unix.Mmap(-1, 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		return err
	}
	defer unix.Munmap(buf)
	if _, err := io.ReadFull(f, buf); err != nil {
		return fmt.Errorf("read %s with O_DIRECT: %w", image, err)
	}
	for b := range dm {
		blk := buf[b*blockSize : (b+1)*blockSize]
		got := binary.LittleEndian.Uint64(blk)
		for i := 8; i < blockSize; i += 8 {
			if binary.LittleEndian.Uint64(blk[i:]) != got {
				got = ^uint64(0)
				break
			}
		}
		allowed := append([]uint64{dm[b].durable}, dm[b].later...)
		if !slices.Contains(allowed, got) {
			return &mismatch{image: image, block: b, got: got, allowed: allowed, when: when}
		}
		dm[b] = blockModel{durable: got}
		w.blocksChecked++
	}
	return nil
}

// armCrash shuts the filesystem down as a crash would (XFS_IOC_GOINGDOWN
// without flushing the log: what its log holds in memory is lost, what it
// wrote stays) after a random time in [0, window). The function it
// returns crashes now if that has not happened yet, and returns once the
// filesystem is down.
func (w *workload) armCrash(window time.Duration) func() {
	var once sync.Once
	done := make(chan struct{})
	crash := func() {
		once.Do(func() {
			defer close(done)
			w.down.Store(true)
			w.crashErr = testfs.ShutdownXFS(w.mnt)
		})
	}
	t := time.AfterFunc(time.Duration(w.rng.Int64N(int64(window))), crash)
	w.crashTimer = t
	w.crashNow = crash
	return func() {
		t.Stop()
		crash()
		<-done
	}
}

// recoverPool closes the pool on the shut-down filesystem, unmounts it,
// mounts it again (XFS replays its log) and opens the pool, as a restart
// after a crash does; then it checks the pool against the model.
func (w *workload) recoverPool(ctx context.Context) error {
	if w.crashErr != nil {
		return fmt.Errorf("crash %d: %w", w.crashes, w.crashErr)
	}
	for _, vm := range w.vols {
		for _, h := range vm.open {
			_ = h.Close()
		}
		vm.open = nil
	}
	_ = w.p.Close()
	w.p = nil
	if err := testfs.Remount(w.mnt); err != nil {
		return fmt.Errorf("after crash %d: %w", w.crashes, err)
	}
	w.down.Store(false)
	p, err := pool.Open(ctx, w.dir, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		return fmt.Errorf("open the pool after crash %d: %w", w.crashes, err)
	}
	w.p = p
	return w.reconcile()
}

// reconcile checks the pool after a crash: every volume and snapshot of a
// completed operation is there, nothing else is but what the pending
// operation made, and every image holds what it may.
func (w *workload) reconcile() error {
	when := fmt.Sprintf("after crash %d", w.crashes)
	pd := w.pending
	w.pending = nil
	w.note("%s: mounted again, the pool open", when)
	if pd != nil {
		w.note("%s: %s was in flight", when, pd.what)
	}
	inPool := map[string]bool{}
	for _, v := range w.p.List(nil) {
		inPool[v.Name] = true
	}
	for _, n := range w.names() {
		if inPool[n] {
			continue
		}
		if pd != nil && pd.volume == n && pd.snap == "" && !pd.make {
			delete(w.vols, n)
			w.note("%s: %s happened", when, pd.what)
			continue
		}
		return fmt.Errorf("%s: volume %s is lost", when, n)
	}
	for n := range inPool {
		if _, ok := w.vols[n]; ok {
			continue
		}
		if pd != nil && pd.volume == n && pd.make && pd.snap == "" {
			w.vols[n] = pd.model
			w.inflightSeen++
			w.note("%s: %s happened", when, pd.what)
			continue
		}
		return fmt.Errorf("%s: volume %s is in the pool, but no operation made it", when, n)
	}
	for _, n := range w.names() {
		vm := w.vols[n]
		v, err := w.p.Volume(n)
		if err != nil {
			return err
		}
		got := map[string]bool{}
		for _, s := range v.Snapshots() {
			got[s.Name] = true
		}
		for s := range vm.snaps {
			if got[s] {
				continue
			}
			if pd != nil && pd.volume == n && pd.snap == s && !pd.make {
				delete(vm.snaps, s)
				continue
			}
			return fmt.Errorf("%s: snapshot %s@%s is lost", when, n, s)
		}
		for s := range got {
			if _, ok := vm.snaps[s]; ok {
				continue
			}
			if pd != nil && pd.volume == n && pd.snap == s && pd.make {
				vm.snaps[s] = pd.disks
				w.inflightSeen++
				continue
			}
			return fmt.Errorf("%s: snapshot %s@%s is in the pool, but no operation made it", when, n, s)
		}
		if err := w.attach(n, vm); err != nil {
			return fmt.Errorf("%s: %w", when, err)
		}
	}
	if pd != nil && pd.rollback {
		if vm, ok := w.vols[pd.volume]; ok && w.matches(pd.volume, pd.disks) {
			vm.disks = captureDisks(pd.disks)
			w.inflightSeen++
			w.note("%s: %s happened", when, pd.what)
		}
	}
	return w.compareAll(when)
}

// matches reports whether every disk of volume n holds exactly disks (a
// rollback in flight at a crash happened), checked on copies of the model.
func (w *workload) matches(n string, disks map[string]diskModel) bool {
	for d, dm := range disks {
		if w.compare(filepath.Join(w.dir, "volumes", n, "disks", d+".img"), n+"/"+d, dm.captured(), "") != nil {
			return false
		}
	}
	return true
}

// history is the part of the log that concerns the failed block.
func (w *workload) history(m *mismatch) []string {
	out := []string{fmt.Sprintf("write %d was sent to %s", m.got, w.sentTo[m.got])}
	vol := strings.SplitN(strings.SplitN(m.image, "/", 2)[0], "@", 2)[0]
	for _, l := range w.log {
		if strings.Contains(l, vol) || strings.Contains(l, fmt.Sprintf(" %d ", m.got)) || strings.HasPrefix(l, "after crash") {
			out = append(out, l)
		}
	}
	if len(out) > 200 {
		out = out[len(out)-200:]
	}
	out = append(out, "the last events:")
	return append(out, w.log[max(0, len(w.log)-40):]...)
}
