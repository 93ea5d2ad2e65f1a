package hook

import (
	"bytes"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"regexp"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"libvirt.org/go/libvirtxml"

	"github.com/quiverstorage/quiver/internal/kubevirt"
	"github.com/quiverstorage/quiver/internal/kubevirt/hookapi/v1alpha3"
	"github.com/quiverstorage/quiver/internal/testfs"
)

// endpointVMI is the fixture's VMI with rootdisk served by the endpoint:
// the webhook's endpoint-disks annotation listing disks, no extra-disks.
func endpointVMI(t *testing.T, vmiJSON []byte, disks ...string) kubevirt.VMI {
	t.Helper()
	vmi, err := kubevirt.DecodeVMI(vmiJSON)
	if err != nil {
		t.Fatal(err)
	}
	delete(vmi.Metadata.Annotations, kubevirt.AnnotationExtraDisks)
	vmi.Metadata.Annotations[kubevirt.AnnotationEndpointDisks] = kubevirt.EndpointDisks{"rootdisk": disks}.Format()
	return vmi
}

// The fixture's primary disk, and what it must become on the endpoint:
// written out by hand, the oracle of TestHookEndpoint.
const (
	filePrimary = `<disk device="disk" type="file" model="virtio-non-transitional">
      <source file="/var/run/kubevirt-private/vmi-disks/rootdisk/disk.img"></source>
      <target bus="virtio" dev="vda"></target>
      <driver cache="none" error_policy="stop" name="qemu" type="raw" iothread="1" io="native" discard="unmap"></driver>
      <alias name="ua-rootdisk"></alias>
      <boot order="1"></boot>
    </disk>`
	nbdPrimary = `<disk device="disk" type="network" model="virtio-non-transitional">
      <source protocol="nbd" name="disk">
        <host transport="unix" socket="/var/run/kubevirt-private/vmi-disks/rootdisk/nbd.sock"></host>
        <reconnect delay="DELAY"></reconnect>
      </source>
      <target bus="virtio" dev="vda"></target>
      <driver cache="none" error_policy="stop" name="qemu" type="raw" iothread="1" discard="unmap"></driver>
      <alias name="ua-rootdisk"></alias>
      <boot order="1"></boot>
    </disk>`
)

