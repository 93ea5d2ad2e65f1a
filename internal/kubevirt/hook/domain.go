package hook

import (
	"bytes"
	"encoding/xml"
	"fmt"
	"io"
	"maps"
	"path"
	"slices"
	"strings"

	"libvirt.org/go/libvirtxml"

	"github.com/quiverstorage/quiver/internal/endpoint"
	"github.com/quiverstorage/quiver/internal/kubevirt"
)

// kubevirtAliasPrefix starts the alias KubeVirt gives each disk of a VMI:
// "ua-" + the VMI disk's name, which is its volume's name.
const kubevirtAliasPrefix = "ua-"

// primaryFile is the file KubeVirt boots from a Filesystem PVC.
const primaryFile = kubevirt.PrimaryDisk + ".img"

// Options tune AddDisks.
type Options struct {
	// Volume, when set, limits the hook to that KubeVirt volume.
	Volume string
}

// AddDisks returns domainXML with the disks the VMI's annotations name
// added, or an error naming the cause; it never returns a domain with some
// of the named disks missing. It reads nothing but its arguments: the hook
// sidecar does not see the PVCs (KubeVirt would have to mount each a second
// time in the launcher pod, and the kubelet mounts a claim once per pod).
//
//   - AnnotationExtraDisks: each named disk is the file <disk>.img beside
//     the volume's disk.img, the primary left as it is.
//   - AnnotationEndpointDisks: the volume's directory is the compute node's
//     endpoint, its disk.img an empty placeholder: every disk of the volume,
//     the primary included, is an NBD disk on the directory's
//     endpoint.SocketName, export = disk name, with QEMU's reconnect-delay.
//   - AnnotationBlockDisks: the volume's block device holds every disk, each
//     a slice of it.
//
// A VMI without these annotations gets the domain back unchanged, byte for
// byte.
func AddDisks(domainXML []byte, vmi kubevirt.VMI, opts Options) ([]byte, error) {
	ann := vmi.Metadata.Annotations
	value, hasExtra := ann[kubevirt.AnnotationExtraDisks]
	blockValue, hasBlock := ann[kubevirt.AnnotationBlockDisks]
	epValue, hasEndpoint := ann[kubevirt.AnnotationEndpointDisks]
	if !hasExtra && !hasBlock && !hasEndpoint {
		return domainXML, nil
	}
	extra := kubevirt.ExtraDisks{}
	blocks := kubevirt.BlockDisks{}
	served := kubevirt.EndpointDisks{}
	var err error
	if hasExtra {
		if extra, err = kubevirt.ParseExtraDisks(value); err != nil {
			return nil, err
		}
	}
	if hasBlock {
		if blocks, err = kubevirt.ParseBlockDisks(blockValue); err != nil {
			return nil, err
		}
	}
	var delay uint
	if hasEndpoint {
		if served, err = kubevirt.ParseEndpointDisks(epValue); err != nil {
			return nil, err
		}
		if delay, err = kubevirt.ParseReconnectDelay(ann[kubevirt.AnnotationReconnectDelay]); err != nil {
			return nil, err
		}
	}
	bus, err := kubevirt.ParseBus(ann[kubevirt.AnnotationDiskBus])
	if err != nil {
		return nil, err
	}
	if err := oneAnnotationEach(extra, blocks, served); err != nil {
		return nil, err
	}
	var dom libvirtxml.Domain
	if err := dom.Unmarshal(string(domainXML)); err != nil {
		return nil, fmt.Errorf("domain XML: %v: %w", err, kubevirt.ErrInvalid)
	}
	if dom.Devices == nil {
		return nil, fmt.Errorf("domain XML: no <devices>: %w", kubevirt.ErrInvalid)
	}
	volumes := map[string]kubevirt.Volume{}
	for _, v := range vmi.Spec.Volumes {
		volumes[v.Name] = v
	}
	targets, serials, err := usedNames(dom.Devices.Disks)
	if err != nil {
		return nil, err
	}
	var names []string
	for name, disks := range extra {
		if len(disks) > 0 {
			names = append(names, name)
		}
	}
	for name := range served {
		names = append(names, name)
	}
	names = slices.DeleteFunc(names, func(n string) bool { return opts.Volume != "" && n != opts.Volume })
	slices.Sort(names)
	var added []libvirtxml.DomainDisk
	var rewrites []primaryRewrite
	for _, name := range names {
		key := kubevirt.AnnotationExtraDisks
		if served[name] != nil {
			key = kubevirt.AnnotationEndpointDisks
		}
		if vol, ok := volumes[name]; !ok || !vol.FromClaim() {
			return nil, fmt.Errorf("annotation %s names volume %q, which is not a PVC or DataVolume volume of the VMI: %w",
				key, name, kubevirt.ErrInvalid)
		}
		var primary libvirtxml.DomainDisk
		var dir string
		disks := extra[name]
		var ep *endpointDir
		if served[name] != nil {
			// A domain the hook has seen already (virt-launcher calls
			// it again with the domain it defined) has the primary on
			// the socket: it stays so.
			var done bool
			if primary, dir, done, err = servedPrimary(dom.Devices.Disks, name); err != nil {
				return nil, err
			}
			if ep, err = newEndpointDir(name, dir, delay); err != nil {
				return nil, err
			}
			if !done {
				rewrites = append(rewrites, primaryRewrite{alias: primary.Alias.Name, source: ep.source(kubevirt.PrimaryDisk)})
			}
			disks = slices.DeleteFunc(slices.Clone(served[name]), func(d string) bool { return d == kubevirt.PrimaryDisk })
		} else {
			if primary, err = primaryDisk(dom.Devices.Disks, name); err != nil {
				return nil, err
			}
			dir = path.Dir(primary.Source.File.File)
		}
		for _, disk := range disks {
			d := extraDisk(primary, dir, disk, bus)
			if ep != nil {
				d.Source = ep.source(disk)
				networkDriver(d.Driver)
			}
			if other, dup := serials[disk]; dup {
				if added, ok := bySerial(dom.Devices.Disks, disk); ok && sameSource(added.Source, d.Source) {
					continue // added by an earlier call on this domain
				}
				return nil, fmt.Errorf("volume %s, disk %s: serial %q is already the serial of the domain's disk %s: %w",
					name, disk, disk, other, kubevirt.ErrDuplicate)
			}
			d.Target.Dev, err = nextTarget(targets, bus)
			if err != nil {
				return nil, err
			}
			targets[d.Target.Dev] = disk
			serials[disk] = d.Target.Dev
			added = append(added, d)
		}
	}
	for _, name := range slices.Sorted(maps.Keys(blocks)) {
		if opts.Volume != "" && name != opts.Volume {
			continue
		}
		if vol, ok := volumes[name]; !ok || !vol.FromClaim() {
			return nil, fmt.Errorf("annotation %s names volume %q, which is not a PVC or DataVolume volume of the VMI: %w",
				kubevirt.AnnotationBlockDisks, name, kubevirt.ErrInvalid)
		}
		primary, err := blockPrimary(dom.Devices.Disks, name)
		if err != nil {
			return nil, err
		}
		bv := blockVolume{name: name, dev: primary.Source.Block.Dev, primary: primary, disks: blocks[name], all: dom.Devices.Disks}
		rw, disks, err := bv.blockDisks(bus, targets, serials)
		if err != nil {
			return nil, err
		}
		if rw.alias != "" {
			rewrites = append(rewrites, rw)
		}
		added = append(added, disks...)
	}
	out := domainXML
	if len(rewrites) > 0 {
		if out, err = rewritePrimaries(out, rewrites); err != nil {
			return nil, err
		}
	}
	if len(added) == 0 {
		return out, nil
	}
	return insertDisks(out, added)
}

