package ova

import (
	"archive/tar"
	"crypto/sha256"
	"encoding/hex"
	"encoding/xml"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
)

// streamOptimized is the format URI of the VMDKs vSphere imports.
const streamOptimized = "http://www.vmware.com/interfaces/specifications/vmdk.html#streamOptimized"

// ExportDisk is one disk written into a package.
type ExportDisk struct {
	Name     string // the disk's name, its ElementName
	File     string // plain file name of its image in the package
	Capacity int64  // virtual size in bytes
}

// WriteDescriptor writes an OVF 1.0 descriptor for a VM with disks, each
// a streamOptimized VMDK on a SCSI controller, in order. Elements keep the
// order the DMTF schemas give (CIM RASD properties sorted by name).
func WriteDescriptor(w io.Writer, vm string, disks []ExportDisk) error {
	var b strings.Builder
	esc := func(s string) string {
		var out strings.Builder
		_ = xml.EscapeText(&out, []byte(s))
		return out.String()
	}
	b.WriteString(xml.Header)
	b.WriteString(`<Envelope xmlns="http://schemas.dmtf.org/ovf/envelope/1"` +
		` xmlns:ovf="http://schemas.dmtf.org/ovf/envelope/1"` +
		` xmlns:rasd="http://schemas.dmtf.org/wbem/wscim/1/cim-schema/2/CIM_ResourceAllocationSettingData"` +
		` xmlns:vssd="http://schemas.dmtf.org/wbem/wscim/1/cim-schema/2/CIM_VirtualSystemSettingData">` + "\n")
	b.WriteString("  <References>\n")
	for i, d := range disks {
		fmt.Fprintf(&b, "    <File ovf:id=\"file%d\" ovf:href=\"%s\"/>\n", i+1, esc(d.File))
	}
	b.WriteString("  </References>\n")
	b.WriteString("  <DiskSection>\n    <Info>Virtual disks</Info>\n")
	for i, d := range disks {
		fmt.Fprintf(&b, "    <Disk ovf:capacity=\"%d\" ovf:capacityAllocationUnits=\"byte\" ovf:diskId=\"vmdisk%d\" ovf:fileRef=\"file%d\" ovf:format=\"%s\"/>\n",
			d.Capacity, i+1, i+1, streamOptimized)
	}
	b.WriteString("  </DiskSection>\n")
	fmt.Fprintf(&b, "  <VirtualSystem ovf:id=\"%s\">\n    <Info>A virtual machine exported by quiver</Info>\n    <Name>%s</Name>\n", esc(vm), esc(vm))
	b.WriteString("    <VirtualHardwareSection>\n      <Info>Virtual hardware requirements</Info>\n")
	fmt.Fprintf(&b, "      <System>\n        <vssd:ElementName>Virtual Hardware Family</vssd:ElementName>\n"+
		"        <vssd:InstanceID>0</vssd:InstanceID>\n        <vssd:VirtualSystemIdentifier>%s</vssd:VirtualSystemIdentifier>\n"+
		"        <vssd:VirtualSystemType>vmx-13</vssd:VirtualSystemType>\n      </System>\n", esc(vm))
	b.WriteString("      <Item>\n        <rasd:Address>0</rasd:Address>\n        <rasd:ElementName>SCSI controller 0</rasd:ElementName>\n" +
		"        <rasd:InstanceID>1</rasd:InstanceID>\n        <rasd:ResourceSubType>lsilogic</rasd:ResourceSubType>\n" +
		"        <rasd:ResourceType>6</rasd:ResourceType>\n      </Item>\n")
	for i, d := range disks {
		fmt.Fprintf(&b, "      <Item>\n        <rasd:AddressOnParent>%d</rasd:AddressOnParent>\n        <rasd:ElementName>%s</rasd:ElementName>\n"+
			"        <rasd:HostResource>ovf:/disk/vmdisk%d</rasd:HostResource>\n        <rasd:InstanceID>%d</rasd:InstanceID>\n"+
			"        <rasd:Parent>1</rasd:Parent>\n        <rasd:ResourceType>17</rasd:ResourceType>\n      </Item>\n",
			i, esc(d.Name), i+1, i+2)
	}
	b.WriteString("    </VirtualHardwareSection>\n  </VirtualSystem>\n</Envelope>\n")
	_, err := io.WriteString(w, b.String())
	return err
}

// WriteOVA writes an OVA at path: the descriptor first, then each disk's
// image (files maps ExportDisk.File to the image on disk), then a SHA256
// manifest. The archive is written to a temporary name and renamed into
// place, so a failed export leaves no partial archive.
func WriteOVA(path, vm string, disks []ExportDisk, files map[string]string) (err error) {
	tmp, err := os.CreateTemp(filepath.Dir(path), ".quiver-export-*.ova")
	if err != nil {
		return err
	}
	defer func() {
		if err != nil {
			tmp.Close()
			os.Remove(tmp.Name())
		}
	}()
	tw := tar.NewWriter(tmp)
	base := strings.TrimSuffix(filepath.Base(path), ".ova")
	var desc strings.Builder
	if err := WriteDescriptor(&desc, vm, disks); err != nil {
		return err
	}
	add := func(name string, size int64, r io.Reader) error {
		if err := tw.WriteHeader(&tar.Header{Name: name, Mode: 0o644, Size: size, Typeflag: tar.TypeReg, Format: tar.FormatUSTAR}); err != nil {
			return err
		}
		_, err := io.Copy(tw, r)
		return err
	}
	var mf strings.Builder
	sum := func(name string, data []byte) {
		s := sha256.Sum256(data)
		fmt.Fprintf(&mf, "SHA256(%s)= %s\n", name, hex.EncodeToString(s[:]))
	}
	if err := add(base+".ovf", int64(desc.Len()), strings.NewReader(desc.String())); err != nil {
		return err
	}
	sum(base+".ovf", []byte(desc.String()))
	for _, d := range disks {
		f, err := os.Open(files[d.File])
		if err != nil {
			return err
		}
		st, err := f.Stat()
		if err != nil {
			f.Close()
			return err
		}
		h := sha256.New()
		err = add(d.File, st.Size(), io.TeeReader(f, h))
		f.Close()
		if err != nil {
			return fmt.Errorf("write %s into the archive: %w", d.File, err)
		}
		fmt.Fprintf(&mf, "SHA256(%s)= %s\n", d.File, hex.EncodeToString(h.Sum(nil)))
	}
	if err := add(base+".mf", int64(mf.Len()), strings.NewReader(mf.String())); err != nil {
		return err
	}
	if err := tw.Close(); err != nil {
		return err
	}
	if err := tmp.Sync(); err != nil {
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), path)
}
