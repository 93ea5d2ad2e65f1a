package dr

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/quiverstorage/quiver/internal/pool"
)

// RelationshipLabel marks a volume as the target of a relationship: its
// value is the relationship's name. A volume without it is never written
// by a source.
const RelationshipLabel = "dr.quiver.io/relationship"

// ErrNoTarget: no volume of this site is the target of the relationship.
var ErrNoTarget = errors.New("no DR target for this relationship on this site")

// Targets are the relationships a site is the target of: a volume each,
// labelled with RelationshipLabel.
type Targets struct {
	pool *pool.Pool
	keep int

	mu   sync.Mutex
	recv map[string]*Receiver // by relationship, made on first use
}

// NewTargets returns the targets of p's volumes, each keeping keep points.
func NewTargets(p *pool.Pool, keep int) *Targets {
	return &Targets{pool: p, keep: max(keep, 1), recv: map[string]*Receiver{}}
}

// TargetInfo is one relationship this site is the target of.
type TargetInfo struct {
	Relationship string
	Volume       string
	Points       []Point // oldest first
}

// Accept makes volume, empty, the target of relationship rel. The volume
// must not exist: a source never writes a volume made for something else.
func (ts *Targets) Accept(ctx context.Context, rel, volume string) (TargetInfo, error) {
	if err := ValidateRelationship(rel); err != nil {
		return TargetInfo{}, err
	}
	if _, err := ts.volume(rel); err == nil {
		return TargetInfo{}, fmt.Errorf("relationship %s already has a target here: %w", rel, pool.ErrExists)
	}
	if _, _, err := ts.pool.Create(ctx, pool.VolumeSpec{Name: volume, Capacity: 1 << 20,
		Labels: map[string]string{RelationshipLabel: rel}}); err != nil {
		return TargetInfo{}, err
	}
	return ts.Get(rel)
}

// List returns every relationship this site is the target of.
func (ts *Targets) List() []TargetInfo {
	var out []TargetInfo
	for _, info := range ts.pool.List(nil) {
		if rel := info.Labels[RelationshipLabel]; rel != "" {
			if t, err := ts.Get(rel); err == nil {
				out = append(out, t)
			}
		}
	}
	return out
}

// Get returns the target of rel.
func (ts *Targets) Get(rel string) (TargetInfo, error) {
	v, err := ts.volume(rel)
	if err != nil {
		return TargetInfo{}, err
	}
	return TargetInfo{Relationship: rel, Volume: v.Name(), Points: points(rel, v.Snapshots())}, nil
}

// volume finds the volume labelled as rel's target.
func (ts *Targets) volume(rel string) (*pool.Volume, error) {
	if err := ValidateRelationship(rel); err != nil {
		return nil, err
	}
	for _, info := range ts.pool.List(func(l map[string]string) bool { return l[RelationshipLabel] == rel }) {
		return ts.pool.Volume(info.Name)
	}
	return nil, fmt.Errorf("relationship %s: %w (on this site: quiver dr target accept %s VOLUME)", rel, ErrNoTarget, rel)
}

// Receiver returns the receiver of rel.
func (ts *Targets) Receiver(rel string) (*Receiver, error) {
	ts.mu.Lock()
	defer ts.mu.Unlock()
	if r := ts.recv[rel]; r != nil {
		return r, nil
	}
	v, err := ts.volume(rel)
	if err != nil {
		return nil, err
	}
	r, err := NewReceiver(v, rel, ts.keep)
	if err != nil {
		return nil, err
	}
	ts.recv[rel] = r
	return r, nil
}

// Promote ends rel's relationship here: the volume returns to its last
// point, loses its label, and is an ordinary volume a VM can use. A
// source's later cycles find no target.
func (ts *Targets) Promote(ctx context.Context, rel string) (pool.VolumeInfo, error) {
	ts.mu.Lock()
	defer ts.mu.Unlock()
	v, err := ts.volume(rel)
	if err != nil {
		return pool.VolumeInfo{}, err
	}
	if r := ts.recv[rel]; r != nil {
		r.abort()
		delete(ts.recv, rel)
	}
	ps := points(rel, v.Snapshots())
	if len(ps) == 0 {
		return pool.VolumeInfo{}, fmt.Errorf("relationship %s: the target holds no point yet: %w", rel, pool.ErrInvalid)
	}
	if _, err := v.RollbackWith(ctx, ps[len(ps)-1].Snapshot, true, nil); err != nil {
		return pool.VolumeInfo{}, err
	}
	labels := v.Info().Labels
	delete(labels, RelationshipLabel)
	if labels == nil {
		labels = map[string]string{}
	}
	return v.Update(ctx, pool.Update{Labels: labels})
}
