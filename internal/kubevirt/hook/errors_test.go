package hook

import (
	"bytes"
	"errors"
	"fmt"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"libvirt.org/go/libvirtxml"

	"github.com/quiverstorage/quiver/internal/kubevirt"
)

// TestToStatus is the table of the one error mapping at the gRPC boundary.
func TestToStatus(t *testing.T) {
	for _, tc := range []struct {
		err  error
		code codes.Code
	}{
		{kubevirt.ErrInvalid, codes.InvalidArgument},
		{kubevirt.ErrDuplicate, codes.InvalidArgument},
		{kubevirt.ErrMissingDisk, codes.NotFound},
		{kubevirt.ErrUnsupported, codes.FailedPrecondition},
		{errors.New("anything else"), codes.Internal},
	} {
		err := toStatus(fmt.Errorf("volume rootdisk: %w", tc.err))
		if status.Code(err) != tc.code || status.Convert(err).Message() != "volume rootdisk: "+tc.err.Error() {
			t.Errorf("%v: %v, want code %v and the message kept", tc.err, err, tc.code)
		}
	}
}

// TestHookPerVolume runs two sidecars one after the other, as the webhook
// sets them up for a VM with two quiver PVCs (each --volume, each seeing
// its own PVC): the second sees the first one's disks, so targets follow
// on and serials stay unique; a sidecar leaves the other volume alone.
func TestHookPerVolume(t *testing.T) {
	domainXML := readFixture(t, "domain.xml")
	vmi, err := kubevirt.DecodeVMI(readFixture(t, "vmi.json"))
	if err != nil {
		t.Fatal(err)
	}
	vmi.Metadata.Annotations[kubevirt.AnnotationExtraDisks] = `{"rootdisk":["data","logs"],"scratch":["swap"]}`
	first, err := AddDisks(domainXML, vmi, Options{Volume: "scratch"})
	if err != nil {
		t.Fatal(err)
	}
	out, err := AddDisks(first, vmi, Options{Volume: "rootdisk"})
	if err != nil {
		t.Fatal(err)
	}
	var dom libvirtxml.Domain
	if err := dom.Unmarshal(string(out)); err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, d := range dom.Devices.Disks[3:] {
		got = append(got, d.Serial+"="+d.Target.Dev+":"+d.Source.File.File)
	}
	want := []string{
		"swap=vdd:/var/run/kubevirt-private/vmi-disks/scratch/swap.img",
		"data=vde:/var/run/kubevirt-private/vmi-disks/rootdisk/data.img",
		"logs=vdf:/var/run/kubevirt-private/vmi-disks/rootdisk/logs.img",
	}
	if strings.Join(got, " ") != strings.Join(want, " ") {
		t.Fatalf("added disks %q, want %q", got, want)
	}
	// A second pass over the hook's own domain (virt-launcher calls the
	// hooks again with the domain it defined; or two sidecars for one
	// volume) adds nothing: the disks are there, with their sources.
	again, err := AddDisks(out, vmi, Options{Volume: "rootdisk"})
	if err != nil || !bytes.Equal(again, out) {
		t.Fatalf("second pass: err %v, changed %v", err, !bytes.Equal(again, out))
	}
	// A disk of that serial with another source is a clash, refused.
	clash := bytes.Replace(out, []byte("rootdisk/logs.img"), []byte("scratch/logs.img"), 1)
	if _, err := AddDisks(clash, vmi, Options{Volume: "rootdisk"}); !errors.Is(err, kubevirt.ErrDuplicate) {
		t.Fatalf("serial logs on another file: %v, want %v", err, kubevirt.ErrDuplicate)
	}
}
