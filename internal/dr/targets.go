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
// point (unless nothing changed it since: then its change tracking from
// that point stays exact, for a failback's delta), loses its label, and
// is an ordinary volume a VM can use. A
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
	if err := backTo(ctx, v, ps[len(ps)-1]); err != nil {
		return pool.VolumeInfo{}, err
	}
	labels := v.Info().Labels
	delete(labels, RelationshipLabel)
	if labels == nil {
		labels = map[string]string{}
	}
	return v.Update(ctx, pool.Update{Labels: labels})
}

// Demote makes volume, a source of relationship rel until now, the target
// of rel on this site: the failback of a site that was the source when
// the other promoted (or the first step of a planned migration). The
// volume must hold a point of rel, the last both sides had; its DR policy
// ends, and the other site's next cycle ships only what it changed since
// that point, after this side's live disks are rolled back to it (what a
// VM wrote here since that point is dropped: the promoted side is the
// VM's now). Refused while a VM may write to it: detach it first.
func (ts *Targets) Demote(ctx context.Context, rel, volume string) (TargetInfo, error) {
	ts.mu.Lock()
	defer ts.mu.Unlock()
	if err := ValidateRelationship(rel); err != nil {
		return TargetInfo{}, err
	}
	if other, err := ts.volume(rel); err == nil {
		return TargetInfo{}, fmt.Errorf("relationship %s already has a target here, volume %s: %w", rel, other.Name(), pool.ErrExists)
	}
	v, err := ts.pool.Volume(volume)
	if err != nil {
		return TargetInfo{}, err
	}
	info := v.Info()
	if l := info.Labels[RelationshipLabel]; l != "" {
		return TargetInfo{}, fmt.Errorf("volume %s is already the target of relationship %s: %w", volume, l, pool.ErrInvalid)
	}
	if len(points(rel, v.Snapshots())) == 0 {
		return TargetInfo{}, fmt.Errorf("volume %s holds no point of relationship %s, so nothing is shared with the other site: "+
			"accept a new volume instead (quiver dr target accept %s VOLUME): %w", volume, rel, rel, pool.ErrInvalid)
	}
	for _, a := range v.Attachments() {
		if a.Mode != pool.ModeReadOnly {
			return TargetInfo{}, fmt.Errorf("volume %s has a read-write attachment (%s, node %s): stop the VM and detach it first: %w",
				volume, a.ID, a.Node, pool.ErrBusy)
		}
	}
	if info.DRPolicy != nil {
		if _, err := v.SetDRPolicy(ctx, nil); err != nil {
			return TargetInfo{}, err
		}
	}
	labels := map[string]string{}
	for k, val := range info.Labels {
		labels[k] = val
	}
	labels[RelationshipLabel] = rel
	if _, err := v.Update(ctx, pool.Update{Labels: labels}); err != nil {
		return TargetInfo{}, err
	}
	delete(ts.recv, rel)
	return TargetInfo{Relationship: rel, Volume: volume, Points: points(rel, v.Snapshots())}, nil
}
