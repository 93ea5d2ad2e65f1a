package pool

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/quiverstorage/quiver/internal/crypt"
	"github.com/quiverstorage/quiver/internal/durable"
	"github.com/quiverstorage/quiver/internal/qos"
	"github.com/quiverstorage/quiver/internal/storage"
)

// Volume holds every disk of one VM. Its methods are safe for concurrent use.
//
// Locks, always taken in this order:
//   - ops serializes control operations. Changes take it exclusively and a
//     clone reading from the volume takes it shared; both only try, so a
//     conflicting operation is refused with ErrBusy instead of queueing.
//   - capturing serializes captures (snapshots, and clones of the live
//     volume, which hold ops only shared), so one at a time tracks writes.
//   - gate is the I/O gate. Disk I/O holds it shared; a snapshot, rollback or
//     disk change holds it exclusively, which waits for in-flight I/O and
//     holds new I/O until it is released.
//   - mu guards the in-memory manifest and snapshot list for readers.
//
// A dirty set's own mutex (dirty.go) is taken under gate held shared.
type Volume struct {
	pool      *Pool
	name      string // immutable
	dir       string
	ops       sync.RWMutex
	capturing sync.Mutex
	gate      sync.RWMutex

	// dirty is set, with gate held exclusively, while a capture tracks
	// writes; disk I/O reads it under gate held shared.
	dirty atomic.Pointer[dirtyTracker]

	// chg is the volume's change tracking (changes.go), loaded on first
	// use under chgOnce.
	chgOnce sync.Mutex
	chg     *changeLog

	// fillSrc is the source a filling volume reads units from (fill.go),
	// nil until Fill connects it; fillDurable counts the bytes durable as
	// filled, for reports.
	fillSrc     atomic.Pointer[fillSourceBox]
	fillDurable atomic.Int64

	// files holds an open file per disk once any disk of the volume has been
	// opened for I/O. It changes only under gate held exclusively.
	files map[string]*diskFile

	// amu guards att, the attachments, and changes to rules. Taken after
	// gate.
	amu sync.Mutex
	att attachTable
	// rules is the single-writer rule's state (writer.go), an immutable
	// value replaced under amu, and under gate held exclusively as well
	// when the writer or a fenced flag changes; the write check reads it
	// under the gate held shared.
	rules atomic.Pointer[writerRules]

	mu      sync.Mutex
	m       volumeManifest
	snaps   map[string]*snapshotManifest
	deleted bool
	// failed, once set, refuses every change and every new handle: the
	// volume's metadata on disk is in an unknown state (metaError).
	failed error

	// keyMu guards cipher, the volume's data key in memory once unwrapped
	// (encrypt.go); nil until then, and for a volume not encrypted.
	keyMu  sync.Mutex
	cipher *crypt.Cipher
	// next is the new data key of a deep rekey in progress (rekey.go),
	// under keyMu; rekeyRun is held by the rekey job that runs.
	next     *crypt.Cipher
	rekeyRun sync.Mutex

	// broken, immutable, is why the volume was quarantined at start-up;
	// every operation on it fails with ErrBroken.
	broken error
}

