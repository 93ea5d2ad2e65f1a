package hook

import (
	"errors"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"libvirt.org/go/libvirtxml"

	"github.com/quiverstorage/quiver/internal/kubevirt"
	"github.com/quiverstorage/quiver/internal/kubevirt/hookapi/v1alpha3"
)

// TestBadInput: each case makes OnDefineDomain fail (so the VM does not
// start) with an error naming the cause, never a domain with a disk missing.
func TestBadInput(t *testing.T) {
	domainXML := string(readFixture(t, "domain.xml"))
	vmiJSON := string(readFixture(t, "vmi.json"))
	const extraKey = `\"rootdisk\":[\"data\",\"logs\"]`
	withExtra := func(v string) string { return strings.Replace(vmiJSON, extraKey, v, 1) }
	cases := []struct {
		name      string
		domain    string
		vmi       string
		sentinel  error
		code      codes.Code
		mentioned []string
	}{
		{"duplicate name in one volume", domainXML, withExtra(`\"rootdisk\":[\"data\",\"data\"]`),
			kubevirt.ErrDuplicate, codes.InvalidArgument, []string{`disk "data"`, "rootdisk"}},
		{"duplicate name across volumes", domainXML, withExtra(`\"rootdisk\":[\"data\"],\"scratch\":[\"data\"]`),
			kubevirt.ErrDuplicate, codes.InvalidArgument, []string{`disk "data"`, "rootdisk", "scratch"}},
		{"the primary disk named as extra", domainXML, withExtra(`\"rootdisk\":[\"disk\"]`),
			kubevirt.ErrDuplicate, codes.InvalidArgument, []string{`disk name "disk"`}},
		{"serial already on a disk", strings.Replace(domainXML, `<alias name="ua-scratch"></alias>`, `<alias name="ua-scratch"></alias><serial>logs</serial>`, 1),
			vmiJSON,
			kubevirt.ErrDuplicate, codes.InvalidArgument, []string{`serial "logs"`, "scratch"}},
		{"target clash", strings.Replace(domainXML, `dev="vdc"`, `dev="vdb"`, 1), vmiJSON,
			kubevirt.ErrDuplicate, codes.InvalidArgument, []string{"target vdb", "scratch", "cloudinitdisk"}},
		{"malformed domain XML", domainXML[:len(domainXML)/2], vmiJSON,
			kubevirt.ErrInvalid, codes.InvalidArgument, []string{"domain XML"}},
		{"malformed VMI JSON", domainXML, vmiJSON[:40],
			kubevirt.ErrInvalid, codes.InvalidArgument, []string{"VMI JSON"}},
		{"malformed annotation", domainXML, withExtra(`\"rootdisk\":\"data\"`),
			kubevirt.ErrInvalid, codes.InvalidArgument, []string{kubevirt.AnnotationExtraDisks}},
		{"bad disk name", domainXML, withExtra(`\"rootdisk\":[\"Data!\"]`),
			kubevirt.ErrInvalid, codes.InvalidArgument, []string{`disk name "Data!"`, "DNS label"}},
		{"disk name longer than a serial", domainXML, withExtra(`\"rootdisk\":[\"a-very-long-disk-name-x\"]`),
			kubevirt.ErrInvalid, codes.InvalidArgument, []string{"longer than 20 bytes"}},
		{"unknown bus", domainXML, strings.Replace(vmiJSON, `"kubevirt.io/latest`, `"quiver.io/extra-disk-bus": "ide", "kubevirt.io/latest`, 1),
			kubevirt.ErrInvalid, codes.InvalidArgument, []string{kubevirt.AnnotationDiskBus, "ide"}},
		{"volume not in the VMI", domainXML, withExtra(`\"nosuch\":[\"data\"]`),
			kubevirt.ErrInvalid, codes.InvalidArgument, []string{`volume "nosuch"`}},
		{"volume that is not a PVC", domainXML, withExtra(`\"cloudinitdisk\":[\"data\"]`),
			kubevirt.ErrInvalid, codes.InvalidArgument, []string{`volume "cloudinitdisk"`}},
		{"Block-mode PVC", strings.Replace(domainXML, `<disk device="disk" type="file" model="virtio-non-transitional">
      <source file="/var/run/kubevirt-private/vmi-disks/rootdisk/disk.img"></source>`, `<disk device="disk" type="block" model="virtio-non-transitional">
      <source dev="/dev/rootdisk"></source>`, 1), vmiJSON,
			kubevirt.ErrUnsupported, codes.FailedPrecondition, []string{"volume rootdisk", "Filesystem-mode"}},
		{"no disk for the volume", strings.Replace(domainXML, `ua-rootdisk`, `ua-other`, 1), vmiJSON,
			kubevirt.ErrInvalid, codes.InvalidArgument, []string{"no disk with alias ua-rootdisk"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			vmi, err := kubevirt.DecodeVMI([]byte(tc.vmi))
			if err == nil {
				_, err = AddDisks([]byte(tc.domain), vmi, Options{})
			}
			if !errors.Is(err, tc.sentinel) {
				t.Fatalf("err = %v, want %v", err, tc.sentinel)
			}
			for _, m := range tc.mentioned {
				if !strings.Contains(err.Error(), m) {
					t.Errorf("error %q does not mention %q", err, m)
				}
			}
			// The same over the wire: virt-launcher gets an error, no domain.
			conn := serve(t, Options{})
			res, err := v1alpha3.NewCallbacksClient(conn).OnDefineDomain(t.Context(),
				&v1alpha3.OnDefineDomainParams{DomainXML: []byte(tc.domain), Vmi: []byte(tc.vmi)})
			if status.Code(err) != tc.code || res != nil {
				t.Fatalf("over gRPC: %v (result %v), want code %v", err, res, tc.code)
			}
		})
	}
}

// TestRoundTrip documents what a decode-encode round trip of KubeVirt's
// domain through libvirtxml keeps: every element but the empty <source> of
// an ethernet interface (libvirtxml models its content, not its presence).
// That is why AddDisks inserts the new disks into KubeVirt's text instead of
// re-encoding the domain; this test fails when libvirtxml's behaviour
// changes, either way.
func TestRoundTrip(t *testing.T) {
	in := readFixture(t, "domain.xml")
	var dom libvirtxml.Domain
	if err := dom.Unmarshal(string(in)); err != nil {
		t.Fatal(err)
	}
	out, err := dom.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	a, b := parseTree(t, in), parseTree(t, []byte(out))
	// Drop the one known loss from the input, then the trees must match.
	for _, dev := range a.children {
		if dev.name.Local != "devices" {
			continue
		}
		for _, c := range dev.children {
			if c.name.Local != "interface" {
				continue
			}
			for i, cc := range c.children {
				if cc.name.Local == "source" && len(cc.attrs) == 0 && len(cc.children) == 0 {
					c.children = append(c.children[:i], c.children[i+1:]...)
					break
				}
			}
		}
	}
	if a.canonical() != b.canonical() {
		diff(t, "", a, b)
		t.Fatal("libvirtxml's round trip loses more than the empty interface <source>")
	}
}
