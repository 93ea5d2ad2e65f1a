package crash

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
)

// The test gives disks distinct contents itself: while no server runs (the
// server owns the files while it runs), it writes a stamp naming the volume,
// disk and generation into some live disk images, as a VM would have written
// data. Snapshots, clones and rollbacks
// must then carry the stamps along, whole: a rollback left half-done shows
// up as disks stamped from two different points in time, a torn copy as two
// different stamps in one image.

// stampLen is the size of one stamp record.
const stampLen = 512

// stampOffsets are where each stamp is written: the first sector and the
// last sector of the first MiB (every disk in the workload is at least
// 1 MiB), so a copy that stops part-way differs between the two.
var stampOffsets = []int64{0, mib - stampLen}

// writeStamp writes stamp at every stamp offset of the image at path.
func writeStamp(path, stamp string) error {
	f, err := os.OpenFile(path, os.O_WRONLY, 0)
	if err != nil {
		return err
	}
	buf := make([]byte, stampLen)
	copy(buf, stamp)
	for _, off := range stampOffsets {
		if _, err := f.WriteAt(buf, off); err != nil {
			f.Close()
			return err
		}
	}
	return f.Close()
}

// readStamp returns the stamp of the image at path: "" when it reads as
// zeros at the stamp offsets, or a description of what is wrong.
func readStamp(path string) string {
	f, err := os.Open(path)
	if err != nil {
		return fmt.Sprintf("<%v>", err)
	}
	defer f.Close()
	var stamps []string
	buf := make([]byte, stampLen)
	for _, off := range stampOffsets {
		clear(buf)
		if _, err := f.ReadAt(buf, off); err != nil && !errors.Is(err, io.EOF) {
			return fmt.Sprintf("<%v>", err)
		}
		stamps = append(stamps, string(bytes.TrimRight(buf, "\x00")))
	}
	for _, s := range stamps[1:] {
		if s != stamps[0] {
			return fmt.Sprintf("<torn: %q>", stamps)
		}
	}
	return stamps[0]
}

// readStamps fills in the Data of every disk of every volume and snapshot
// in m from the image files.
func readStamps(poolDir string, m model) {
	for name, v := range m {
		dir := filepath.Join(poolDir, "volumes", name)
		for i, d := range v.Disks {
			v.Disks[i].Data = readStamp(filepath.Join(dir, "disks", d.Name+".img"))
		}
		for sn, s := range v.Snaps {
			for i, d := range s.Disks {
				s.Disks[i].Data = readStamp(filepath.Join(dir, "snapshots", sn, d.Name+".img"))
			}
		}
	}
}

// stamp writes a new stamp into about three quarters of the live disks in
// the model and records it there. It runs right after the kill, before the
// restart, as if the VMs had written the data just before the crash. It
// leaves alone the volumes an interrupted operation touched or read: their
// state is not known until the restart, and a retry of that operation
// expects their present data. Recovery must keep the stamps of the others.
func (h *harness) stamp(n int) {
	keep := map[string]bool{}
	for _, o := range h.uncertain {
		if o != nil {
			for name := range o.alts {
				keep[name] = true
			}
			keep[o.src] = true
		}
	}
	for _, name := range sortedKeys(h.model) {
		v := h.model[name]
		if keep[name] {
			continue
		}
		for i, d := range v.Disks {
			if h.rng.IntN(4) == 0 {
				continue
			}
			h.stamps++
			s := fmt.Sprintf("%s/%s#%d", name, d.Name, h.stamps)
			if err := writeStamp(filepath.Join(h.dir, "volumes", name, "disks", d.Name+".img"), s); err != nil {
				h.fatalf(n, "stamp: %v", err)
			}
			v.Disks[i].Data = s
		}
	}
}