// diskFile is one disk of a live volume, open for I/O: the identity that
// handles hold (a disk removed and added again under its name is another
// diskFile). Its fields change only with the gate held exclusively, except
// refs, smu and what they guard.
type diskFile struct {
	v      *Volume
	name   string
	f      storage.File
	size   int64
	shared bool    // exempt from the single-writer rule
	ch     *chunks // chunk ownership (chunks.go); nil when off
	// us, set with ch on XFS, makes the first writes into unowned chunks
	// safe from blocks another file's copy on write just left to this
	// image (unshare.go).
	us *unsharer
	// cloneRewrite (with us): the image's copy-on-write extent size is one
	// block, so XFS reserves nothing around a copy on write, and a chunk
	// is rewritten by a clone from a scratch file, into one extent
	// (tidy.go). Images whose extent size hint keeps a larger one are
	// rewritten through the copy on write instead.
	cloneRewrite bool
	// pin, on XFS, is the image of disk name in snapshot pinned, open
	// read-only so that its blocks stay its own while open, whatever
	// happens to the snapshot: the blocks the image shares with it take a
	// first write by copy on write (unshare.go). Nil when none. Both change
	// only with the gate held exclusively.
	pin    storage.File
	pinned string
	// pinAll marks the chunks every block of which the image shared with
	// the pin when it was pinned (unshare.go): a write anywhere in one of
	// them is safe without looking at its blocks. Replaced with pin.
	pinAll []uint64
	nw     noWait // what RWF_NOWAIT does on this file (nowait.go)
	// chg records the disk's changes ahead of every write (changes.go).
	chg *diskChanges
	// enc is set for a disk of an encrypted volume (encrypt.go): every
	// read decrypts, every write encrypts.
	enc *encDisk
	// fill, while the volume fills (fill.go), fills units before I/O
	// touches them; nil once the volume is whole.
	fill *diskFill
	// gone, once set, fails every request of every handle of the disk:
	// ErrDiskRemoved, or ErrClosed when the pool closed.
	gone error
	// refs counts the open handles.
	refs atomic.Int32
	// smu guards the file's sync state (sync): syncErr, the first failed
	// sync; syncing, whether one runs; syncStarted and syncDone, the number
	// of the last sync started and of the last that succeeded. syncEnd
	// (on smu) is broadcast when a sync ends.
	smu                   sync.Mutex
	syncEnd               *sync.Cond
	syncErr               error
	syncing               bool
	syncStarted, syncDone uint64
}

func newVolume(p *Pool, m volumeManifest, snaps map[string]*snapshotManifest) *Volume {
	if snaps == nil {
		snaps = map[string]*snapshotManifest{}
	}
	v := &Volume{pool: p, name: m.Name, dir: p.volumeDir(m.Name), m: m, snaps: snaps,
		att: attachTable{byID: map[string]*Attachment{}}}
	r := newWriterRules()
	v.rules.Store(&r)
	return v
}

// newBrokenVolume is the stand-in for a volume quarantined at start-up: it
// lists with its reason and refuses every operation.
func newBrokenVolume(p *Pool, name string, why error) *Volume {
	v := newVolume(p, volumeManifest{Name: name}, nil)
	v.broken = why
	return v
}

func (v *Volume) disksDir() string            { return filepath.Join(v.dir, "disks") }
func (v *Volume) snapshotsDir() string        { return filepath.Join(v.dir, "snapshots") }
func (v *Volume) diskPath(d string) string    { return filepath.Join(v.disksDir(), d+".img") }
func (v *Volume) snapshotDir(s string) string { return filepath.Join(v.snapshotsDir(), s) }

// Name returns the volume name.
func (v *Volume) Name() string { return v.name }

func (v *Volume) manifest() volumeManifest {
	v.mu.Lock()
	defer v.mu.Unlock()
	return v.m.clone()
}

// lockOps takes the control lock exclusively, or refuses with ErrBusy.
func (v *Volume) lockOps(op string) (func(), error) {
	if err := v.pool.checkWritable(op + " " + v.name); err != nil {
		return nil, err
	}
	if !v.ops.TryLock() {
		return nil, fmt.Errorf("%s: volume %q is busy with another operation, retry later: %w", op, v.name, ErrBusy)
	}
	if err := v.checkAlive(); err != nil {
		v.ops.Unlock()
		return nil, err
	}
	if err := v.checkNotFilling(op); err != nil {
		v.ops.Unlock()
		return nil, err
	}
	if err := v.checkNotRekeying(op); err != nil {
		v.ops.Unlock()
		return nil, err
	}
	return v.ops.Unlock, nil
}

// rlockOps takes the control lock shared (the volume is a clone source).
func (v *Volume) rlockOps(op string) (func(), error) {
	if !v.ops.TryRLock() {
		return nil, fmt.Errorf("%s: volume %q is busy with another operation, retry later: %w", op, v.name, ErrBusy)
	}
	if err := v.checkAlive(); err != nil {
		v.ops.RUnlock()
		return nil, err
	}
	if err := v.checkNotFilling(op); err != nil {
		v.ops.RUnlock()
		return nil, err
	}
	if err := v.checkNotRekeying(op); err != nil {
		v.ops.RUnlock()
		return nil, err
	}
	return v.ops.RUnlock, nil
}

