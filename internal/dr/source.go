package dr

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/quiverstorage/quiver/internal/pool"
)

// Source ships points of a volume to a target.
type Source struct {
	v   *pool.Volume
	rel string
	// Replace lets the next full point replace the target's points
	// (Start.Replace); it is cleared once a point is committed.
	Replace bool
}

// NewSource returns the source of relationship rel from v.
func NewSource(v *pool.Volume, rel string) (*Source, error) {
	if err := ValidateRelationship(rel); err != nil {
		return nil, err
	}
	return &Source{v: v, rel: rel}, nil
}

// Stats says what a cycle did.
type Stats struct {
	Point Point
	// Base is the point the delta started from; empty for a full cycle.
	Base     string
	Changed  int64 // bytes the change tracking reported (every byte of every disk when full)
	Sent     int64 // bytes written to the target
	Zeroed   int64 // bytes the target zeroed
	Duration time.Duration
	At       time.Time // when the source took the point
}

// shipPiece is the most a Write carries.
const shipPiece = 1 << 20

// Cycle takes a new point and ships it: the delta since the newest point
// of the target's that this source still holds (normally the target's
// last; after a failback, the last point both sides had), every byte
// otherwise. Once the target committed it, the source's older points go
// (the new one is the next base); a cycle that fails leaves the source's
// points as they were.
func (s *Source) Cycle(ctx context.Context, t Target) (Stats, error) {
	start := time.Now()
	held, err := t.Points(ctx)
	if err != nil {
		return Stats{}, fmt.Errorf("the target's points: %w", err)
	}
	var base *Point
	seq := uint64(1)
	for i := len(held) - 1; i >= 0; i-- {
		seq = max(seq, held[i].Seq+1)
		if _, err := s.v.Snapshot(held[i].Snapshot); err == nil && base == nil {
			base = &held[i]
		}
	}
	p := newPoint(s.rel, seq)
	snap, _, err := s.v.CreateSnapshot(ctx, p.Snapshot, nil)
	if err != nil {
		return Stats{}, err
	}
	st, err := s.ship(ctx, t, p, base, snap)
	st.At = snap.CreatedAt
	if err != nil {
		if derr := s.v.DeleteSnapshot(context.WithoutCancel(ctx), p.Snapshot); derr != nil {
			err = errors.Join(err, fmt.Errorf("remove the point not shipped: %w", derr))
		}
		return st, err
	}
	for _, old := range points(s.rel, s.v.Snapshots()) {
		if old != p {
			if derr := s.v.DeleteSnapshot(ctx, old.Snapshot); derr != nil {
				return st, fmt.Errorf("point %s shipped; removing the older point %s: %w", p.Snapshot, old.Snapshot, derr)
			}
		}
	}
	s.Replace = false
	st.Duration = time.Since(start)
	return st, nil
}

func (s *Source) ship(ctx context.Context, t Target, p Point, base *Point, snap pool.SnapshotInfo) (Stats, error) {
	st := Stats{Point: p}
	var deltas []pool.DiskDelta
	if base != nil {
		st.Base = base.Snapshot
		var err error
		if deltas, err = s.v.Changes(ctx, base.Snapshot, p.Snapshot); errors.Is(err, pool.ErrNoCheckpoint) {
			base, st.Base = nil, "" // nothing says what changed: all of it
		} else if err != nil {
			return st, err
		}
	}
	if base == nil {
		for _, d := range snap.Disks {
			deltas = append(deltas, pool.DiskDelta{Disk: d.Name, Size: d.Size, Whole: true})
		}
	}
	var disks []pool.DiskSpec
	for _, d := range snap.Disks {
		disks = append(disks, pool.DiskSpec{Name: d.Name, Size: d.Size, Shared: d.Shared})
	}
	// An encrypted volume ships its ciphertext and its data key under its
	// backup KEK (pool/backupkey.go), never its plaintext.
	key, keyUID, err := s.v.BackupKey(ctx)
	if err != nil {
		return st, err
	}
	if err := t.Begin(ctx, Start{Point: p, Base: base, Disks: disks, Replace: s.Replace, Key: key, KeyUID: keyUID}); err != nil {
		return st, err
	}
	open := s.v.OpenSnapshotDisk
	if key != nil {
		open = s.v.OpenSnapshotDiskRaw
	}
	buf := make([]byte, shipPiece)
	for _, d := range deltas {
		h, err := open(p.Snapshot, d.Disk)
		if err != nil {
			return st, err
		}
		ranges := d.Ranges
		if d.Whole {
			ranges = []pool.ChangedRange{{Offset: 0, Length: d.Size}}
		}
		for _, rg := range ranges {
			st.Changed += rg.Length
			if err := s.shipRange(ctx, t, h, d.Disk, rg, buf, &st); err != nil {
				_ = h.Close()
				return st, err
			}
		}
		_ = h.Close()
	}
	return st, t.Commit(ctx, p)
}

// shipRange sends one changed range: holes as zeroes, data in pieces.
func (s *Source) shipRange(ctx context.Context, t Target, h pool.Disk, disk string, rg pool.ChangedRange, buf []byte, st *Stats) error {
	ext, err := h.Extents(rg.Offset, rg.Length, 0)
	if err != nil {
		return err
	}
	for _, e := range ext {
		if e.Hole {
			if err := t.Zero(ctx, disk, e.Offset, e.Length); err != nil {
				return err
			}
			st.Zeroed += e.Length
			continue
		}
		for off := e.Offset; off < e.Offset+e.Length; {
			n := min(int64(len(buf)), e.Offset+e.Length-off)
			p := buf[:n]
			if err := h.ReadAt(p, off); err != nil {
				return err
			}
			if err := t.Write(ctx, disk, off, p); err != nil {
				return err
			}
			st.Sent += n
			off += n
		}
	}
	return nil
}