// oneAnnotationEach refuses a volume named by two of the disk annotations:
// each says how its disks reach QEMU, and they exclude each other.
func oneAnnotationEach(extra kubevirt.ExtraDisks, blocks kubevirt.BlockDisks, served kubevirt.EndpointDisks) error {
	type named struct {
		key  string
		vols []string
	}
	all := []named{
		{kubevirt.AnnotationExtraDisks, slices.Collect(maps.Keys(extra))},
		{kubevirt.AnnotationBlockDisks, slices.Collect(maps.Keys(blocks))},
		{kubevirt.AnnotationEndpointDisks, slices.Collect(maps.Keys(served))},
	}
	seen := map[string]string{}
	for _, a := range all {
		slices.Sort(a.vols)
		for _, v := range a.vols {
			if other, both := seen[v]; both {
				return fmt.Errorf("volume %s is named by both annotations %s and %s: %w", v, other, a.key, kubevirt.ErrInvalid)
			}
			seen[v] = a.key
		}
	}
	return nil
}

// insertDisks returns the document with the disks inserted after its last
// <disk> in <devices> (or at the end of <devices>). Everything else stays
// byte for byte as KubeVirt wrote it: a decode-encode round trip through
// libvirtxml would drop elements it models as empty (TestRoundTrip).
func insertDisks(doc []byte, disks []libvirtxml.DomainDisk) ([]byte, error) {
	at, indent, err := insertionPoint(doc)
	if err != nil {
		return nil, err
	}
	var buf bytes.Buffer
	buf.Write(doc[:at])
	for _, d := range disks {
		b, err := xml.MarshalIndent(&d, indent, "  ")
		if err != nil {
			return nil, fmt.Errorf("domain XML: encode disk %s: %v: %w", d.Serial, err, kubevirt.ErrInvalid)
		}
		buf.WriteString("\n" + indent)
		buf.Write(bytes.TrimLeft(b, " \t"))
	}
	buf.Write(doc[at:])
	return buf.Bytes(), nil
}