// TestHookEndpoint: a volume the endpoint-disks annotation names gets every
// disk on the endpoint's NBD socket in its directory, a one-disk volume
// too: the primary is rewritten in place (target, boot order, alias kept;
// io dropped), the others are NBD disks named by disk with serial = disk
// name; the other volumes and every other element stay as KubeVirt wrote
// them, and libvirt's schema accepts the result. The hook reads no file.
func TestHookEndpoint(t *testing.T) {
	domainXML := readFixture(t, "domain.xml")
	if !bytes.Contains(domainXML, []byte(filePrimary)) {
		t.Fatal("the fixture's primary disk is not filePrimary")
	}
	for _, tc := range []struct {
		name   string
		delay  string // the reconnect-delay annotation, "" none
		extras []string
	}{
		{name: "three disks", extras: []string{"data", "logs"}},
		{name: "three disks, reconnect delay set", delay: "90", extras: []string{"data", "logs"}},
		{name: "one disk"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			vmi := endpointVMI(t, readFixture(t, "vmi.json"), append([]string{"disk"}, tc.extras...)...)
			wantDelay := "60"
			if tc.delay != "" {
				vmi.Metadata.Annotations[kubevirt.AnnotationReconnectDelay] = tc.delay
				wantDelay = tc.delay
			}
			out, err := AddDisks(domainXML, vmi, Options{})
			if err != nil {
				t.Fatal(err)
			}
			// virt-launcher calls the hooks again with the domain it
			// defined (KubeVirt v1.6.0 keeps the hooks' changes in its
			// wanted spec): nothing more to do, no refusal.
			if again, err := AddDisks(out, vmi, Options{}); err != nil || !bytes.Equal(again, out) {
				t.Fatalf("second pass: err %v, changed %v", err, !bytes.Equal(again, out))
			}
			// Everything before the primary is KubeVirt's text, byte for byte.
			at := bytes.Index(domainXML, []byte(filePrimary))
			if !bytes.Equal(out[:at], domainXML[:at]) {
				t.Error("the domain changed before the primary disk")
			}
			want := strings.Replace(string(domainXML), filePrimary, strings.ReplaceAll(nbdPrimary, "DELAY", wantDelay), 1)
			assertSameTree(t, []byte(want), out, len(tc.extras))

			var dom libvirtxml.Domain
			if err := dom.Unmarshal(string(out)); err != nil {
				t.Fatal(err)
			}
			added := dom.Devices.Disks[3:]
			if len(added) != len(tc.extras) {
				t.Fatalf("%d disks added, want %d:\n%s", len(added), len(tc.extras), out)
			}
			primary := dom.Devices.Disks[0]
			for i, d := range added {
				name := tc.extras[i]
				n := d.Source.Network
				if n == nil || n.Protocol != "nbd" || n.Name != name || len(n.Hosts) != 1 ||
					n.Hosts[0] != (libvirtxml.DomainDiskSourceHost{Transport: "unix", Socket: pvcDir + "/nbd.sock"}) ||
					n.Reconnect == nil || n.Reconnect.Delay != wantDelay {
					t.Errorf("disk %d source %+v, want nbd export %s on %s/nbd.sock, reconnect delay %s", i, n, name, pvcDir, wantDelay)
				}
				if d.Serial != name || d.Target.Dev != []string{"vdd", "vde"}[i] || d.Boot != nil || d.Alias != nil {
					t.Errorf("disk %d: serial %q target %s boot %v alias %v, want serial %s, target vd%c, no boot order, no alias",
						i, d.Serial, d.Target.Dev, d.Boot, d.Alias, name, 'd'+i)
				}
				if !reflect.DeepEqual(d.Driver, primary.Driver) || d.Driver.IO != "" || d.Driver.Type != "raw" {
					t.Errorf("disk %s driver %+v, want the rewritten primary's %+v (raw, no io)", name, *d.Driver, *primary.Driver)
				}
			}

			// libvirt 9.0's schema (Debian bookworm) predates <reconnect> in
			// an NBD source (a later libvirt added it): validate the rest.
			testfs.RequireTool(t, "virt-xml-validate")
			f := filepath.Join(t.TempDir(), "out.xml")
			reconnect := regexp.MustCompile(`\s*<reconnect delay="[0-9]+"></reconnect>`)
			if err := os.WriteFile(f, reconnect.ReplaceAll(out, nil), 0o644); err != nil {
				t.Fatal(err)
			}
			if msg, err := exec.Command("virt-xml-validate", f, "domain").CombinedOutput(); err != nil {
				t.Errorf("virt-xml-validate: %v\n%s", err, msg)
			}
		})
	}
}

// TestHookEndpointPerVolume: a sidecar for another volume (--volume
// scratch) leaves the endpoint volume alone, byte for byte, and the
// sidecar of the endpoint volume rewrites it.
func TestHookEndpointPerVolume(t *testing.T) {
	domainXML := readFixture(t, "domain.xml")
	vmi := endpointVMI(t, readFixture(t, "vmi.json"), "disk")
	out, err := AddDisks(domainXML, vmi, Options{Volume: "scratch"})
	if err != nil || !bytes.Equal(out, domainXML) {
		t.Fatalf("the scratch sidecar: err %v, changed %v", err, !bytes.Equal(out, domainXML))
	}
	out, err = AddDisks(domainXML, vmi, Options{Volume: "rootdisk"})
	if err != nil {
		t.Fatal(err)
	}
	assertSameTree(t, bytes.Replace(domainXML, []byte(filePrimary), []byte(strings.ReplaceAll(nbdPrimary, "DELAY", "60")), 1), out, 0)
}

// TestHookWithoutEndpoint: with the extra-disks annotation, a primary
// stays a file disk and the extras are files beside it, even where the
// directory would be an endpoint's: the endpoint path is taken only on the
// endpoint-disks annotation's word. Without an annotation the domain comes
// back byte for byte.
func TestHookWithoutEndpoint(t *testing.T) {
	domainXML := readFixture(t, "domain.xml")
	vmi, err := kubevirt.DecodeVMI(readFixture(t, "vmi.json"))
	if err != nil {
		t.Fatal(err)
	}
	out, err := AddDisks(domainXML, vmi, Options{})
	if err != nil {
		t.Fatal(err)
	}
	assertSameTree(t, domainXML, out, 2)
	if bytes.Contains(out, []byte("nbd")) {
		t.Errorf("an NBD disk without the endpoint annotation:\n%s", out)
	}
	delete(vmi.Metadata.Annotations, kubevirt.AnnotationExtraDisks)
	out, err = AddDisks(domainXML, vmi, Options{})
	if err != nil || !bytes.Equal(out, domainXML) {
		t.Fatalf("no annotation: err %v, changed %v", err, !bytes.Equal(out, domainXML))
	}
}

