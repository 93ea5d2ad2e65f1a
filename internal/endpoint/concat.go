package endpoint

import (
	"errors"
	"fmt"
	"sync"

	"github.com/quiverstorage/quiver/internal/pool"
)

// DisksExport is the export of a volume's socket that serves every disk of
// the volume as one device (Block mode): disk i of the publication at
// offset i*SlotSize. It is not a DNS label, so no disk has its name.
const DisksExport = "@disks"

// SlotSize is the room each disk has in the DisksExport device: 64 TiB,
// a disk's largest size in Block mode. A disk's place depends only on its
// index in the publication, never on the sizes, so growing a disk moves
// no other: the KubeVirt hook gives QEMU each disk as a slice of the one
// block device a Block-mode PVC is (kubevirt.AnnotationBlockDisks).
const SlotSize = int64(1) << 46

// concatDisk serves the disks of a volume, each a forward.Disk, at
// offset i*SlotSize of one device of len(disks)*SlotSize bytes. The bytes
// of a slot past its disk's size read as zeros; a write there fails. A
// request that spans slots is split. Flush flushes every disk.
type concatDisk struct {
	disks []pool.Disk
	ro    bool
}

var _ pool.Disk = (*concatDisk)(nil)

func newConcatDisk(disks []pool.Disk) *concatDisk {
	c := &concatDisk{disks: disks}
	for _, d := range disks {
		c.ro = c.ro || d.ReadOnly()
	}
	return c
}

func (c *concatDisk) Size() int64    { return int64(len(c.disks)) * SlotSize }
func (c *concatDisk) ReadOnly() bool { return c.ro }

// each runs fn on every piece of [off, off+length) that falls in a slot:
// the slot's disk, the offset in it, the piece's place in the request and
// its length, and whether the piece lies past the disk's end.
func (c *concatDisk) each(off, length int64, fn func(d pool.Disk, doff, at, n int64, past bool) error) error {
	if off < 0 || length < 0 || off+length > c.Size() {
		return fmt.Errorf("range [%d, +%d) outside the %d-byte device: %w", off, length, c.Size(), pool.ErrInvalid)
	}
	at := int64(0)
	for length > 0 {
		slot, doff := off/SlotSize, off%SlotSize
		n := min(length, SlotSize-doff)
		d := c.disks[slot]
		size := d.Size()
		if doff < size {
			in := min(n, size-doff)
			if err := fn(d, doff, at, in, false); err != nil {
				return err
			}
			if in < n {
				if err := fn(d, size, at+in, n-in, true); err != nil {
					return err
				}
			}
		} else if err := fn(d, doff, at, n, true); err != nil {
			return err
		}
		off, at, length = off+n, at+n, length-n
	}
	return nil
}

func (c *concatDisk) ReadAt(p []byte, off int64) error {
	return c.each(off, int64(len(p)), func(d pool.Disk, doff, at, n int64, past bool) error {
		if past {
			clear(p[at : at+n])
			return nil
		}
		return d.ReadAt(p[at:at+n], doff)
	})
}

func (c *concatDisk) WriteAt(p []byte, off int64, fua bool) error {
	return c.each(off, int64(len(p)), func(d pool.Disk, doff, at, n int64, past bool) error {
		if past {
			return fmt.Errorf("write at %d: past the end of a disk in the device of every disk (a slice's bounds): %w", off+at, pool.ErrInvalid)
		}
		return d.WriteAt(p[at:at+n], doff, fua)
	})
}

// Flush flushes every disk at once: a FLUSH of the device makes every
// write it answered durable, whichever disk it went to.
func (c *concatDisk) Flush() error {
	errs := make([]error, len(c.disks))
	var wg sync.WaitGroup
	for i, d := range c.disks {
		wg.Go(func() { errs[i] = d.Flush() })
	}
	wg.Wait()
	return errors.Join(errs...)
}

func (c *concatDisk) Trim(off, length int64, fua bool) error {
	return c.each(off, length, func(d pool.Disk, doff, _, n int64, past bool) error {
		if past {
			return nil // reads as zeros already
		}
		return d.Trim(doff, n, fua)
	})
}

func (c *concatDisk) Zero(off, length int64, flags pool.ZeroFlags) error {
	return c.each(off, length, func(d pool.Disk, doff, _, n int64, past bool) error {
		if past {
			return nil
		}
		return d.Zero(doff, n, flags)
	})
}

// Cache is a hint: it is not forwarded.
func (c *concatDisk) Cache(off, length int64) error { return nil }

// Extents reports the range as data, as forward.Disk does.
func (c *concatDisk) Extents(off, length int64, limit int) ([]pool.Extent, error) {
	return []pool.Extent{{Offset: off, Length: length}}, nil
}

func (c *concatDisk) Capabilities() pool.Capabilities { return pool.Capabilities{} }

func (c *concatDisk) Close() error {
	var errs []error
	for _, d := range c.disks {
		errs = append(errs, d.Close())
	}
	return errors.Join(errs...)
}
