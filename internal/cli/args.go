package cli

import (
	"fmt"
	"strings"

	"github.com/quiverstorage/quiver/internal/api"
	"github.com/quiverstorage/quiver/internal/quantity"
)

// parseLabels reads k=v words into a map; a key given twice is an error.
func parseLabels(words []string) (map[string]string, error) {
	if len(words) == 0 {
		return nil, nil
	}
	labels := make(map[string]string, len(words))
	for _, w := range words {
		k, v, ok := strings.Cut(w, "=")
		if !ok || k == "" {
			return nil, fmt.Errorf("label %q: want KEY=VALUE", w)
		}
		if _, dup := labels[k]; dup {
			return nil, fmt.Errorf("label %q: key %q is given twice", w, k)
		}
		labels[k] = v
	}
	return labels, nil
}

// parseLabelChanges reads the words of `volume label`: KEY=VALUE sets a
// label, KEY- removes one. A key named twice is an error.
func parseLabelChanges(words []string) (set map[string]string, remove []string, err error) {
	set = map[string]string{}
	seen := map[string]bool{}
	for _, w := range words {
		k, v, isSet := strings.Cut(w, "=")
		if !isSet {
			var isRemove bool
			if k, isRemove = strings.CutSuffix(w, "-"); !isRemove {
				return nil, nil, fmt.Errorf("label %q: want KEY=VALUE to set a label or KEY- to remove one", w)
			}
		}
		if k == "" {
			return nil, nil, fmt.Errorf("label %q: the key is empty", w)
		}
		if seen[k] {
			return nil, nil, fmt.Errorf("label %q: key %q is given twice", w, k)
		}
		seen[k] = true
		if isSet {
			set[k] = v
		} else {
			remove = append(remove, k)
		}
	}
	return set, remove, nil
}

// mergeLabels applies set and remove to labels and returns the result (a
// new map; labels is not changed). Changing a value needs overwrite;
// removing a label that is not there is fine, as with kubectl.
func mergeLabels(labels, set map[string]string, remove []string, overwrite bool) (map[string]string, error) {
	out := make(map[string]string, len(labels)+len(set))
	for k, v := range labels {
		out[k] = v
	}
	for k, v := range set {
		if old, ok := out[k]; ok && old != v && !overwrite {
			return nil, fmt.Errorf("label %s is already %q: pass --overwrite to change it to %q", k, old, v)
		}
		out[k] = v
	}
	for _, k := range remove {
		delete(out, k)
	}
	return out, nil
}

// parseDisk reads NAME=SIZE[,shared], e.g. root=40Gi or quorum=1Gi,shared.
func parseDisk(word string) (api.DiskSpec, error) {
	name, rest, ok := strings.Cut(word, "=")
	size, opt, _ := strings.Cut(rest, ",")
	if !ok || name == "" || size == "" {
		return api.DiskSpec{}, fmt.Errorf("disk %q: want NAME=SIZE[,shared], e.g. root=40Gi", word)
	}
	n, err := quantity.Parse(size)
	if err != nil {
		return api.DiskSpec{}, fmt.Errorf("disk %s: %w", name, err)
	}
	d := api.DiskSpec{Name: name, Size: n}
	switch opt {
	case "":
	case "shared":
		d.Shared = true
	default:
		return api.DiskSpec{}, fmt.Errorf("disk %s: unknown option %q: the only option is shared (exempt from the single-writer rule)", name, opt)
	}
	return d, nil
}

// parseDisks reads every --disk value in order.
func parseDisks(words []string) ([]api.DiskSpec, error) {
	disks := make([]api.DiskSpec, 0, len(words))
	for _, w := range words {
		d, err := parseDisk(w)
		if err != nil {
			return nil, err
		}
		disks = append(disks, d)
	}
	return disks, nil
}

// parseSource reads a clone source: vol@snap, or vol for the live volume.
func parseSource(s string) (api.Source, error) {
	vol, snap, hasSnap := strings.Cut(s, "@")
	if vol == "" || (hasSnap && snap == "") || strings.Contains(snap, "@") {
		return api.Source{}, fmt.Errorf("source %q: want VOLUME@SNAPSHOT or VOLUME", s)
	}
	return api.Source{Volume: vol, Snapshot: snap}, nil
}