// TestHookEndpointLongestSocket: a 62-byte volume name makes a socket
// path of 107 bytes, the longest a unix socket takes: accepted (one more
// byte is refused, TestHookEndpointRefusals).
func TestHookEndpointLongestSocket(t *testing.T) {
	name := "rootdisk-" + strings.Repeat("x", 62-len("rootdisk-"))
	domainXML := strings.ReplaceAll(string(readFixture(t, "domain.xml")), "rootdisk", name)
	vmi, err := kubevirt.DecodeVMI([]byte(strings.ReplaceAll(string(readFixture(t, "vmi.json")), "rootdisk", name)))
	if err != nil {
		t.Fatal(err)
	}
	delete(vmi.Metadata.Annotations, kubevirt.AnnotationExtraDisks)
	vmi.Metadata.Annotations[kubevirt.AnnotationEndpointDisks] = kubevirt.EndpointDisks{name: {"disk", "data", "logs"}}.Format()
	dir := strings.Replace(pvcDir, "rootdisk", name, 1)
	out, err := AddDisks([]byte(domainXML), vmi, Options{})
	if err != nil {
		t.Fatal(err)
	}
	sock := dir + "/nbd.sock"
	if len(sock) != 107 || bytes.Count(out, []byte(`socket="`+sock+`"`)) != 3 {
		t.Fatalf("socket %s (%d bytes) not on the 3 disks:\n%s", sock, len(sock), out)
	}
}

// TestHookEndpointRefusals: what the endpoint path refuses, in process and
// over gRPC, each with an error naming the cause.
func TestHookEndpointRefusals(t *testing.T) {
	domainXML := string(readFixture(t, "domain.xml"))
	vmiJSON := string(readFixture(t, "vmi.json"))
	const extra = `"quiver.io/extra-disks": "{\"rootdisk\":[\"data\",\"logs\"]}"`
	if !strings.Contains(vmiJSON, extra) {
		t.Fatal("the fixture's VMI has no extra-disks annotation to replace")
	}
	served := func(value string) string {
		b, err := json.Marshal(value)
		if err != nil {
			t.Fatal(err)
		}
		return strings.Replace(vmiJSON, extra, `"quiver.io/endpoint-disks": `+string(b), 1)
	}
	// A 63-byte volume name, the longest DNS label: its socket path is
	// /var/run/kubevirt-private/vmi-disks/<63>/nbd.sock, 108 bytes.
	long := "rootdisk-" + strings.Repeat("x", 63-len("rootdisk-"))
	for _, tc := range []struct {
		name      string
		domain    string
		vmi       string
		sentinel  error
		code      codes.Code
		mentioned []string
	}{
		{"no primary listed", domainXML, served(`{"rootdisk":["data","logs"]}`),
			kubevirt.ErrMissingDisk, codes.NotFound, []string{`lists no disk "disk"`, "placeholder"}},
		{"primary listed twice", domainXML, served(`{"rootdisk":["disk","data","disk"]}`),
			kubevirt.ErrDuplicate, codes.InvalidArgument, []string{`disk "disk" listed twice`}},
		{"disk in two volumes", domainXML, served(`{"rootdisk":["disk","data"],"scratch":["disk","data"]}`),
			kubevirt.ErrDuplicate, codes.InvalidArgument, []string{`disk "data"`, "rootdisk", "scratch"}},
		{"volume in two annotations", domainXML, strings.Replace(served(`{"rootdisk":["disk"]}`), `"kubevirt.io/latest`, `"quiver.io/extra-disks": "{\"rootdisk\":[\"data\"]}", "kubevirt.io/latest`, 1),
			kubevirt.ErrInvalid, codes.InvalidArgument, []string{"volume rootdisk is named by both annotations", kubevirt.AnnotationEndpointDisks}},
		{"volume not in the VMI", domainXML, served(`{"nosuch":["disk"]}`),
			kubevirt.ErrInvalid, codes.InvalidArgument, []string{`volume "nosuch"`, kubevirt.AnnotationEndpointDisks}},
		{"bad disk name", domainXML, served(`{"rootdisk":["disk","../x"]}`),
			kubevirt.ErrInvalid, codes.InvalidArgument, []string{`disk name "../x"`}},
		{"not JSON", domainXML, served(`{"rootdisk":`),
			kubevirt.ErrInvalid, codes.InvalidArgument, []string{kubevirt.AnnotationEndpointDisks}},
		{"socket path too long", strings.ReplaceAll(domainXML, "rootdisk", long), strings.ReplaceAll(served(`{"rootdisk":["disk","data","logs"]}`), "rootdisk", long),
			kubevirt.ErrInvalid, codes.InvalidArgument, []string{"108 bytes", "at most 107", "shorter name"}},
		{"serial already on a disk", strings.Replace(domainXML, `<alias name="ua-scratch"></alias>`, `<alias name="ua-scratch"></alias><serial>logs</serial>`, 1),
			served(`{"rootdisk":["disk","data","logs"]}`),
			kubevirt.ErrDuplicate, codes.InvalidArgument, []string{`serial "logs"`, "scratch"}},
		{"Block-mode PVC", strings.Replace(domainXML, `<disk device="disk" type="file" model="virtio-non-transitional">
      <source file="/var/run/kubevirt-private/vmi-disks/rootdisk/disk.img"></source>`, `<disk device="disk" type="block" model="virtio-non-transitional">
      <source dev="/dev/rootdisk"></source>`, 1), served(`{"rootdisk":["disk"]}`),
			kubevirt.ErrUnsupported, codes.FailedPrecondition, []string{"volume rootdisk", "Filesystem-mode"}},
		{"bad reconnect delay", domainXML, strings.Replace(served(`{"rootdisk":["disk","data","logs"]}`), `"kubevirt.io/latest`, `"quiver.io/reconnect-delay": "0", "kubevirt.io/latest`, 1),
			kubevirt.ErrInvalid, codes.InvalidArgument, []string{kubevirt.AnnotationReconnectDelay, "whole seconds"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			vmi, err := kubevirt.DecodeVMI([]byte(tc.vmi))
			if err != nil {
				t.Fatal(err)
			}
			_, err = AddDisks([]byte(tc.domain), vmi, Options{})
			if !errors.Is(err, tc.sentinel) {
				t.Fatalf("err = %v, want %v", err, tc.sentinel)
			}
			for _, m := range tc.mentioned {
				if !strings.Contains(err.Error(), m) {
					t.Errorf("error %q does not mention %q", err, m)
				}
			}
			conn := serve(t, Options{})
			res, err := v1alpha3.NewCallbacksClient(conn).OnDefineDomain(t.Context(),
				&v1alpha3.OnDefineDomainParams{DomainXML: []byte(tc.domain), Vmi: []byte(tc.vmi)})
			if status.Code(err) != tc.code || res != nil {
				t.Fatalf("over gRPC: %v (result %v), want code %v", err, res, tc.code)
			}
		})
	}
}

