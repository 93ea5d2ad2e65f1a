package hook

import (
	"bytes"
	"errors"
	"strings"
	"testing"

	"libvirt.org/go/libvirtxml"

	"github.com/quiverstorage/quiver/internal/endpoint"
	"github.com/quiverstorage/quiver/internal/kubevirt"
)

// blockPrimaryXML is the fixture's primary disk as KubeVirt writes it for a
// Block-mode PVC.
const blockPrimaryXML = `<disk device="disk" type="block" model="virtio-non-transitional">
      <source dev="/dev/rootdisk"></source>
      <target bus="virtio" dev="vda"></target>
      <driver cache="none" error_policy="stop" name="qemu" type="raw" iothread="1" io="native" discard="unmap"></driver>
      <alias name="ua-rootdisk"></alias>
      <boot order="1"></boot>
    </disk>`

func blockFixture(t *testing.T, layout string) ([]byte, kubevirt.VMI) {
	t.Helper()
	domainXML := readFixture(t, "domain.xml")
	if !bytes.Contains(domainXML, []byte(filePrimary)) {
		t.Fatal("the fixture's primary disk is not filePrimary")
	}
	domainXML = bytes.Replace(domainXML, []byte(filePrimary), []byte(blockPrimaryXML), 1)
	vmi, err := kubevirt.DecodeVMI(readFixture(t, "vmi.json"))
	if err != nil {
		t.Fatal(err)
	}
	delete(vmi.Metadata.Annotations, kubevirt.AnnotationExtraDisks)
	vmi.Metadata.Annotations[kubevirt.AnnotationBlockDisks] = layout
	return domainXML, vmi
}

// TestHookBlock: a Block-mode volume laid out by the block-disks
// annotation gets every disk as a slice of its one device: the domain's
// disk (the disk named "disk", here the second slot) keeps its target,
// boot order, alias and driver and gets its slice and <shareable/>; the
// others are shareable block disks of the same device at their slots'
// offsets, serial = disk name. Everything before the primary is KubeVirt's
// text, byte for byte.
func TestHookBlock(t *testing.T) {
	layout := `{"rootdisk":[{"name":"data","size":2147483648},{"name":"disk","size":1073741824},{"name":"logs","size":536870912}]}`
	domainXML, vmi := blockFixture(t, layout)
	out, err := AddDisks(domainXML, vmi, Options{})
	if err != nil {
		t.Fatal(err)
	}
	// virt-launcher calls the hooks again with the domain it defined:
	// nothing more to do.
	if again, err := AddDisks(out, vmi, Options{}); err != nil || !bytes.Equal(again, out) {
		t.Fatalf("second pass: err %v, changed %v", err, !bytes.Equal(again, out))
	}
	at := bytes.Index(domainXML, []byte(blockPrimaryXML))
	if !bytes.Equal(out[:at], domainXML[:at]) {
		t.Error("the domain changed before the primary disk")
	}
	var dom libvirtxml.Domain
	if err := dom.Unmarshal(string(out)); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	slice := func(d libvirtxml.DomainDisk) (string, uint, uint) {
		if d.Source == nil || d.Source.Block == nil || d.Source.Slices == nil || len(d.Source.Slices.Slices) != 1 {
			t.Fatalf("disk %+v: not a block disk with one slice", d)
		}
		s := d.Source.Slices.Slices[0]
		if s.Type != "storage" {
			t.Fatalf("slice type %q", s.Type)
		}
		return d.Source.Block.Dev, s.Offset, s.Size
	}
	primary := dom.Devices.Disks[0]
	if dev, off, size := slice(primary); dev != "/dev/rootdisk" || off != uint(endpoint.SlotSize) || size != 1<<30 {
		t.Errorf("primary: %s at %d, %d bytes; want /dev/rootdisk at %d (slot 1), %d bytes", dev, off, size, endpoint.SlotSize, 1<<30)
	}
	if primary.Shareable == nil || primary.Target.Dev != "vda" || primary.Boot == nil || primary.Alias == nil ||
		primary.Driver == nil || primary.Driver.IO != "native" {
		t.Errorf("primary: shareable %v target %+v boot %v alias %v driver %+v: want shareable, vda, boot order, alias, io native kept",
			primary.Shareable, primary.Target, primary.Boot, primary.Alias, primary.Driver)
	}
	added := dom.Devices.Disks[3:]
	want := []struct {
		name string
		slot int64
		size uint
		dev  string
	}{{"data", 0, 2 << 30, "vdd"}, {"logs", 2, 512 << 20, "vde"}}
	if len(added) != len(want) {
		t.Fatalf("%d disks added, want %d:\n%s", len(added), len(want), out)
	}
	for i, w := range want {
		d := added[i]
		dev, off, size := slice(d)
		if dev != "/dev/rootdisk" || off != uint(w.slot*endpoint.SlotSize) || size != w.size {
			t.Errorf("%s: %s at %d, %d bytes; want /dev/rootdisk at slot %d, %d bytes", w.name, dev, off, size, w.slot, w.size)
		}
		if d.Serial != w.name || d.Target.Dev != w.dev || d.Shareable == nil || d.Boot != nil || d.Alias != nil {
			t.Errorf("%s: serial %q target %s shareable %v boot %v alias %v", w.name, d.Serial, d.Target.Dev, d.Shareable, d.Boot, d.Alias)
		}
	}
	// The second scratch volume and the cloud-init disk are untouched.
	if !strings.Contains(string(out), `<source file="/var/run/kubevirt-private/vmi-disks/scratch/disk.img"></source>`) {
		t.Error("the scratch volume's disk changed")
	}
}

// TestHookBlockRefusals: a layout the hook cannot honour is an error, and
// never a domain with some disks missing.
func TestHookBlockRefusals(t *testing.T) {
	for name, tc := range map[string]struct {
		layout  string
		file    bool // the domain's disk is a file, not a block device
		wantErr error
	}{
		"disk larger than a slot": {layout: `{"rootdisk":[{"name":"disk","size":70368744177665}]}`, wantErr: kubevirt.ErrInvalid},
		"not a block disk":        {layout: `{"rootdisk":[{"name":"disk","size":1024}]}`, file: true, wantErr: kubevirt.ErrInvalid},
		"unknown volume":          {layout: `{"nosuch":[{"name":"disk","size":1024}]}`, wantErr: kubevirt.ErrInvalid},
		"zero size":               {layout: `{"rootdisk":[{"name":"disk","size":0}]}`, wantErr: kubevirt.ErrInvalid},
		"bad name":                {layout: `{"rootdisk":[{"name":"Disk","size":1024}]}`, wantErr: kubevirt.ErrInvalid},
		"name twice":              {layout: `{"rootdisk":[{"name":"disk","size":1024},{"name":"disk","size":1024}]}`, wantErr: kubevirt.ErrDuplicate},
		"not JSON":                {layout: `{`, wantErr: kubevirt.ErrInvalid},
	} {
		domainXML, vmi := blockFixture(t, tc.layout)
		if tc.file {
			domainXML = bytes.Replace(domainXML, []byte(blockPrimaryXML), []byte(filePrimary), 1)
		}
		out, err := AddDisks(domainXML, vmi, Options{})
		if !errors.Is(err, tc.wantErr) || out != nil {
			t.Errorf("%s: %v (%d bytes out), want %v", name, err, len(out), tc.wantErr)
		}
	}
}