// insertionPoint finds the byte offset just after the last <disk> child of
// <domain><devices>, or, with no disk, just before </devices>; and the
// indentation of the devices' children.
func insertionPoint(doc []byte) (int, string, error) {
	dec := xml.NewDecoder(bytes.NewReader(doc))
	depth, at, end := 0, -1, -1
	indent := "    "
	var inDevices bool
	for {
		off := dec.InputOffset()
		tok, err := dec.Token()
		if err == io.EOF {
			break
		}
		if err != nil {
			return 0, "", fmt.Errorf("domain XML: %v: %w", err, kubevirt.ErrInvalid)
		}
		switch tok := tok.(type) {
		case xml.StartElement:
			depth++
			inDevices = inDevices || (depth == 2 && tok.Name.Local == "devices")
			if inDevices && depth == 3 && tok.Name.Local == "disk" {
				line := doc[:off]
				indent = string(line[bytes.LastIndexByte(line, '\n')+1:])
				if strings.Trim(indent, " \t") != "" {
					indent = ""
				}
			}
		case xml.EndElement:
			switch {
			case inDevices && depth == 3 && tok.Name.Local == "disk":
				at = int(dec.InputOffset())
			case inDevices && depth == 2:
				end = int(off)
				inDevices = false
			}
			depth--
		}
	}
	switch {
	case at >= 0:
		return at, indent, nil
	case end >= 0:
		return end, indent, nil
	}
	return 0, "", fmt.Errorf("domain XML: no <devices>: %w", kubevirt.ErrInvalid)
}

// usedNames collects the targets and serials the domain's disks already
// use; a target used twice is an error (libvirt would refuse the domain).
func usedNames(disks []libvirtxml.DomainDisk) (targets, serials map[string]string, err error) {
	targets, serials = map[string]string{}, map[string]string{}
	for _, d := range disks {
		id := diskID(d)
		if d.Target != nil && d.Target.Dev != "" {
			if other, dup := targets[d.Target.Dev]; dup {
				return nil, nil, fmt.Errorf("domain XML: target %s is used by disk %s and by disk %s: %w",
					d.Target.Dev, other, id, kubevirt.ErrDuplicate)
			}
			targets[d.Target.Dev] = id
		}
		if d.Serial != "" {
			serials[d.Serial] = id
		}
	}
	return targets, serials, nil
}

// diskID names a domain disk in messages: its alias, else its target.
func diskID(d libvirtxml.DomainDisk) string {
	if d.Alias != nil && d.Alias.Name != "" {
		return strings.TrimPrefix(d.Alias.Name, kubevirtAliasPrefix)
	}
	if d.Target != nil {
		return d.Target.Dev
	}
	return "(unnamed)"
}

// servedPrimary finds the domain disk of a volume the endpoint serves: the
// disk.img file KubeVirt made (done false: to be rewritten), or the NBD
// disk on the endpoint's socket an earlier call made of it (done true);
// dir is the PVC's directory either way.
func servedPrimary(disks []libvirtxml.DomainDisk, volume string) (d libvirtxml.DomainDisk, dir string, done bool, err error) {
	for _, d := range disks {
		if d.Alias == nil || d.Alias.Name != kubevirtAliasPrefix+volume || d.Source == nil || d.Source.Network == nil {
			continue
		}
		n := d.Source.Network
		if n.Protocol == "nbd" && n.Name == kubevirt.PrimaryDisk && len(n.Hosts) == 1 && n.Hosts[0].Transport == "unix" &&
			path.Base(n.Hosts[0].Socket) == endpoint.SocketName && d.Target != nil {
			return d, path.Dir(n.Hosts[0].Socket), true, nil
		}
	}
	d, err = primaryDisk(disks, volume)
	if err != nil {
		return d, "", false, err
	}
	return d, path.Dir(d.Source.File.File), false, nil
}

// bySerial finds the domain's disk of that serial.
func bySerial(disks []libvirtxml.DomainDisk, serial string) (libvirtxml.DomainDisk, bool) {
	for _, d := range disks {
		if d.Serial == serial {
			return d, true
		}
	}
	return libvirtxml.DomainDisk{}, false
}

