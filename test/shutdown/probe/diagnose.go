package main

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"unsafe"

	"golang.org/x/sys/unix"
)

// After a failure, diagnose says where the bad block sits on the device:
// every image's blocks that hold what the model does not allow (not just
// the first one found), and the physical extents (FIEMAP) of the failed
// image and of the image the stray write was sent to. Two images mapping
// one device block that only one of them wrote puts the fault in the
// filesystem's sharing (a reference count or a copy-on-write block handed
// out twice); images whose blocks are apart put it back in quiver.

// fiemap's layout, from linux/fiemap.h; x/sys/unix does not carry it.
const (
	fsIocFiemap        = 0xC020660B
	fiemapExtentLast   = 0x1
	fiemapExtentUnwrit = 0x800
	fiemapExtentShared = 0x2000
	fiemapMaxExtents   = 512
)

type fiemapHeader struct {
	start, length                        uint64
	flags, mapped, extentCount, reserved uint32
}

type fiemapExtent struct {
	logical, physical, length uint64
	_                         [2]uint64
	flags                     uint32
	_                         [3]uint32
}

type extent struct {
	logical, physical, length uint64
	flags                     uint32
}

func (e extent) String() string {
	var fl []string
	if e.flags&fiemapExtentShared != 0 {
		fl = append(fl, "shared")
	}
	if e.flags&fiemapExtentUnwrit != 0 {
		fl = append(fl, "unwritten")
	}
	return fmt.Sprintf("blocks %d-%d at device block %d %v", e.logical/blockSize, (e.logical+e.length)/blockSize-1, e.physical/blockSize, fl)
}

// fiemap lists the extents of the file at path without syncing it first.
func fiemap(path string) ([]extent, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	hs := int(unsafe.Sizeof(fiemapHeader{}))
	es := int(unsafe.Sizeof(fiemapExtent{}))
	buf := make([]byte, hs+fiemapMaxExtents*es)
	h := (*fiemapHeader)(unsafe.Pointer(&buf[0]))
	h.length = ^uint64(0)
	h.extentCount = fiemapMaxExtents
	if _, _, e := unix.Syscall(unix.SYS_IOCTL, f.Fd(), fsIocFiemap, uintptr(unsafe.Pointer(&buf[0]))); e != 0 {
		return nil, fmt.Errorf("FS_IOC_FIEMAP %s: %w", path, e)
	}
	out := make([]extent, 0, h.mapped)
	for i := range int(h.mapped) {
		fe := (*fiemapExtent)(unsafe.Pointer(&buf[hs+i*es]))
		out = append(out, extent{fe.logical, fe.physical, fe.length, fe.flags})
	}
	return out, nil
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
		ext, err := fiemap(w.imagePath(image))
		if err != nil {
			out = append(out, "  "+err.Error())
			continue
		}
		out = append(out, fmt.Sprintf("extents of %s:", image))
		for _, e := range ext {
			out = append(out, "  "+e.String())
		}
	}
	return out
}

// sharesBlocks reports whether any disk image of volume name has an extent
// shared with another file (false if the filesystem went down).
func (w *workload) sharesBlocks(name string) bool {
	for d := range w.vols[name].disks {
		ext, err := fiemap(w.imagePath(name + "/" + d))
		if err != nil {
			return false
		}
		for _, e := range ext {
			if e.flags&fiemapExtentShared != 0 {
				return true
			}
		}
	}
	return false
}
