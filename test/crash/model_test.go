package crash

import (
	"fmt"
	"maps"
	"slices"
	"sort"
	"strings"

	"github.com/quiverstorage/quiver/internal/api"
)

// disk is one disk as the model knows it: what the API reports, the size
// the image file must have, and the stamp its data must carry.
type disk struct {
	Name string
	Size int64
	// Data is the stamp written into the image while no server ran (see
	// stamp), "" for an image that reads as zeros there.
	Data string
}

// snapState is one snapshot of a volume.
type snapState struct {
	Disks []disk
	// Capacity is the volume's capacity when the snapshot was taken. The
	// API does not report it; the model keeps it to predict clones and
	// rollbacks.
	Capacity int64
}

// volState is the whole expected state of one volume.
type volState struct {
	Capacity int64
	Labels   map[string]string
	Disks    []disk
	Source   *api.Source
	Snaps    map[string]snapState
}

func (v *volState) clone() *volState {
	if v == nil {
		return nil
	}
	c := &volState{Capacity: v.Capacity, Labels: maps.Clone(v.Labels), Disks: slices.Clone(v.Disks),
		Snaps: make(map[string]snapState, len(v.Snaps))}
	if v.Source != nil {
		s := *v.Source
		c.Source = &s
	}
	for n, s := range v.Snaps {
		c.Snaps[n] = snapState{Disks: slices.Clone(s.Disks), Capacity: s.Capacity}
	}
	return c
}

func (v *volState) totalSize() int64 {
	var t int64
	for _, d := range v.Disks {
		t += d.Size
	}
	return t
}

func (v *volState) hasDisk(name string) bool {
	return slices.ContainsFunc(v.Disks, func(d disk) bool { return d.Name == name })
}

func (v *volState) String() string {
	if v == nil {
		return "absent"
	}
	var b strings.Builder
	fmt.Fprintf(&b, "cap=%d disks=%v", v.Capacity, v.Disks)
	if v.Source != nil {
		fmt.Fprintf(&b, " source=%s@%s", v.Source.Volume, v.Source.Snapshot)
	}
	fmt.Fprintf(&b, " labels=%v snaps=[", v.Labels)
	for i, n := range sortedKeys(v.Snaps) {
		if i > 0 {
			b.WriteByte(' ')
		}
		fmt.Fprintf(&b, "%s:%v", n, v.Snaps[n].Disks)
	}
	b.WriteByte(']')
	return b.String()
}

// diff describes how got differs from want in what the API and the files
// show (snapshot capacities are not shown), or returns "" when they agree.
func diff(want, got *volState) string {
	switch {
	case want == nil && got == nil:
		return ""
	case want == nil:
		return "exists, want absent"
	case got == nil:
		return "absent, want it present"
	}
	var d []string
	if want.Capacity != got.Capacity {
		d = append(d, fmt.Sprintf("capacity %d, want %d", got.Capacity, want.Capacity))
	}
	if !maps.Equal(want.Labels, got.Labels) {
		d = append(d, fmt.Sprintf("labels %v, want %v", got.Labels, want.Labels))
	}
	if !slices.Equal(want.Disks, got.Disks) {
		d = append(d, fmt.Sprintf("disks %v, want %v", got.Disks, want.Disks))
	}
	if (want.Source == nil) != (got.Source == nil) || (want.Source != nil && *want.Source != *got.Source) {
		d = append(d, fmt.Sprintf("source %v, want %v", got.Source, want.Source))
	}
	if w, g := sortedKeys(want.Snaps), sortedKeys(got.Snaps); !slices.Equal(w, g) {
		d = append(d, fmt.Sprintf("snapshots %v, want %v", g, w))
	} else {
		for _, n := range w {
			if !slices.Equal(want.Snaps[n].Disks, got.Snaps[n].Disks) {
				d = append(d, fmt.Sprintf("snapshot %s disks %v, want %v", n, got.Snaps[n].Disks, want.Snaps[n].Disks))
			}
		}
	}
	return strings.Join(d, "; ")
}

// model is the expected pool: volume name -> state.
type model map[string]*volState

func (m model) clone() model {
	c := make(model, len(m))
	for n, v := range m {
		c[n] = v.clone()
	}
	return c
}

// apply sets the state of every volume an operation touched.
func (m model) apply(alts map[string]*volState) {
	for n, v := range alts {
		if v == nil {
			delete(m, n)
		} else {
			m[n] = v.clone()
		}
	}
}

// observed turns what the API reports into a volState.
func observed(v api.Volume, snaps []api.Snapshot) *volState {
	s := &volState{Capacity: v.Capacity, Labels: v.Labels, Disks: disksOf(v.Disks), Snaps: map[string]snapState{}}
	if v.Source != nil {
		src := *v.Source
		s.Source = &src
	}
	for _, sn := range snaps {
		s.Snaps[sn.Name] = snapState{Disks: disksOf(sn.Disks)}
	}
	return s
}

func disksOf(ds []api.Disk) []disk {
	out := make([]disk, 0, len(ds))
	for _, d := range ds {
		out = append(out, disk{Name: d.Name, Size: d.Size})
	}
	return out
}

// withoutData drops the stamps, for comparisons with what the API reports.
func withoutData(ds []disk) []disk {
	out := slices.Clone(ds)
	for i := range out {
		out[i].Data = ""
	}
	return out
}

func apiDisks(ds []disk) []api.DiskSpec {
	out := make([]api.DiskSpec, 0, len(ds))
	for _, d := range ds {
		out = append(out, api.DiskSpec{Name: d.Name, Size: d.Size})
	}
	return out
}

// sameVolume reports whether a volume the API returned from an operation
// agrees with the expected state, ignoring snapshots (the API only counts
// them there).
func sameVolume(want *volState, got api.Volume) string {
	g := observed(got, nil)
	w := want.clone()
	w.Snaps = nil
	w.Disks = withoutData(w.Disks)
	g.Snaps = nil
	if d := diff(w, g); d != "" {
		return d
	}
	if got.Snapshots != len(want.Snaps) {
		return fmt.Sprintf("reports %d snapshots, want %d", got.Snapshots, len(want.Snaps))
	}
	return ""
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}