// sameSource says whether two disk sources name the same bytes: the same
// file, the same NBD export on the same socket, or the same slice of the
// same device. A disk the hook would add that is there already, with that
// source, was added by an earlier call.
func sameSource(a, b *libvirtxml.DomainDiskSource) bool {
	switch {
	case a == nil || b == nil:
		return false
	case a.File != nil && b.File != nil:
		return a.File.File == b.File.File
	case a.Network != nil && b.Network != nil:
		an, bn := a.Network, b.Network
		return an.Protocol == bn.Protocol && an.Name == bn.Name && len(an.Hosts) == 1 && len(bn.Hosts) == 1 &&
			an.Hosts[0].Transport == bn.Hosts[0].Transport && an.Hosts[0].Socket == bn.Hosts[0].Socket
	case a.Block != nil && b.Block != nil:
		return a.Block.Dev == b.Block.Dev && sameSlices(a.Slices, b.Slices)
	}
	return false
}

func sameSlices(a, b *libvirtxml.DomainDiskSlices) bool {
	if a == nil || b == nil {
		return a == b
	}
	return slices.EqualFunc(a.Slices, b.Slices, func(x, y libvirtxml.DomainDiskSlice) bool {
		return x.Type == y.Type && x.Offset == y.Offset && x.Size == y.Size
	})
}

// primaryDisk finds the disk KubeVirt made for a volume (alias ua-<volume>)
// and checks it is the disk.img of a Filesystem PVC.
func primaryDisk(disks []libvirtxml.DomainDisk, volume string) (libvirtxml.DomainDisk, error) {
	for _, d := range disks {
		if d.Alias == nil || d.Alias.Name != kubevirtAliasPrefix+volume {
			continue
		}
		if d.Source == nil || d.Source.File == nil || d.Source.File.File == "" {
			return d, fmt.Errorf("volume %s: its domain disk is not a file (a Block-mode PVC?); extra disks need a Filesystem-mode PVC: %w",
				volume, kubevirt.ErrUnsupported)
		}
		if path.Base(d.Source.File.File) != primaryFile {
			return d, fmt.Errorf("volume %s: its domain disk is %s, not the %s of a Filesystem PVC: %w",
				volume, d.Source.File.File, primaryFile, kubevirt.ErrUnsupported)
		}
		if d.Target == nil {
			return d, fmt.Errorf("volume %s: its domain disk has no <target>: %w", volume, kubevirt.ErrInvalid)
		}
		return d, nil
	}
	return libvirtxml.DomainDisk{}, fmt.Errorf("volume %s: the domain has no disk with alias %s%s: %w",
		volume, kubevirtAliasPrefix, volume, kubevirt.ErrInvalid)
}

// extraDisk builds the <disk> of one extra disk from the volume's primary:
// the same driver (format, cache, io, discard, error policy, iothread),
// read-only and shareable flags; the disk name as serial; no boot order, no
// alias (KubeVirt's aliases name VMI disks) and no address (libvirt assigns
// one).
func extraDisk(primary libvirtxml.DomainDisk, dir, disk, bus string) libvirtxml.DomainDisk {
	d := libvirtxml.DomainDisk{
		XMLName: xml.Name{Local: "disk"},
		Device:  "disk",
		Source: &libvirtxml.DomainDiskSource{
			File: &libvirtxml.DomainDiskSourceFile{File: path.Join(dir, disk+".img")},
		},
		Target:    &libvirtxml.DomainDiskTarget{Bus: bus},
		ReadOnly:  primary.ReadOnly,
		Shareable: primary.Shareable,
		Serial:    disk,
	}
	if primary.Driver != nil {
		drv := *primary.Driver
		d.Driver = &drv
	}
	if bus == kubevirt.BusVirtio && primary.Target.Bus == kubevirt.BusVirtio {
		d.Model = primary.Model // virtio-non-transitional and friends
	}
	if bus != kubevirt.BusVirtio && d.Driver != nil {
		d.Driver.IOThread = nil // iothreads serve virtio disks only
	}
	return d
}

// nextTarget is the first free device name of the bus's prefix, in libvirt's
// order: vda..vdz, vdaa.. (sda.. for sata).
func nextTarget(used map[string]string, bus string) (string, error) {
	prefix := "vd"
	if bus == kubevirt.BusSATA {
		prefix = "sd"
	}
	for i := range 26 * 27 {
		name := prefix + deviceSuffix(i)
		if _, taken := used[name]; !taken {
			return name, nil
		}
	}
	return "", fmt.Errorf("no free %s target left: %w", prefix, kubevirt.ErrDuplicate)
}

// deviceSuffix is libvirt's disk index to name suffix: 0 a, 25 z, 26 aa.
func deviceSuffix(i int) string {
	s := ""
	for i++; i > 0; i = (i - 1) / 26 {
		s = string(rune('a'+(i-1)%26)) + s
	}
	return s
}
