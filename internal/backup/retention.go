package backup

import (
	"context"
	"fmt"
	"slices"
	"time"
)

// KeepPolicy says which backups of a volume to keep; the others go. A
// backup is kept when any rule keeps it. A zero policy keeps everything.
type KeepPolicy struct {
	Last    int `json:"last,omitempty"`    // the newest N
	Daily   int `json:"daily,omitempty"`   // the newest of each of the last N days that have one
	Weekly  int `json:"weekly,omitempty"`  // ... ISO weeks
	Monthly int `json:"monthly,omitempty"` // ... months
}

// Zero reports whether the policy keeps everything.
func (k KeepPolicy) Zero() bool { return k == KeepPolicy{} }

// Validate refuses negative counts.
func (k KeepPolicy) Validate() error {
	if k.Last < 0 || k.Daily < 0 || k.Weekly < 0 || k.Monthly < 0 {
		return fmt.Errorf("keep counts must not be negative: %w", ErrInvalid)
	}
	return nil
}

// Select splits backups (of one volume) into those the policy keeps and
// those it drops.
func (k KeepPolicy) Select(list []*Manifest) (keep, drop []*Manifest) {
	if k.Zero() {
		return list, nil
	}
	newest := slices.Clone(list)
	slices.SortFunc(newest, func(a, b *Manifest) int { return b.CreatedAt.Compare(a.CreatedAt) })
	kept := map[string]bool{}
	for i, m := range newest {
		if i < k.Last {
			kept[m.ID] = true
		}
	}
	bucket := func(n int, key func(time.Time) string) {
		seen := map[string]bool{}
		for _, m := range newest {
			if len(seen) >= n {
				return
			}
			b := key(m.CreatedAt.UTC())
			if !seen[b] {
				seen[b] = true
				kept[m.ID] = true
			}
		}
	}
	bucket(k.Daily, func(t time.Time) string { return t.Format("2006-01-02") })
	bucket(k.Weekly, func(t time.Time) string { y, w := t.ISOWeek(); return fmt.Sprintf("%d-%02d", y, w) })
	bucket(k.Monthly, func(t time.Time) string { return t.Format("2006-01") })
	for _, m := range list {
		if kept[m.ID] {
			keep = append(keep, m)
		} else {
			drop = append(drop, m)
		}
	}
	return keep, drop
}

// Prune deletes the backups of volume that the policy drops and returns
// them. Their chunks go with the next Collect.
func (r *Repository) Prune(ctx context.Context, volume string, k KeepPolicy) ([]*Manifest, error) {
	if err := k.Validate(); err != nil {
		return nil, err
	}
	list, _, err := r.List(ctx, volume)
	if err != nil {
		return nil, err
	}
	_, drop := k.Select(list)
	for i, m := range drop {
		if err := r.Delete(ctx, m.ID); err != nil {
			return drop[:i], err
		}
	}
	return drop, nil
}
