package hook

import (
	"encoding/xml"
	"fmt"

	"libvirt.org/go/libvirtxml"

	"github.com/quiverstorage/quiver/internal/endpoint"
	"github.com/quiverstorage/quiver/internal/kubevirt"
)

// blockVolume is one Block-mode volume of AnnotationBlockDisks: its PVC is
// one block device holding every disk of the quiver volume, disk i at
// i*endpoint.SlotSize (the compute node's endpoint serves it so).
type blockVolume struct {
	name    string
	dev     string // the device as QEMU sees it (/dev/<volume>)
	primary libvirtxml.DomainDisk
	disks   []kubevirt.BlockDisk
	all     []libvirtxml.DomainDisk // the domain's disks
}

// blockPrimary finds the block disk KubeVirt made for volume (alias
// ua-<volume>) and checks it is one.
func blockPrimary(disks []libvirtxml.DomainDisk, volume string) (libvirtxml.DomainDisk, error) {
	for _, d := range disks {
		if d.Alias == nil || d.Alias.Name != kubevirtAliasPrefix+volume {
			continue
		}
		if d.Source == nil || d.Source.Block == nil || d.Source.Block.Dev == "" {
			return d, fmt.Errorf("volume %s: annotation %s lays it out as a Block-mode PVC, and its domain disk is not a block device: %w",
				volume, kubevirt.AnnotationBlockDisks, kubevirt.ErrInvalid)
		}
		if d.Target == nil {
			return d, fmt.Errorf("volume %s: its domain disk has no <target>: %w", volume, kubevirt.ErrInvalid)
		}
		return d, nil
	}
	return libvirtxml.DomainDisk{}, fmt.Errorf("volume %s: the domain has no disk with alias %s%s: %w",
		volume, kubevirtAliasPrefix, volume, kubevirt.ErrInvalid)
}

// blockSource is the <source> of slot i of the device: disk's bytes.
func blockSource(dev string, slot int, disk kubevirt.BlockDisk) *libvirtxml.DomainDiskSource {
	return &libvirtxml.DomainDiskSource{
		Block: &libvirtxml.DomainDiskSourceBlock{Dev: dev},
		Slices: &libvirtxml.DomainDiskSlices{Slices: []libvirtxml.DomainDiskSlice{{
			Type: "storage", Offset: uint(int64(slot) * endpoint.SlotSize), Size: uint(disk.Size)}}},
	}
}

// blockDisks returns the rewrite of v's domain disk (the boot disk's
// slice) and the domain disks of its other disks (their slices), each
// shareable: QEMU opens the one device once per slice, and those nodes
// must share the writer's permission.
func (v blockVolume) blockDisks(bus string, targets, serials map[string]string) (primaryRewrite, []libvirtxml.DomainDisk, error) {
	boot := kubevirt.Boot(v.disks)
	for _, d := range v.disks {
		if d.Size > endpoint.SlotSize {
			return primaryRewrite{}, nil, fmt.Errorf("volume %s, disk %s: %d bytes, more than a Block-mode disk's %d: %w",
				v.name, d.Name, d.Size, endpoint.SlotSize, kubevirt.ErrInvalid)
		}
	}
	rw := primaryRewrite{alias: v.primary.Alias.Name, source: blockSource(v.dev, boot, v.disks[boot]), block: true}
	switch {
	case v.primary.Source.Slices == nil:
	case sameSlices(v.primary.Source.Slices, rw.source.Slices):
		rw = primaryRewrite{} // an earlier call on this domain made it so
	default:
		return primaryRewrite{}, nil, fmt.Errorf("volume %s: its domain disk already has <slices> other than the boot disk's: %w", v.name, kubevirt.ErrInvalid)
	}
	var added []libvirtxml.DomainDisk
	for i, disk := range v.disks {
		if i == boot {
			continue
		}
		if other, dup := serials[disk.Name]; dup {
			if d, ok := bySerial(v.all, disk.Name); ok && sameSource(d.Source, blockSource(v.dev, i, disk)) {
				continue // added by an earlier call on this domain
			}
			return primaryRewrite{}, nil, fmt.Errorf("volume %s, disk %s: serial %q is already the serial of the domain's disk %s: %w",
				v.name, disk.Name, disk.Name, other, kubevirt.ErrDuplicate)
		}
		d := libvirtxml.DomainDisk{
			XMLName:   xml.Name{Local: "disk"},
			Device:    "disk",
			Source:    blockSource(v.dev, i, disk),
			Target:    &libvirtxml.DomainDiskTarget{Bus: bus},
			ReadOnly:  v.primary.ReadOnly,
			Shareable: &libvirtxml.DomainDiskShareable{},
			Serial:    disk.Name,
		}
		if v.primary.Driver != nil {
			drv := *v.primary.Driver
			d.Driver = &drv
			if bus != kubevirt.BusVirtio {
				d.Driver.IOThread = nil
			}
		}
		if bus == kubevirt.BusVirtio && v.primary.Target.Bus == kubevirt.BusVirtio {
			d.Model = v.primary.Model
		}
		var err error
		if d.Target.Dev, err = nextTarget(targets, bus); err != nil {
			return primaryRewrite{}, nil, err
		}
		targets[d.Target.Dev] = disk.Name
		serials[disk.Name] = d.Target.Dev
		added = append(added, d)
	}
	return rw, added, nil
}