// TestHookVMIAsLauncherSendsIt: virt-launcher turns a Filesystem PVC into a
// hostDisk volume (the PVC's disk.img) before it calls the hooks, so the
// VMI the hook gets has no persistentVolumeClaim: the hook accepts that
// volume for each annotation, as KubeVirt v1.6.0 sends it (TestKubeVirt
// found it refused: "names volume root, which is not a PVC").
func TestHookVMIAsLauncherSendsIt(t *testing.T) {
	domainXML := readFixture(t, "domain.xml")
	pvc := `{"name": "rootdisk", "persistentVolumeClaim": {"claimName": "vm1-disks"}}`
	launcher := `{"name": "rootdisk", "hostDisk": {"path": "/var/run/kubevirt-private/vmi-disks/rootdisk/disk.img", "type": "DiskOrCreate", "capacity": "1Gi"}}`
	raw := string(readFixture(t, "vmi.json"))
	if !strings.Contains(raw, pvc) {
		t.Fatal("the fixture's rootdisk volume is not the PVC this test replaces")
	}
	for _, served := range []bool{false, true} {
		vmi, err := kubevirt.DecodeVMI([]byte(strings.Replace(raw, pvc, launcher, 1)))
		if err != nil {
			t.Fatal(err)
		}
		if served {
			delete(vmi.Metadata.Annotations, kubevirt.AnnotationExtraDisks)
			vmi.Metadata.Annotations[kubevirt.AnnotationEndpointDisks] = `{"rootdisk":["disk","data","logs"]}`
		}
		out, err := AddDisks(domainXML, vmi, Options{})
		if err != nil {
			t.Fatalf("endpoint %v: %v", served, err)
		}
		want := domainXML
		if served {
			want = bytes.Replace(domainXML, []byte(filePrimary), []byte(strings.ReplaceAll(nbdPrimary, "DELAY", "60")), 1)
		}
		assertSameTree(t, want, out, 2)
	}
}
