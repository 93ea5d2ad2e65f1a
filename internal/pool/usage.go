package pool

import (
	"errors"
	"slices"

	"github.com/quiverstorage/quiver/internal/storage"
)

// SpaceUsage is how the pool's space divides among its volumes and
// snapshots (`quiver volume du`, as `rbd du` and `zfs list -o space`).
type SpaceUsage struct {
	// Objects are the volumes and their snapshots that matched, a volume
	// before its snapshots, by name.
	Objects []ObjectUsage
	// Shared is the bytes held by more than one object (a snapshot and
	// its volume, clones of one golden image), counted once: the sum of
	// every object's Unique and Shared is the data the pool holds.
	Shared int64
	// Exact says the filesystem gave extent maps: Unique and Shared are
	// known. Without them (tmpfs, NFS) every file's data counts as its own.
	Exact bool
}

// ObjectUsage is the space of a volume (Snapshot "") or of a snapshot.
type ObjectUsage struct {
	Volume, Snapshot string
	// Provisioned is the sum of the disks' virtual sizes, Allocated the
	// bytes their images occupy (shared extents in full), Unique the bytes
	// no other object references: what deleting it would free.
	Provisioned, Allocated, Unique int64
	Disks                          []DiskUsage
}

// DiskUsage is the space of one disk image of an object; Unique counts the
// bytes no other image references.
type DiskUsage struct {
	Name                           string
	Provisioned, Allocated, Unique int64
}

// usageFile is one image in the sweep over extents.
type usageFile struct {
	object, disk int
}

// usageEdge starts or ends an extent of a file on the device.
type usageEdge struct {
	at    uint64
	file  int
	start bool
}

// SpaceUsage computes the pool's space by object from the extent maps of
// every image (FIEMAP): an extent referenced by one image only is that
// image's; by several images of one object, the object's; by several
// objects, shared. Objects of volumes that match are returned, but every
// volume's images take part, so sharing with the others is seen. It reads
// every extent map: a cost in proportion to the pool's extents, for an
// operator's command, not for a hot path.
func (p *Pool) SpaceUsage(match func(labels map[string]string) bool) (SpaceUsage, error) {
	var out SpaceUsage
	var files []usageFile
	var edges []usageEdge
	out.Exact = true
	addObject := func(vol, snap string, disks []DiskInfo) error {
		o := ObjectUsage{Volume: vol, Snapshot: snap}
		for _, d := range disks {
			o.Provisioned += d.Size
			o.Allocated += d.Allocated
			o.Disks = append(o.Disks, DiskUsage{Name: d.Name, Provisioned: d.Size, Allocated: d.Allocated})
			if !out.Exact {
				continue
			}
			ext, err := p.fs.Extents(p.rel(d.Path))
			if errors.Is(err, storage.ErrNotSupported) {
				out.Exact = false
				continue
			}
			if err != nil {
				return err
			}
			id := len(files)
			files = append(files, usageFile{object: len(out.Objects), disk: len(o.Disks) - 1})
			for _, e := range ext {
				if e.Flags&storage.ExtentUnknown != 0 || e.Length == 0 {
					continue
				}
				edges = append(edges, usageEdge{e.Physical, id, true}, usageEdge{e.Physical + e.Length, id, false})
			}
		}
		out.Objects = append(out.Objects, o)
		return nil
	}
	all := p.List(nil)
	for _, v := range all {
		if v.Broken != "" {
			continue
		}
		if err := addObject(v.Name, "", v.Disks); err != nil {
			return SpaceUsage{}, err
		}
		vol, err := p.Volume(v.Name)
		if err != nil {
			continue // deleted since List
		}
		for _, s := range vol.Snapshots() {
			if err := addObject(v.Name, s.Name, s.Disks); err != nil {
				return SpaceUsage{}, err
			}
		}
	}
	if !out.Exact {
		for i := range out.Objects {
			o := &out.Objects[i]
			o.Unique = o.Allocated
			for j := range o.Disks {
				o.Disks[j].Unique = o.Disks[j].Allocated
			}
		}
	} else {
		out.sweep(files, edges)
	}
	keep := map[string]bool{}
	for _, v := range all {
		keep[v.Name] = match == nil || match(v.Labels)
	}
	out.Objects = slices.DeleteFunc(out.Objects, func(o ObjectUsage) bool { return !keep[o.Volume] })
	return out, nil
}

// sweep walks the device from extent edge to edge, keeping the files whose
// extents cover the stretch, and charges each stretch to its one file, its
// one object, or to Shared.
func (u *SpaceUsage) sweep(files []usageFile, edges []usageEdge) {
	slices.SortFunc(edges, func(a, b usageEdge) int {
		switch {
		case a.at < b.at:
			return -1
		case a.at > b.at:
			return 1
		}
		return 0
	})
	active := map[int]int{} // file -> extents of it covering the stretch
	var last uint64
	for _, e := range edges {
		if n := int64(e.at - last); n > 0 && len(active) > 0 {
			u.charge(files, active, n)
		}
		last = e.at
		if e.start {
			active[e.file]++
		} else if active[e.file]--; active[e.file] <= 0 {
			delete(active, e.file)
		}
	}
}

// charge gives n bytes covered by the active files to their owner.
func (u *SpaceUsage) charge(files []usageFile, active map[int]int, n int64) {
	object, one := -1, true
	for f := range active {
		switch {
		case object < 0:
			object = files[f].object
		case files[f].object != object:
			one = false
		}
	}
	if !one {
		u.Shared += n
		return
	}
	u.Objects[object].Unique += n
	if len(active) == 1 {
		for f := range active {
			u.Objects[object].Disks[files[f].disk].Unique += n
		}
	}
}
