package ova

import (
	"archive/tar"
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

const goodOVF = `<?xml version="1.0" encoding="UTF-8"?>
<Envelope xmlns="http://schemas.dmtf.org/ovf/envelope/1" xmlns:ovf="http://schemas.dmtf.org/ovf/envelope/1"
  xmlns:rasd="http://schemas.dmtf.org/wbem/wscim/1/cim-schema/2/CIM_ResourceAllocationSettingData">
  <References>
    <File ovf:id="f1" ovf:href="web-disk1.vmdk" ovf:size="1000"/>
    <File ovf:id="f2" ovf:href="web-disk2.vmdk"/>
  </References>
  <DiskSection><Info>disks</Info>
    <Disk ovf:diskId="d2" ovf:fileRef="f2" ovf:capacity="2" ovf:capacityAllocationUnits="byte * 2^30"/>
    <Disk ovf:diskId="d1" ovf:fileRef="f1" ovf:capacity="1048576"/>
  </DiskSection>
  <VirtualSystem ovf:id="web01"><Info>vm</Info><Name>web01</Name>
    <VirtualHardwareSection><Info>hw</Info>
      <Item><rasd:ElementName>Network adapter 1</rasd:ElementName><rasd:ResourceType>10</rasd:ResourceType></Item>
      <Item><rasd:ElementName>Hard disk 1</rasd:ElementName><rasd:HostResource>ovf:/disk/d1</rasd:HostResource><rasd:ResourceType>17</rasd:ResourceType></Item>
      <Item><rasd:ElementName>Hard disk 2</rasd:ElementName><rasd:HostResource>ovf:/disk/d2</rasd:HostResource><rasd:ResourceType>17</rasd:ResourceType></Item>
    </VirtualHardwareSection>
  </VirtualSystem>
</Envelope>`

func TestParse(t *testing.T) {
	d, err := Parse(strings.NewReader(goodOVF), nil)
	if err != nil {
		t.Fatal(err)
	}
	want := []Disk{
		{ID: "d1", Name: "hard-disk-1", File: "web-disk1.vmdk", Capacity: 1 << 20},
		{ID: "d2", Name: "hard-disk-2", File: "web-disk2.vmdk", Capacity: 2 << 30},
	}
	if d.VM != "web01" || len(d.Disks) != 2 || d.Disks[0] != want[0] || d.Disks[1] != want[1] {
		t.Fatalf("parsed %+v, want VM web01 and %+v", d, want)
	}
	d, err = Parse(strings.NewReader(goodOVF), []string{"root", "data"})
	if err != nil || d.Disks[0].Name != "root" || d.Disks[1].Name != "data" {
		t.Fatalf("renamed: %+v, %v", d, err)
	}
}

func TestWriteDescriptorParsesBack(t *testing.T) {
	var b bytes.Buffer
	disks := []ExportDisk{{Name: "root", File: "vm-root.vmdk", Capacity: 40 << 30}, {Name: "data", File: "vm-data.vmdk", Capacity: 512}}
	if err := WriteDescriptor(&b, "vm & co", disks); err != nil {
		t.Fatal(err)
	}
	d, err := Parse(&b, nil)
	if err != nil {
		t.Fatalf("%v\n%s", err, b.String())
	}
	if d.VM != "vm & co" || len(d.Disks) != 2 || d.Disks[0].Name != "root" || d.Disks[0].Capacity != 40<<30 ||
		d.Disks[1].File != "vm-data.vmdk" || d.Disks[1].Format != streamOptimized {
		t.Fatalf("parsed back %+v", d)
	}
}

// TestParseRefuses: each broken descriptor is refused with ErrInvalid and a
// message naming what is wrong.
func TestParseRefuses(t *testing.T) {
	swap := func(old, new string) string {
		if !strings.Contains(goodOVF, old) {
			t.Fatalf("no %q in the descriptor", old)
		}
		return strings.Replace(goodOVF, old, new, 1)
	}
	for _, tc := range []struct {
		name, ovf, want string
		names           []string
	}{
		{"not xml", "this is not xml", "not an OVF envelope", nil},
		{"truncated", goodOVF[:len(goodOVF)/2], "not an OVF envelope", nil},
		{"other root", `<Foo/>`, "not an OVF envelope", nil},
		{"path in href", swap(`ovf:href="web-disk1.vmdk"`, `ovf:href="../../etc/shadow"`), "paths are refused", nil},
		{"absolute href", swap(`ovf:href="web-disk1.vmdk"`, `ovf:href="/dev/sda"`), "paths are refused", nil},
		{"url href", swap(`ovf:href="web-disk1.vmdk"`, `ovf:href="http:evil"`), "URLs are refused", nil},
		{"missing file ref", swap(`ovf:fileRef="f1"`, `ovf:fileRef="nope"`), `fileRef "nope" names no file`, nil},
		{"duplicate disk id", swap(`ovf:diskId="d2"`, `ovf:diskId="d1"`), `disk id "d1" is given twice`, nil},
		{"duplicate file id", swap(`ovf:id="f2"`, `ovf:id="f1"`), `file id "f1" is given twice`, nil},
		{"negative capacity", swap(`ovf:capacity="1048576"`, `ovf:capacity="-1"`), "want a positive integer", nil},
		{"huge capacity", swap(`ovf:capacity="2"`, `ovf:capacity="99999999999"`), "does not fit in 64 bits", nil},
		{"bad units", swap(`byte * 2^30`, `furlongs`), "capacityAllocationUnits", nil},
		{"no disks", swap(`<Disk ovf:diskId="d2" ovf:fileRef="f2" ovf:capacity="2" ovf:capacityAllocationUnits="byte * 2^30"/>
    <Disk ovf:diskId="d1" ovf:fileRef="f1" ovf:capacity="1048576"/>`, ``), "names no disk", nil},
		{"item names unknown disk", swap(`ovf:/disk/d2`, `ovf:/disk/d9`), `uses disk "d9"`, nil},
		{"disk used twice", swap(`ovf:/disk/d2`, `ovf:/disk/d1`), "used by two hardware items", nil},
		{"names collide", swap(`Hard disk 2`, `Hard disk 1`), `would both be named "hard-disk-1"`, nil},
		{"no virtual system", swap(`<VirtualSystem ovf:id="web01">`, `<VirtualSystemX>`), "not an OVF envelope", nil},
		{"wrong name count", goodOVF, "1 disk names given for 2 disks", []string{"root"}},
		{"bad given name", goodOVF, `name "Root" is not a DNS label`, []string{"Root", "data"}},
		{"duplicate given names", goodOVF, `would both be named "root"`, []string{"root", "root"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Parse(strings.NewReader(tc.ovf), tc.names)
			if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want ErrInvalid saying %q", err, tc.want)
			}
		})
	}
}

