package crash

import (
	"context"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/quiverstorage/quiver/internal/client"
)

// outcome counts how the uncertain operations of a crash turned out.
type outcome struct {
	applied, notApplied int
}

// verify checks a freshly started, idle server against the model and the
// uncertain operations of the last crash. Each volume must be in its model
// state or, if an uncertain operation touched it, in the state that
// operation gives it: volume by volume, so a bulk clone may have made any
// subset of its names. It returns the observed pool as the next model.
func verify(ctx context.Context, c *client.Client, poolDir string, want model, uncertain []*op) (model, outcome, []string) {
	var probs []string
	fail := func(format string, args ...any) { probs = append(probs, fmt.Sprintf(format, args...)) }
	var res outcome

	got, err := observe(ctx, c, poolDir)
	if err != nil {
		return nil, res, []string{err.Error()}
	}
	maybe := map[string]*volState{} // the state each uncertain operation gives a volume
	for _, o := range uncertain {
		for n, v := range o.alts {
			if _, dup := maybe[n]; dup {
				fail("volume %s touched by two uncertain operations", n)
			}
			maybe[n] = v
		}
	}
	names := map[string]bool{}
	for _, m := range []map[string]*volState{want, got, maybe} {
		for n := range m {
			names[n] = true
		}
	}
	next := model{}
	for _, n := range sortedKeys(names) {
		g := got[n]
		matched := false
		if diff(want[n], g) == "" {
			matched = true
		}
		if alt, ok := maybe[n]; ok {
			if diff(alt, g) == "" {
				if !matched || diff(want[n], alt) != "" {
					res.applied++
				}
				matched = true
			} else if matched {
				res.notApplied++
			}
		}
		if !matched {
			msg := fmt.Sprintf("volume %s: %s\n\tgot  %v\n\twant %v", n, diff(want[n], g), g, want[n])
			if alt, ok := maybe[n]; ok {
				msg += fmt.Sprintf("\n\tor (uncertain op applied) %v: %s", alt, diff(alt, g))
			}
			fail("%s", msg)
			continue
		}
		if g != nil {
			next[n] = adopt(g, want[n], maybe[n])
		}
	}
	probs = append(probs, checkFiles(poolDir, got)...)
	return next, res, probs
}

// adopt returns the observed state with the snapshot capacities the API does
// not show, taken from the model state it matched.
func adopt(got, a, b *volState) *volState {
	v := got.clone()
	for n, s := range v.Snaps {
		for _, m := range []*volState{a, b} {
			if m != nil {
				if ms, ok := m.Snaps[n]; ok {
					s.Capacity = ms.Capacity
				}
			}
		}
		v.Snaps[n] = s
	}
	return v
}

// observe reads every volume and snapshot through the API, checks what the
// API says about itself (counts, names and paths), and reads the stamps of
// the images the API names.
func observe(ctx context.Context, c *client.Client, poolDir string) (model, error) {
	vols, err := c.ListVolumes(ctx, "")
	if err != nil {
		return nil, fmt.Errorf("list volumes: %w", err)
	}
	info, err := c.Pool(ctx)
	if err != nil {
		return nil, fmt.Errorf("get pool: %w", err)
	}
	var probs []string
	if info.Volumes != len(vols) {
		probs = append(probs, fmt.Sprintf("pool reports %d volumes, the list has %d", info.Volumes, len(vols)))
	}
	m := model{}
	for _, v := range vols {
		snaps, err := c.ListSnapshots(ctx, v.Name)
		if err != nil {
			return nil, fmt.Errorf("list snapshots of %s: %w", v.Name, err)
		}
		if v.Snapshots != len(snaps) {
			probs = append(probs, fmt.Sprintf("volume %s reports %d snapshots, the list has %d", v.Name, v.Snapshots, len(snaps)))
		}
		dir := filepath.Join(poolDir, "volumes", v.Name)
		if v.Path != filepath.Join(dir, "disks") {
			probs = append(probs, fmt.Sprintf("volume %s path %q, want %q", v.Name, v.Path, filepath.Join(dir, "disks")))
		}
		for _, d := range v.Disks {
			if d.Path != filepath.Join(dir, "disks", d.Name+".img") {
				probs = append(probs, fmt.Sprintf("volume %s disk %s path %q", v.Name, d.Name, d.Path))
			}
		}
		for _, s := range snaps {
			if s.Volume != v.Name {
				probs = append(probs, fmt.Sprintf("snapshot %s of %s names volume %q", s.Name, v.Name, s.Volume))
			}
		}
		m[v.Name] = observed(v, snaps)
	}
	if len(probs) > 0 {
		return nil, fmt.Errorf("the API contradicts itself:\n\t%s", strings.Join(probs, "\n\t"))
	}
	readStamps(poolDir, m)
	return m, nil
}