func (v *Volume) checkAlive() error {
	if v.broken != nil {
		return fmt.Errorf("volume %q is quarantined (%v): %w", v.name, v.broken, ErrBroken)
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.deleted {
		return fmt.Errorf("volume %q: %w", v.name, ErrVolumeNotFound)
	}
	if v.failed != nil {
		return fmt.Errorf("volume %q: %w (since: %v)", v.name, ErrVolumeFailed, v.failed)
	}
	return nil
}

// metaError handles the failure of a metadata write of the volume. When
// the write's rename was done but not made durable (durable.ErrUncertain),
// the metadata on disk may or may not hold the change, now and after a
// crash, while memory holds the old state: the volume is marked failed, so
// that nothing builds on either, until the server restarts and reloads it
// from disk. It returns err, wrapped with ErrVolumeFailed in that case.
func (v *Volume) metaError(err error) error {
	if !errors.Is(err, durable.ErrUncertain) {
		return storage.Classify(err)
	}
	v.mu.Lock()
	if v.failed == nil {
		v.failed = err
	}
	v.mu.Unlock()
	v.pool.log.Error("metadata sync failed after a rename; the volume refuses changes until the server restarts",
		"volume", v.name, "err", err)
	return fmt.Errorf("volume %q: %w: %w", v.name, ErrVolumeFailed, err)
}

// Info returns a view of the volume with the disks' allocated bytes.
func (v *Volume) Info() VolumeInfo {
	if v.broken != nil {
		return VolumeInfo{Name: v.name, Broken: v.broken.Error()}
	}
	m := v.manifest()
	v.mu.Lock()
	nsnaps := len(v.snaps)
	v.mu.Unlock()
	info := VolumeInfo{QoS: limitsOf(m.QoS), Name: m.Name, UID: m.UID, Capacity: m.Capacity, Labels: m.Labels, Source: m.Source,
		Snapshots: nsnaps, CreatedAt: m.CreatedAt, Dir: v.disksDir(), Replicas: replicasOf(m.Replicas), Tenant: m.Tenant,
		BackupPolicy: m.BackupPolicy, DRPolicy: m.DRPolicy, DirectAccess: m.DirectAccess, Fill: v.fillInfo(m)}
	if m.Key != nil {
		info.Encryption = &EncryptionInfo{Provider: m.Key.Provider, KeyID: m.Key.KeyID, Rekey: v.rekeyInfo(m)}
	}
	for _, d := range m.Disks {
		path := v.diskPath(d.Name)
		alloc, _ := v.pool.fs.Allocated(v.pool.rel(path))
		info.Disks = append(info.Disks, DiskInfo{Name: d.Name, Size: d.Size, Allocated: alloc, Path: path, Shared: d.Shared})
	}
	info.Writer = v.Writer()
	return info
}

// commit writes m as the volume's manifest (durable on return) and makes it
// the in-memory truth.
func (v *Volume) commit(m volumeManifest) error {
	if err := v.pool.writeJSON(filepath.Join(v.dir, "volume.json"), m); err != nil {
		return v.metaError(err)
	}
	v.mu.Lock()
	v.m = m
	v.mu.Unlock()
	return nil
}

// Create makes a volume with its disks. A taken name fails with ErrExists,
// unless spec.Idempotency allows the existing volume and its spec is the
// same: then it is returned (created false). When Create returns nil the
// volume is durable; a crash before that leaves nothing visible.
func (p *Pool) Create(ctx context.Context, spec VolumeSpec) (VolumeInfo, bool, error) {
	if err := ValidateSpec(spec); err != nil {
		return VolumeInfo{}, false, err
	}
	if err := ValidateIdempotencyKey("idempotency key", spec.Idempotency.Key); err != nil {
		return VolumeInfo{}, false, err
	}
	if len(spec.Labels) == 0 {
		spec.Labels = nil
	}
	if err := p.reserve(spec.Name); err != nil {
		return VolumeInfo{}, false, err
	}
	defer p.unreserve(spec.Name)
	if v, err := p.Volume(spec.Name); err == nil {
		if err := v.checkAlive(); err != nil {
			return VolumeInfo{}, false, err
		}
		m := v.manifest()
		same := m.sameSpec(spec)
		if same && spec.Idempotency.allows(m.IdempotencyKey) {
			return v.Info(), false, nil
		}
		return VolumeInfo{}, false, spec.Idempotency.existsError(fmt.Sprintf("volume %q", spec.Name), same)
	}
	staged, err := p.newStaging("vol")
	if err != nil {
		return VolumeInfo{}, false, err
	}
	m := volumeManifest{Kind: "Volume", Version: manifestVersion, Name: spec.Name, UID: newUID(),
		Capacity: spec.Capacity, Labels: maps.Clone(spec.Labels), Disks: spec.Disks, QoS: qosOrNil(spec.QoS), CreatedAt: time.Now().UTC(),
		IdempotencyKey: spec.Idempotency.Key, Tenant: spec.Tenant}
	if spec.Fill != "" {
		m.Fill = &FillState{Source: spec.Fill, Started: m.CreatedAt}
	}
	if spec.Replicas > 1 {
		m.Replicas = spec.Replicas
	}
	switch {
	case spec.KeyFrom != nil:
		if m.Key, err = p.cloneVolumeKey(ctx, spec.KeyFrom); err != nil {
			p.discard(staged)
			return VolumeInfo{}, false, fmt.Errorf("create volume %q: %w", spec.Name, err)
		}
		m.KeyUID = spec.KeyUID
	case spec.Encrypt:
		if m.Key, err = p.newVolumeKey(ctx); err != nil {
			p.discard(staged)
			return VolumeInfo{}, false, fmt.Errorf("create volume %q: %w", spec.Name, err)
		}
		m.KeyUID = newUID()
	}
	if m.Disks == nil {
		m.Disks = []DiskSpec{}
	}
	if err := p.stageVolume(staged, m, func(disks string) error {
		// The images are made side by side: their fsyncs then overlap,
		// and the filesystem commits them in one journal write or a few.
		var g errgroup.Group
		g.SetLimit(imageCreators)
		for _, d := range m.Disks {
			g.Go(func() error { return p.createImage(filepath.Join(disks, d.Name+".img"), d.Size) })
		}
		return g.Wait()
	}); err != nil {
		p.discard(staged)
		p.dropVolumeKey(m.Key)
		return VolumeInfo{}, false, fmt.Errorf("create volume %q: %w", spec.Name, err)
	}
	v, err := p.publish(staged, m)
	if err != nil {
		p.discard(staged)
		p.dropVolumeKey(m.Key)
		return VolumeInfo{}, false, err
	}
	return v.Info(), true, nil
}

// stageVolume lays out a volume directory in staged: fill makes the disk
// images in the disks directory; then the manifest is written and everything
// synced, ready for publish.
//
// Nothing reads staged until publish renames it into volumes/, and start-up
// reclaims what a crash leaves in staging/: so volume.json is written there
// under its own name, not through a temporary file, and its three sync points
// (the images' entries, volume.json's data, the staged directory's entries)
// run side by side, where a journalling filesystem commits them together
// instead of once each. All three are done before publish.
func (p *Pool) stageVolume(staged string, m volumeManifest, fill func(disksDir string) error) error {
	disks := filepath.Join(staged, "disks")
	for _, d := range []string{disks, filepath.Join(staged, "snapshots"), filepath.Join(staged, "changes")} {
		if err := p.fs.Mkdir(p.rel(d), 0o755); err != nil {
			return err
		}
	}
	if err := fill(disks); err != nil {
		return err
	}
	f, err := durable.CreateJSON(p.fs, p.rel(filepath.Join(staged, "volume.json")), m)
	if err != nil {
		return hostile(err)
	}
	defer f.Close()
	var g errgroup.Group
	g.Go(func() error { return p.fs.SyncDir(p.rel(disks)) })
	g.Go(func() error { return f.Sync() })
	g.Go(func() error { return p.fs.SyncDir(p.rel(staged)) })
	return g.Wait()
}

// imageCreators is how many images of one new volume are made at once.
const imageCreators = 8

// createImage makes an empty sparse image of size bytes. Its size is not
// synced: an image that a crash leaves short of its manifest's size is
// extended at start-up (checkImage), and it holds no data yet.
func (p *Pool) createImage(path string, size int64) error {
	f, err := p.newImageFile(path)
	if err != nil {
		return err
	}
	defer f.Close()
	return f.Truncate(size)
}

// newImageFile creates path exclusively, with the extent size hint where the
// filesystem has one and the pool writes no chunks (it must be set while the
// file is empty). Where it writes chunks (chunks.go: XFS with reflink), the
// first write into a hole rewrites the chunk whole, which allocates it in one
// extent without a hint. The hint would cost every write after a snapshot:
// XFS allocates a copy on write at the larger of the copy-on-write hint and
// this one, so each chunk's first write after a capture would allocate 1 MiB
// instead of the default 128 KiB (issue 33, acceptance 6), and a file's hint
// cannot be changed once it has extents.
func (p *Pool) newImageFile(path string) (storage.File, error) {
	f, err := p.fs.OpenFile(p.rel(path), os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600) // owner only, as libvirt keeps images
	if err != nil {
		return nil, err
	}
	if p.caps.ExtentSizeHint && p.chunk == 0 {
		if err := f.SetExtentSizeHint(ExtentSizeHint); err != nil {
			p.log.Debug("extent size hint", "path", path, "err", err)
		}
	}

	return f, nil
}

// DeleteOptions change a volume deletion.
type DeleteOptions struct {
	// Recursive deletes the volume's snapshots with it; without it a volume
	// with snapshots is refused with ErrHasSnapshots.
	Recursive bool
	// Shred destroys the KEKs of an encrypted volume's data key before the
	// volume is deleted (crypto-shredding, shred.go): its snapshots go
	// with it, and no copy of its ciphertext can be read again. Clones
	// that share the data key must be named in ShredAlso, and are
	// shredded too; otherwise the delete is refused with ErrKeyShared.
	Shred     bool
	ShredAlso []string
}

// Delete removes the volume with its disks and snapshots. The removal is
// atomic (one rename into staging) and durable on return.
func (p *Pool) Delete(ctx context.Context, name string) error {
	return p.DeleteWith(ctx, name, DeleteOptions{Recursive: true})
}

// DeleteWith is Delete with options. The snapshot check and the removal
// happen under the volume's operation lock, so no snapshot taken meanwhile
// is lost.
func (p *Pool) DeleteWith(ctx context.Context, name string, o DeleteOptions) error {
	v, err := p.Volume(name)
	if err != nil {
		return err
	}
	if o.Shred {
		return p.shred(ctx, v, o.ShredAlso)
	}
	if len(o.ShredAlso) > 0 {
		return invalid("shred", strings.Join(o.ShredAlso, ","), "names clones to shred, with shred only")
	}
	unlock, err := v.lockOps("delete")
	if err != nil {
		return err
	}
	defer unlock()
	return p.deleteLocked(v, o)
}

// deleteLocked is DeleteWith with the volume's operation lock held.
func (p *Pool) deleteLocked(v *Volume, o DeleteOptions) error {
	name := v.name
	if n := len(v.Snapshots()); n > 0 && !o.Recursive {
		return fmt.Errorf("delete volume %q: it has %d snapshots; delete them first, or delete them with it (quiver volume delete --recursive): %w",
			name, n, ErrHasSnapshots)
	}
	trash := filepath.Join(p.stagingDir(), "del-"+newUID())
	v.gate.Lock()
	if err := v.beginDelete(); err != nil {
		v.gate.Unlock()
		return err
	}
	if err := durable.Rename(p.fs, p.rel(v.dir), p.rel(trash)); err != nil {
		v.cancelDelete()
		v.gate.Unlock()
		return fmt.Errorf("delete volume %q: %w", name, v.metaError(err))
	}
	v.closeFiles(fmt.Errorf("volume %q deleted: %w", name, ErrDiskRemoved))
	v.detachAllLocked()
	v.gate.Unlock()
	v.mu.Lock()
	v.deleted = true
	v.mu.Unlock()
	v.closeChanges()
	p.mu.Lock()
	delete(p.volumes, name)
	delete(p.limiters, name)
	told := p.deleted
	p.mu.Unlock()
	for _, fn := range told {
		fn(name)
	}
	p.discard(trash)
	return nil
}

// OnDelete registers fn, called with the volume's name each time a delete
// of a volume completes (every delete goes through DeleteWith: the API's,
// a cluster's copy deletes, a drain's): the removal is durable and the
// name is gone from the pool (Volume answers ErrVolumeNotFound) when fn
// runs. fn runs in the deleting goroutine with the volume's operation lock
// held: it must be quick and must not call back into that volume. Per-volume
// state kept outside the pool (metrics series) is dropped there.
func (p *Pool) OnDelete(fn func(volume string)) {
	p.mu.Lock()
	p.deleted = append(p.deleted, fn)
	p.mu.Unlock()
}

// Update is a change to a volume's properties; nil fields are left alone.
type Update struct {
	Capacity *int64            // can only grow
	Labels   map[string]string // replaces all labels; empty removes them
	QoS      *qos.Limits       // replaces the limits; zero removes them
}

// Update applies u atomically (one manifest write), durable on return. QoS
// limits take effect at once for requests not yet admitted.
func (v *Volume) Update(ctx context.Context, u Update) (VolumeInfo, error) {
	unlock, err := v.lockOps("update")
	if err != nil {
		return VolumeInfo{}, err
	}
	defer unlock()
	m := v.manifest()
	if err := checkUpdate(m.Capacity, u); err != nil {
		return VolumeInfo{}, err
	}
	if u.Capacity != nil {
		m.Capacity = *u.Capacity
	}
	if u.Labels != nil {
		m.Labels = maps.Clone(u.Labels)
		if len(m.Labels) == 0 {
			m.Labels = nil
		}
	}
	if u.QoS != nil {
		m.QoS = qosOrNil(*u.QoS)
	}
	if err := v.commit(m); err != nil {
		return VolumeInfo{}, err
	}
	v.pool.limiter(v.name, m.QoS).Set(limitsOf(m.QoS))
	return v.Info(), nil
}

// CheckUpdate says whether Update would refuse u as it stands (a bad
// capacity, label or limit): a cluster records an update in etcd before
// it changes the copies, and must not record one they would refuse.
func (v *Volume) CheckUpdate(u Update) error {
	return checkUpdate(v.Info().Capacity, u)
}

func checkUpdate(capacity int64, u Update) error {
	if u.Capacity != nil {
		if err := ValidateSize("capacity", *u.Capacity); err != nil {
			return err
		}
		if *u.Capacity < capacity {
			return invalid("capacity", formatSize(*u.Capacity), "can only grow (now "+formatSize(capacity)+")")
		}
	}
	if u.Labels != nil {
		if err := ValidateLabels("labels", u.Labels); err != nil {
			return err
		}
	}
	if u.QoS != nil {
		if err := u.QoS.Validate(); err != nil {
			return invalid("qos", "", err.Error())
		}
	}
	return nil
}

func totalSize(disks []DiskSpec) int64 {
	var t int64
	for _, d := range disks {
		t += d.Size
	}
	return t
}

// AddDisk adds an empty disk; a disk of that name already there fails with
// ErrExists. See AddDiskWith.
func (v *Volume) AddDisk(ctx context.Context, d DiskSpec) (VolumeInfo, error) {
	return v.AddDiskWith(ctx, d, Idempotency{})
}

// AddDiskWith adds an empty disk. A disk of that name already there fails
// with ErrExists, unless idem allows it and its size and sharing are those
// asked for: then the volume is returned as it is. The image is made first
// and the manifest written last, so a crash leaves at worst an orphan image
// that start-up reclaims. Durable on return.
func (v *Volume) AddDiskWith(ctx context.Context, d DiskSpec, idem Idempotency) (VolumeInfo, error) {
	if err := ValidateName("name", d.Name); err != nil {
		return VolumeInfo{}, err
	}
	if err := ValidateIdempotencyKey("idempotency key", idem.Key); err != nil {
		return VolumeInfo{}, err
	}
	if err := ValidateSize("size", d.Size); err != nil {
		return VolumeInfo{}, err
	}
	unlock, err := v.lockOps("add disk")
	if err != nil {
		return VolumeInfo{}, err
	}
	defer unlock()
	m := v.manifest()
	if m.Key != nil {
		if err := checkEncryptedSize("size", d.Size); err != nil {
			return VolumeInfo{}, err
		}
	}
	if i, ok := m.disk(d.Name); ok {
		same := m.Disks[i] == d
		if same && idem.allows(m.DiskKeys[d.Name]) {
			return v.Info(), nil
		}
		return VolumeInfo{}, idem.existsError(fmt.Sprintf("disk %q of volume %q", d.Name, m.Name), same)
	}
	if len(m.Disks) >= MaxDisks {
		return VolumeInfo{}, invalid("name", d.Name, fmt.Sprintf("volume already has %d disks, the maximum", MaxDisks))
	}
	if t := totalSize(m.Disks) + d.Size; t > m.Capacity {
		return VolumeInfo{}, fmt.Errorf("disks would total %s, capacity is %s; grow the volume first: %w", formatSize(t), formatSize(m.Capacity), ErrCapacity)
	}
	// A checkpoint may know a disk of this name (removed since): the new
	// disk counts as changed whole since then.
	if err := v.markAllChanged([]DiskSpec{d}); err != nil {
		return VolumeInfo{}, err
	}
	path := v.diskPath(d.Name)
	_ = v.pool.fs.Remove(v.pool.rel(path)) // an orphan from a crashed add
	if err := v.pool.createImage(path, d.Size); err != nil {
		return VolumeInfo{}, err
	}
	if err := v.pool.fs.SyncDir(v.pool.rel(v.disksDir())); err != nil {
		return VolumeInfo{}, err
	}
	m.Disks = append(m.Disks, d)
	delete(m.DiskKeys, d.Name)
	if idem.Key != "" {
		if m.DiskKeys == nil {
			m.DiskKeys = map[string]string{}
		}
		m.DiskKeys[d.Name] = idem.Key
	}
	if err := v.commit(m); err != nil {
		_ = v.pool.fs.Remove(v.pool.rel(path))
		return VolumeInfo{}, err
	}
	v.gate.Lock()
	err = v.refreshFiles(false)
	v.gate.Unlock()
	return v.Info(), err
}

// GrowDisk grows a disk to size bytes. The manifest is written first and the
// image extended after; start-up extends an image left short by a crash.
// Durable on return.
func (v *Volume) GrowDisk(ctx context.Context, disk string, size int64) (VolumeInfo, error) {
	if err := ValidateName("disk", disk); err != nil {
		return VolumeInfo{}, err
	}
	if err := ValidateSize("size", size); err != nil {
		return VolumeInfo{}, err
	}
	unlock, err := v.lockOps("grow disk")
	if err != nil {
		return VolumeInfo{}, err
	}
	defer unlock()
	m := v.manifest()
	if m.Key != nil {
		if err := checkEncryptedSize("size", size); err != nil {
			return VolumeInfo{}, err
		}
	}
	i, ok := m.disk(disk)
	if !ok {
		return VolumeInfo{}, fmt.Errorf("disk %q of volume %q: %w", disk, m.Name, ErrDiskNotFound)
	}
	old := m.Disks[i].Size
	if size == old {
		return v.Info(), nil
	}
	if size < old {
		return VolumeInfo{}, invalid("size", formatSize(size), "a disk can only grow (now "+formatSize(old)+")")
	}
	if t := totalSize(m.Disks) - old + size; t > m.Capacity {
		return VolumeInfo{}, fmt.Errorf("disks would total %s, capacity is %s; grow the volume first: %w", formatSize(t), formatSize(m.Capacity), ErrCapacity)
	}
	m.Disks[i].Size = size
	if err := v.commit(m); err != nil {
		return VolumeInfo{}, err
	}
	v.gate.Lock()
	err = v.pool.checkImage(v.pool.rel(v.diskPath(disk)), size, true)
	if df := v.files[disk]; df != nil && err == nil {
		df.size = size
		if df.ch != nil {
			df.ch.resize(size)
		}
	}
	if err == nil {
		v.resizeChanges(disk, size)
	}
	v.gate.Unlock()
	if err != nil {
		return VolumeInfo{}, err
	}
	return v.Info(), nil
}

// RemoveDisk removes a disk, refusing while writers are connected. See
// RemoveDiskWith.
func (v *Volume) RemoveDisk(ctx context.Context, disk string) (VolumeInfo, error) {
	return v.RemoveDiskWith(ctx, disk, false)
}

// RemoveDiskWith removes a disk from the volume (its snapshots keep their
// copies). While writers are connected to the volume it fails with
// ErrInUse, unless force. The manifest is written first; the orphan image is
// removed after. Durable on return.
func (v *Volume) RemoveDiskWith(ctx context.Context, disk string, force bool) (VolumeInfo, error) {
	if err := ValidateName("disk", disk); err != nil {
		return VolumeInfo{}, err
	}
	unlock, err := v.lockOps("remove disk")
	if err != nil {
		return VolumeInfo{}, err
	}
	defer unlock()
	if !force {
		if err := v.CheckWriters("removing disk " + disk); err != nil {
			return VolumeInfo{}, err
		}
	}
	m := v.manifest()
	i, ok := m.disk(disk)
	if !ok {
		return VolumeInfo{}, fmt.Errorf("disk %q of volume %q: %w", disk, m.Name, ErrDiskNotFound)
	}
	m.Disks = append(m.Disks[:i:i], m.Disks[i+1:]...)
	delete(m.DiskKeys, disk)
	if err := v.commit(m); err != nil {
		return VolumeInfo{}, err
	}
	v.gate.Lock()
	if df := v.files[disk]; df != nil {
		v.endFile(df, fmt.Errorf("disk %q of volume %q: %w", disk, v.name, ErrDiskRemoved))
	}
	v.forgetChanges(disk)
	v.gate.Unlock()
	// The manifest no longer lists the image: if its removal does not
	// last (it is not synced), start-up removes the orphan.
	_ = v.pool.fs.Remove(v.pool.rel(v.diskPath(disk)))
	return v.Info(), nil
}

// Snapshots lists the volume's snapshots by creation time.
func (v *Volume) Snapshots() []SnapshotInfo {
	v.mu.Lock()
	out := make([]SnapshotInfo, 0, len(v.snaps))
	for _, s := range v.snaps {
		out = append(out, v.snapshotInfo(s))
	}
	v.mu.Unlock()
	sort.Slice(out, func(i, j int) bool {
		if !out[i].CreatedAt.Equal(out[j].CreatedAt) {
			return out[i].CreatedAt.Before(out[j].CreatedAt)
		}
		return out[i].Name < out[j].Name
	})
	return out
}

// Snapshot returns one snapshot.
func (v *Volume) Snapshot(name string) (SnapshotInfo, error) {
	if err := ValidateName("snapshot", name); err != nil {
		return SnapshotInfo{}, err
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	s, ok := v.snaps[name]
	if !ok {
		return SnapshotInfo{}, fmt.Errorf("snapshot %q of volume %q: %w", name, v.name, ErrSnapshotNotFound)
	}
	return v.snapshotInfo(s), nil
}

func (v *Volume) snapshotInfo(s *snapshotManifest) SnapshotInfo {
	info := SnapshotInfo{Name: s.Name, UID: s.UID, Volume: s.Volume, Capacity: s.Capacity, Method: s.Method,
		GateHeld: s.GateHeld, CreatedAt: s.CreatedAt, Checkpoint: s.Checkpoint}
	for _, d := range s.Disks {
		path := filepath.Join(v.snapshotDir(s.Name), d.Name+".img")
		alloc, _ := v.pool.fs.Allocated(v.pool.rel(path))
		info.Disks = append(info.Disks, DiskInfo{Name: d.Name, Size: d.Size, Allocated: alloc, Path: path})
	}
	return info
}
