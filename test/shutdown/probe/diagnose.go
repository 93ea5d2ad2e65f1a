package main

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/quiverstorage/quiver/internal/fscap"
)

// After a failure, diagnose says where the bad block sits on the device:
// every image's blocks that hold what the model does not allow (not just
// the first one found), and the physical extents (FIEMAP) of the failed
// image and of the image the stray write was sent to. Two images mapping
// one device block that only one of them wrote puts the fault in the
// filesystem's sharing (a reference count or a copy-on-write block handed
// out twice); images whose blocks are apart put it back in quiver.

// describe prints an extent of fscap.ExtentMap in blocks of the disk.
func describe(e fscap.Extent) string {
	var fl []string
	if e.Flags&fscap.ExtentShared != 0 {
		fl = append(fl, "shared")
	}
	return fmt.Sprintf("blocks %d-%d at device block %d %v", e.Logical/blockSize, (e.Logical+e.Length)/blockSize-1, e.Physical/blockSize, fl)
}

// extentMap lists the extents of the image file at path (fscap.ExtentMap).
func extentMap(path string) ([]fscap.Extent, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return fscap.ExtentMap(f)
}

// imagePath is the file of an image named as the model names it:
// "vol/disk" or "vol@snap/disk".
func (w *workload) imagePath(image string) string {
	vs, d, _ := strings.Cut(image, "/")
	v, s, snap := strings.Cut(vs, "@")
	if snap {
		return filepath.Join(w.dir, "volumes", v, "snapshots", s, d+".img")
	}
	return filepath.Join(w.dir, "volumes", v, "disks", d+".img")
}

// diagnose describes the failure m in lines for the report.
func (w *workload) diagnose(m *mismatch) []string {
	var out []string
	out = append(out, "every block that holds what the model does not allow:")
	n := 0
	for _, name := range w.names() {
		vm := w.vols[name]
		images := map[string]diskModel{}
		for d, dm := range vm.disks {
			images[name+"/"+d] = dm
		}
		for s, disks := range vm.snaps {
			for d, dm := range disks {
				images[name+"@"+s+"/"+d] = dm
			}
		}
		for image, dm := range images {
			// compare stops at the first bad block and takes the good ones
			// before it as durable; a copy of the model keeps going.
			dm = slices.Clone(dm)
			for {
				err := w.compare(w.imagePath(image), image, dm, m.when)
				bad, ok := err.(*mismatch)
				if !ok {
					if err != nil {
						out = append(out, "  "+err.Error())
					}
					break
				}
				n++
				out = append(out, fmt.Sprintf("  %s block %d holds write %d (sent to %s); allowed %v", bad.image, bad.block, bad.got, w.sentTo[bad.got], bad.allowed))
				dm[bad.block] = blockModel{durable: bad.got}
			}
		}
	}
	out = append(out, fmt.Sprintf("  %d in all", n))
	images := []string{m.image}
	if to, _, ok := strings.Cut(w.sentTo[m.got], " block "); ok && to != m.image {
		images = append(images, to)
	}
	for _, image := range images {
		ext, err := extentMap(w.imagePath(image))
		if err != nil {
			out = append(out, "  "+err.Error())
			continue
		}
		out = append(out, fmt.Sprintf("extents of %s:", image))
		for _, e := range ext {
			out = append(out, "  "+describe(e))
		}
	}
	return out
}

// sharesBlocks reports whether any disk image of volume name has an extent
// shared with another file, as XFS holds it in memory (fscap.Sharing);
// false if the filesystem went down.
func (w *workload) sharesBlocks(name string) bool {
	for d, dm := range w.vols[name].disks {
		f, err := os.Open(w.imagePath(name + "/" + d))
		if err != nil {
			return false
		}
		_, shared, err := fscap.Sharing(f, 0, int64(len(dm))*blockSize)
		_ = f.Close()
		if err == nil && shared {
			return true
		}
	}
	return false
}