// writeTar makes an archive of the named members, in order.
func writeTar(t *testing.T, path string, members ...[2]string) {
	t.Helper()
	var b bytes.Buffer
	tw := tar.NewWriter(&b)
	for _, m := range members {
		if err := tw.WriteHeader(&tar.Header{Name: m[0], Mode: 0o644, Size: int64(len(m[1])), Typeflag: tar.TypeReg}); err != nil {
			t.Fatal(err)
		}
		tw.Write([]byte(m[1]))
	}
	tw.Close()
	if err := os.WriteFile(path, b.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
}

func TestOpenOVA(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "web.ova")
	writeTar(t, path, [2]string{"web.ovf", goodOVF}, [2]string{"web-disk1.vmdk", "ONE"}, [2]string{"web-disk2.vmdk", "TWO!"},
		[2]string{"web.mf", "SHA256(web-disk1.vmdk)= 5e5a8e7b1e5b7bd0fc3a9ec5b4a2c2a61bd8a3a4b1d2d8c1ad3a0a42f71e3a43\nSHA256(web-disk2.vmdk)= 00\n"})
	p, err := Open(path, nil)
	if err != nil {
		t.Fatal(err)
	}
	raw, _ := os.ReadFile(path)
	for file, want := range map[string]string{"web-disk1.vmdk": "ONE", "web-disk2.vmdk": "TWO!"} {
		m := p.Files[file]
		if got := string(raw[m.Offset : m.Offset+m.Size]); got != want {
			t.Errorf("%s at [%d,+%d) holds %q, want %q", file, m.Offset, m.Size, got, want)
		}
	}
	if err := p.Verify(nil); !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), "the file is damaged") {
		t.Fatalf("Verify with wrong digests: %v", err)
	}

	for _, tc := range []struct {
		name    string
		members [][2]string
		want    string
	}{
		{"descriptor not first", [][2]string{{"a.vmdk", "x"}, {"web.ovf", goodOVF}}, "starts with its .ovf descriptor"},
		{"missing disk file", [][2]string{{"web.ovf", goodOVF}, {"web-disk1.vmdk", "x"}}, `no file "web-disk2.vmdk"`},
		{"member with a path", [][2]string{{"web.ovf", goodOVF}, {"../web-disk1.vmdk", "x"}}, "paths are refused"},
		{"member twice", [][2]string{{"web.ovf", goodOVF}, {"web-disk1.vmdk", "x"}, {"web-disk1.vmdk", "y"}}, "appears twice"},
		{"manifest misses a disk", [][2]string{{"web.ovf", goodOVF}, {"web-disk1.vmdk", "x"}, {"web-disk2.vmdk", "y"},
			{"web.mf", "SHA256(web-disk1.vmdk)= 00\n"}}, `does not list "web-disk2.vmdk"`},
		{"bad manifest line", [][2]string{{"web.ovf", goodOVF}, {"web-disk1.vmdk", "x"}, {"web-disk2.vmdk", "y"},
			{"web.mf", "MD5(web-disk1.vmdk)= 00\n"}}, "want ALGO(file)= hex"},
		{"empty", nil, "no .ovf descriptor"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := filepath.Join(t.TempDir(), "x.ova")
			writeTar(t, p, tc.members...)
			if _, err := Open(p, nil); !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want ErrInvalid saying %q", err, tc.want)
			}
		})
	}
	t.Run("truncated", func(t *testing.T) {
		p := filepath.Join(t.TempDir(), "x.ova")
		writeTar(t, p, [2]string{"web.ovf", goodOVF}, [2]string{"web-disk1.vmdk", "x"}, [2]string{"web-disk2.vmdk", strings.Repeat("y", 4096)})
		st, _ := os.Stat(p)
		os.Truncate(p, st.Size()-1024-3000)
		if _, err := Open(p, nil); !errors.Is(err, ErrInvalid) {
			t.Fatalf("err = %v, want ErrInvalid", err)
		}
	})
}

func TestWriteOVAOpensBack(t *testing.T) {
	dir := t.TempDir()
	img := filepath.Join(dir, "img")
	os.WriteFile(img, []byte("DISKDATA"), 0o644)
	path := filepath.Join(dir, "out.ova")
	disks := []ExportDisk{{Name: "root", File: "out-root.vmdk", Capacity: 1 << 20}}
	if err := WriteOVA(path, "vm", disks, map[string]string{"out-root.vmdk": img}); err != nil {
		t.Fatal(err)
	}
	p, err := Open(path, nil)
	if err != nil {
		t.Fatal(err)
	}
	if !p.HasManifest() {
		t.Fatal("no manifest")
	}
	if err := p.Verify(nil); err != nil {
		t.Fatal(err)
	}
	if d := p.Descriptor.Disks; len(d) != 1 || d[0].Name != "root" || d[0].Capacity != 1<<20 {
		t.Fatalf("disks %+v", d)
	}
	if m, _ := filepath.Glob(filepath.Join(dir, ".quiver-export-*")); len(m) != 0 {
		t.Fatalf("temporary files left: %v", m)
	}
}
