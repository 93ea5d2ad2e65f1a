package hook

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"

	"libvirt.org/go/libvirtxml"

	"github.com/quiverstorage/quiver/internal/kubevirt"
)

// FuzzAddDisks feeds the hook the two inputs that come over the wire (the
// domain XML and the annotation inside the VMI JSON): it never panics, and
// whatever it accepts comes back as a domain that parses, holds the input
// unchanged, and gained exactly the disks the annotation names.
func FuzzAddDisks(f *testing.F) {
	domain, err := readFixtureBytes("domain.xml")
	if err != nil {
		f.Fatal(err)
	}
	f.Add(domain, `{"rootdisk":["data","logs"]}`)
	f.Add(domain, `{"rootdisk":[]}`)
	f.Add([]byte(`<domain><devices><disk type="file"><source file="/d/disk.img"/><target dev="vda" bus="virtio"/><alias name="ua-rootdisk"/></disk></devices></domain>`), `{"rootdisk":["data"]}`)
	f.Add([]byte(`<domain><devices/></domain>`), `{"rootdisk":["data"]}`)
	f.Fuzz(func(t *testing.T, domainXML []byte, extra string) {
		vmi := kubevirt.VMI{
			Metadata: kubevirt.ObjectMeta{Annotations: map[string]string{kubevirt.AnnotationExtraDisks: extra}},
			Spec: kubevirt.VMISpec{Volumes: []kubevirt.Volume{
				{Name: "rootdisk", PersistentVolumeClaim: &kubevirt.ClaimSource{ClaimName: "c"}},
			}},
		}
		out, err := AddDisks(domainXML, vmi, Options{})
		if err != nil {
			return
		}
		parsed, perr := kubevirt.ParseExtraDisks(extra)
		if perr != nil {
			t.Fatalf("accepted an annotation ParseExtraDisks refuses: %v", perr)
		}
		var dom libvirtxml.Domain
		if err := dom.Unmarshal(string(out)); err != nil {
			t.Fatalf("output does not parse: %v\n%s", err, out)
		}
		added := len(parsed["rootdisk"])
		if added == 0 {
			if !bytes.Equal(out, domainXML) {
				t.Fatal("nothing to add, but the domain changed")
			}
			return
		}
		assertSameTree(t, domainXML, out, added)
	})
}

func readFixtureBytes(name string) ([]byte, error) {
	return os.ReadFile(filepath.Join("testdata", name))
}