// checkFiles checks the pool directory against what the API reported: each
// volume directory holds exactly its manifest, its disk images at their
// sizes and its snapshots; nothing else is left anywhere (staging empty, no
// temporary files, no rollback record).
func checkFiles(poolDir string, got model) []string {
	var probs []string
	fail := func(format string, args ...any) { probs = append(probs, fmt.Sprintf(format, args...)) }

	err := filepath.WalkDir(poolDir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if strings.HasPrefix(d.Name(), ".") || d.Name() == "rollback.json" {
			fail("leftover %s", path)
		}
		return nil
	})
	if err != nil {
		fail("walk pool: %v", err)
	}
	if left := entries(filepath.Join(poolDir, "staging")); len(left) > 0 {
		fail("staging not reclaimed: %v", left)
	}
	if e, w := entries(filepath.Join(poolDir, "volumes")), sortedKeys(got); !slices.Equal(e, w) {
		fail("volumes directory holds %v, the API lists %v", e, w)
	}
	for _, name := range sortedKeys(got) {
		v := got[name]
		dir := filepath.Join(poolDir, "volumes", name)
		if e := entries(dir); !slices.Equal(e, []string{"changes", "disks", "snapshots", "volume.json"}) {
			fail("volume %s directory holds %v", name, e)
		}
		// Change tracking's maps: a live map per disk that was written, a
		// sealed epoch per checkpoint still needed; no temporary file left.
		for _, e := range entries(filepath.Join(dir, "changes")) {
			disk, rest, ok := strings.Cut(e, ".")
			if !ok || strings.HasPrefix(e, ".") || (rest != "live" && strings.Trim(rest, "0123456789") != "") || disk == "" {
				fail("volume %s changes directory holds %q", name, e)
			}
		}
		probs = append(probs, checkImages(filepath.Join(dir, "disks"), v.Disks)...)
		snapDir := filepath.Join(dir, "snapshots")
		if e, w := entries(snapDir), sortedKeys(v.Snaps); !slices.Equal(e, w) {
			fail("%s holds %v, the API lists %v", snapDir, e, w)
		}
		for _, sn := range sortedKeys(v.Snaps) {
			probs = append(probs, checkImages(filepath.Join(snapDir, sn), v.Snaps[sn].Disks, "snapshot.json")...)
		}
	}
	return probs
}

// checkImages checks that dir holds exactly one image of the right size per
// disk, plus the named extra files.
func checkImages(dir string, disks []disk, extra ...string) []string {
	var probs []string
	want := slices.Clone(extra)
	for _, d := range disks {
		want = append(want, d.Name+".img")
		st, err := os.Stat(filepath.Join(dir, d.Name+".img"))
		switch {
		case err != nil:
			probs = append(probs, fmt.Sprintf("disk image: %v", err))
		case !st.Mode().IsRegular():
			probs = append(probs, fmt.Sprintf("%s/%s.img is not a regular file", dir, d.Name))
		case st.Size() != d.Size:
			probs = append(probs, fmt.Sprintf("%s/%s.img is %d bytes, the disk %d", dir, d.Name, st.Size(), d.Size))
		}
	}
	slices.Sort(want)
	if e := entries(dir); !slices.Equal(e, want) {
		probs = append(probs, fmt.Sprintf("%s holds %v, want %v", dir, e, want))
	}
	return probs
}

// entries lists the names in dir, sorted; an unreadable directory lists as
// its error, which then fails the comparison that called entries.
func entries(dir string) []string {
	es, err := os.ReadDir(dir)
	if err != nil {
		return []string{"<" + err.Error() + ">"}
	}
	out := make([]string, 0, len(es))
	for _, e := range es {
		out = append(out, e.Name())
	}
	return out
}
