package dr

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"

	"github.com/quiverstorage/quiver/internal/crypt"
	"github.com/quiverstorage/quiver/internal/pool"
)

// Target is the target of a relationship as the source sees it. Begin,
// then any Writes and Zeros, then Commit apply one point; a point that is
// not committed changes nothing the target shows.
type Target interface {
	// Points returns the points the target holds, oldest first.
	Points(ctx context.Context) ([]Point, error)
	// Begin starts applying a point (Start).
	Begin(ctx context.Context, s Start) error
	Write(ctx context.Context, disk string, off int64, data []byte) error
	Zero(ctx context.Context, disk string, off, length int64) error
	// Commit makes p the target's last point; durable on return.
	Commit(ctx context.Context, p Point) error
}

// Start says what a cycle applies: Point on top of Base (nil: from
// nothing, every byte of every disk will come), with Disks the point's
// disk set. The target drops its points after Base: they are not the
// source's (the target was a source itself since, and failed back). A
// full point into a target that holds points is refused unless Replace:
// those points are another source's (another VM's copy), or this source's
// before it lost them, and a full point would overwrite them.
type Start struct {
	Point   Point
	Base    *Point
	Disks   []pool.DiskSpec
	Replace bool
	// Key, for an encrypted volume, is its data key wrapped under its
	// backup KEK (pool.Volume.BackupKey), in a key manager both sites
	// reach; KeyUID names the data key. The point's bytes are then the
	// volume's ciphertext, which the target stores as it is, its volume
	// under that same wrapped key (pool.Volume.AdoptKey).
	Key    *crypt.WrappedKey
	KeyUID string
}

// Receiver applies points into a volume of the target's pool: its live
// disks take the delta, and a snapshot of the point's name is the point.
// It keeps the newest keep points (at least 1). One point applies at a
// time: a Begin ends the point being applied, whose later calls fail.
type Receiver struct {
	v    *pool.Volume
	rel  string
	keep int

	mu sync.Mutex // guards what follows

	applying *Point
	h        map[string]pool.Disk
}

var _ Target = (*Receiver)(nil)

// NewReceiver returns the receiver of relationship rel into v.
func NewReceiver(v *pool.Volume, rel string, keep int) (*Receiver, error) {
	if err := ValidateRelationship(rel); err != nil {
		return nil, err
	}
	return &Receiver{v: v, rel: rel, keep: max(keep, 1)}, nil
}

// Points returns the points the target holds, oldest first.
func (r *Receiver) Points(context.Context) ([]Point, error) { return r.held(), nil }

func (r *Receiver) held() []Point { return points(r.rel, r.v.Snapshots()) }

// Last returns the newest point the target holds (ok false: none).
func (r *Receiver) Last(context.Context) (Point, bool, error) {
	ps := r.held()
	if len(ps) == 0 {
		return Point{}, false, nil
	}
	return ps[len(ps)-1], true, nil
}

// Begin checks that the target holds base, drops the points after it,
// rolls the live disks back to it when anything changed them since (a
// cycle that did not commit, or the writes of a VM before a failback), and
// makes the disk set the point's.
func (r *Receiver) Begin(ctx context.Context, s Start) error {
	p, base, disks := s.Point, s.Base, s.Disks
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, ok := parsePoint(r.rel, p.Snapshot); !ok || p.Seq == 0 {
		return fmt.Errorf("point %q is not one of relationship %s: %w", p.Snapshot, r.rel, pool.ErrInvalid)
	}
	r.end()
	last, ok, err := r.Last(ctx)
	if err != nil {
		return err
	}
	if ok && p.Seq <= last.Seq {
		return fmt.Errorf("point %d after the target's %d: %w", p.Seq, last.Seq, ErrDiverged)
	}
	if ok && base == nil && !s.Replace {
		return fmt.Errorf("the target of relationship %s holds points this source does not (%s is the last): another volume's, "+
			"or this one's before it lost them; nothing was written. To replace them with a full copy of this volume: "+
			"quiver dr sync VOLUME --replace: %w", r.rel, last.Snapshot, ErrDiverged)
	}
	if base != nil {
		ps := r.held()
		i := slices.Index(ps, *base)
		if i < 0 {
			have := "none"
			if ok {
				have = last.Snapshot
			}
			return fmt.Errorf("delta from %s, which the target does not hold (its last point is %s): %w", base.Snapshot, have, ErrDiverged)
		}
		for _, after := range ps[i+1:] {
			if err := r.v.DeleteSnapshot(ctx, after.Snapshot); err != nil {
				return fmt.Errorf("drop point %s, after the base %s: %w", after.Snapshot, base.Snapshot, err)
			}
		}
		if err := backTo(ctx, r.v, *base); err != nil {
			return err
		}
	}
	if err := r.takeKey(s); err != nil {
		return err
	}
	if err := r.conform(ctx, disks); err != nil {
		return err
	}
	open := r.v.OpenDisk
	if s.Key != nil { // the source's ciphertext, stored as it is
		open = r.v.OpenDiskRaw
	}
	r.h = map[string]pool.Disk{}
	for _, d := range disks {
		h, err := open(d.Name)
		if err != nil {
			r.end()
			return err
		}
		r.h[d.Name] = h
	}
	r.applying = &p
	return nil
}

// takeKey makes the target's volume take the source's data key, the first
// time, and refuses a point under another key than the target's (or in the
// clear into an encrypted target, or the other way round).
func (r *Receiver) takeKey(s Start) error {
	enc := r.v.Info().Encryption != nil
	switch {
	case s.Key == nil && enc:
		return fmt.Errorf("the source of relationship %s is in the clear and its target encrypted: another volume's copy: %w", r.rel, ErrDiverged)
	case s.Key == nil:
		return nil
	}
	if err := r.v.AdoptKey(*s.Key, s.KeyUID); err != nil {
		if enc {
			return fmt.Errorf("the source of relationship %s is under another data key than its target (a deep rekey since, or another volume): "+
				"delete the target's volume at this site and ship a full point again: %w", r.rel, ErrDiverged)
		}
		return fmt.Errorf("relationship %s: the target cannot take the source's data key (DR of an encrypted volume needs a key manager "+
			"both sites reach, such as one KMIP server): %w", r.rel, err)
	}
	return nil
}

// backTo rolls the live disks of v back to point last unless nothing
// changed them since. (A rollback counts every disk changed for the change
// tracking: the next delta from last would be whole.)
func backTo(ctx context.Context, v *pool.Volume, last Point) error {
	ds, err := v.Changes(ctx, last.Snapshot, "")
	if err != nil {
		return err
	}
	snap, err := v.Snapshot(last.Snapshot)
	if err != nil {
		return err
	}
	same := len(ds) == len(snap.Disks)
	for _, d := range ds {
		same = same && !d.Whole && d.Changed == 0 && slices.ContainsFunc(snap.Disks, func(s pool.DiskInfo) bool {
			return s.Name == d.Disk && s.Size == d.Size
		})
	}
	if same {
		return nil
	}
	_, err = v.RollbackWith(ctx, last.Snapshot, true, nil)
	return err
}

// conform makes the volume's disks those of the point: removes the others,
// adds the missing ones, grows the smaller ones, and replaces a larger one
// (its delta is whole: the source can only have removed and added it).
func (r *Receiver) conform(ctx context.Context, disks []pool.DiskSpec) error {
	want := map[string]int64{}
	var capacity int64
	for _, d := range disks {
		want[d.Name] = d.Size
		capacity += d.Size
	}
	info := r.v.Info()
	for _, d := range info.Disks {
		if size, ok := want[d.Name]; !ok || size < d.Size {
			if _, err := r.v.RemoveDiskWith(ctx, d.Name, true); err != nil {
				return err
			}
		}
	}
	if capacity > r.v.Info().Capacity {
		if _, err := r.v.Update(ctx, pool.Update{Capacity: &capacity}); err != nil {
			return err
		}
	}
	have := map[string]int64{}
	for _, d := range r.v.Info().Disks {
		have[d.Name] = d.Size
	}
	for _, d := range disks {
		switch size, ok := have[d.Name]; {
		case !ok:
			if _, err := r.v.AddDisk(ctx, pool.DiskSpec{Name: d.Name, Size: d.Size, Shared: d.Shared}); err != nil {
				return err
			}
		case size < d.Size:
			if _, err := r.v.GrowDisk(ctx, d.Name, d.Size); err != nil {
				return err
			}
		}
	}
	return nil
}

func (r *Receiver) disk(disk string) (pool.Disk, error) {
	if r.applying == nil {
		return nil, fmt.Errorf("no point is being applied: %w", pool.ErrInvalid)
	}
	h := r.h[disk]
	if h == nil {
		return nil, fmt.Errorf("point %s has no disk %q: %w", r.applying.Snapshot, disk, pool.ErrDiskNotFound)
	}
	return h, nil
}

func (r *Receiver) Write(_ context.Context, disk string, off int64, data []byte) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	h, err := r.disk(disk)
	if err != nil {
		return err
	}
	return h.WriteAt(data, off, false)
}

func (r *Receiver) Zero(_ context.Context, disk string, off, length int64) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	h, err := r.disk(disk)
	if err != nil {
		return err
	}
	return h.Zero(off, length, pool.ZeroMayTrim)
}

// Commit flushes the disks and takes the point's snapshot (its commit),
// then drops the points past Keep.
func (r *Receiver) Commit(ctx context.Context, p Point) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.applying == nil || *r.applying != p {
		return fmt.Errorf("commit of point %s, which is not being applied: %w", p.Snapshot, pool.ErrInvalid)
	}
	defer r.end()
	for name, h := range r.h {
		if err := h.Flush(); err != nil {
			return fmt.Errorf("point %s: flush disk %s: %w", p.Snapshot, name, err)
		}
	}
	r.end()
	if _, _, err := r.v.CreateSnapshot(ctx, p.Snapshot, nil); err != nil {
		return err
	}
	ps := r.held()
	var errs []error
	for _, old := range ps[:max(0, len(ps)-r.keep)] {
		errs = append(errs, r.v.DeleteSnapshot(ctx, old.Snapshot))
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("point %s committed; dropping older points: %w", p.Snapshot, err)
	}
	return nil
}

// abort ends the point being applied, if any.
func (r *Receiver) abort() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.end()
}

// end (mu held) closes the disks of a point being applied.
func (r *Receiver) end() {
	for _, h := range r.h {
		_ = h.Close()
	}
	r.h, r.applying = nil, nil
}
