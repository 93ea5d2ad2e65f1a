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

	"github.com/quiverstorage/quiver/internal/endpoint"
	"github.com/quiverstorage/quiver/internal/kubevirt"
	"github.com/quiverstorage/quiver/internal/kubevirt/hookapi/v1alpha3"
	"github.com/quiverstorage/quiver/internal/testfs"
)

// fakeEndpoint makes root/<dir> as the CSI node plugin shows a volume
// published by the compute node's endpoint: an empty disk.img placeholder
// and a manifest listing disks (no socket: the hook does not connect).
func fakeEndpoint(t *testing.T, root, dir string, disks ...string) {
	t.Helper()
	d := filepath.Join(root, dir)
	if err := os.MkdirAll(d, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(d, "disk.img"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	m := endpoint.Manifest{Volume: "pvc-1234", Socket: endpoint.SocketName}
	for _, n := range disks {
		m.Disks = append(m.Disks, endpoint.Disk{Name: n, Size: 1 << 20})
	}
	b, err := json.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(d, endpoint.ManifestName), b, 0o644); err != nil {
		t.Fatal(err)
	}
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

// TestHookEndpoint: a volume whose disk.img lies in the endpoint's
// directory gets every disk on the endpoint's NBD socket, with and without
// the extra-disks annotation: the primary is rewritten in place (target,
// boot order, alias kept; io dropped), the extras are NBD disks named by
// disk with serial = disk name; the other volumes and every other element
// stay as KubeVirt wrote them, and libvirt's schema accepts the result.
func TestHookEndpoint(t *testing.T) {
	domainXML := readFixture(t, "domain.xml")
	if !bytes.Contains(domainXML, []byte(filePrimary)) {
		t.Fatal("the fixture's primary disk is not filePrimary")
	}
	for _, tc := range []struct {
		name   string
		noAnno bool
		delay  string // the reconnect-delay annotation, "" none
		extras []string
	}{
		{name: "annotated", extras: []string{"data", "logs"}},
		{name: "annotated, reconnect delay set", delay: "90", extras: []string{"data", "logs"}},
		{name: "no annotation", noAnno: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			vmi, err := kubevirt.DecodeVMI(readFixture(t, "vmi.json"))
			if err != nil {
				t.Fatal(err)
			}
			if tc.noAnno {
				delete(vmi.Metadata.Annotations, kubevirt.AnnotationExtraDisks)
			}
			wantDelay := "60"
			if tc.delay != "" {
				vmi.Metadata.Annotations[kubevirt.AnnotationReconnectDelay] = tc.delay
				wantDelay = tc.delay
			}
			root := t.TempDir()
			fakeEndpoint(t, root, pvcDir, "disk", "data", "logs")
			out, err := AddDisks(domainXML, vmi, Options{Root: root})
			if err != nil {
				t.Fatal(err)
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
	vmi, err := kubevirt.DecodeVMI(readFixture(t, "vmi.json"))
	if err != nil {
		t.Fatal(err)
	}
	delete(vmi.Metadata.Annotations, kubevirt.AnnotationExtraDisks)
	root := t.TempDir()
	fakeEndpoint(t, root, pvcDir, "disk")
	out, err := AddDisks(domainXML, vmi, Options{Root: root, Volume: "scratch"})
	if err != nil || !bytes.Equal(out, domainXML) {
		t.Fatalf("the scratch sidecar: err %v, changed %v", err, !bytes.Equal(out, domainXML))
	}
	out, err = AddDisks(domainXML, vmi, Options{Root: root, Volume: "rootdisk"})
	if err != nil {
		t.Fatal(err)
	}
	assertSameTree(t, bytes.Replace(domainXML, []byte(filePrimary), []byte(strings.ReplaceAll(nbdPrimary, "DELAY", "60")), 1), out, 0)
}

// TestHookWithoutEndpoint: without a manifest, a primary beside which the
// disk files lie stays a file disk and the extras are files: the endpoint
// path is taken only on the manifest's word.
func TestHookWithoutEndpoint(t *testing.T) {
	domainXML := readFixture(t, "domain.xml")
	vmi, err := kubevirt.DecodeVMI(readFixture(t, "vmi.json"))
	if err != nil {
		t.Fatal(err)
	}
	root := fakePVC(t, "disk", "data", "logs")
	out, err := AddDisks(domainXML, vmi, Options{Root: root})
	if err != nil {
		t.Fatal(err)
	}
	assertSameTree(t, domainXML, out, 2)
	if bytes.Contains(out, []byte("nbd")) {
		t.Errorf("an NBD disk without an endpoint:\n%s", out)
	}
	delete(vmi.Metadata.Annotations, kubevirt.AnnotationExtraDisks)
	out, err = AddDisks(domainXML, vmi, Options{Root: root})
	if err != nil || !bytes.Equal(out, domainXML) {
		t.Fatalf("no annotation, no endpoint: err %v, changed %v", err, !bytes.Equal(out, domainXML))
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
	root := t.TempDir()
	dir := strings.Replace(pvcDir, "rootdisk", name, 1)
	fakeEndpoint(t, root, dir, "disk", "data", "logs")
	out, err := AddDisks([]byte(domainXML), vmi, Options{Root: root})
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
	// A 63-byte volume name, the longest DNS label: its socket path is
	// /var/run/kubevirt-private/vmi-disks/<63>/nbd.sock, 108 bytes.
	long := "rootdisk-" + strings.Repeat("x", 63-len("rootdisk-"))
	longDir := strings.Replace(pvcDir, "rootdisk", long, 1)
	for _, tc := range []struct {
		name      string
		domain    string
		vmi       string
		dir       string
		manifest  []string // disks; nil: a manifest that is not JSON
		sentinel  error
		code      codes.Code
		mentioned []string
	}{
		{"extra disk not in the manifest", domainXML, vmiJSON, pvcDir, []string{"disk", "data"},
			kubevirt.ErrMissingDisk, codes.NotFound, []string{"volume rootdisk has no disk logs", endpoint.ManifestName}},
		{"no primary in the manifest", domainXML, vmiJSON, pvcDir, []string{"data", "logs"},
			kubevirt.ErrMissingDisk, codes.NotFound, []string{`lists no disk "disk"`, "placeholder"}},
		{"no primary in the manifest, no annotation", domainXML, strings.Replace(vmiJSON, `"quiver.io/extra-disks"`, `"x"`, 1), pvcDir, []string{"data"},
			kubevirt.ErrMissingDisk, codes.NotFound, []string{`lists no disk "disk"`}},
		{"socket path too long", strings.ReplaceAll(domainXML, "rootdisk", long), strings.ReplaceAll(vmiJSON, "rootdisk", long), longDir, []string{"disk", "data", "logs"},
			kubevirt.ErrInvalid, codes.InvalidArgument, []string{"108 bytes", "at most 107", "shorter name"}},
		{"manifest not JSON", domainXML, vmiJSON, pvcDir, nil,
			kubevirt.ErrInvalid, codes.InvalidArgument, []string{"endpoint manifest"}},
		{"bad reconnect delay", domainXML, strings.Replace(vmiJSON, `"kubevirt.io/latest`, `"quiver.io/reconnect-delay": "0", "kubevirt.io/latest`, 1), pvcDir, []string{"disk", "data", "logs"},
			kubevirt.ErrInvalid, codes.InvalidArgument, []string{kubevirt.AnnotationReconnectDelay, "whole seconds"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			root := t.TempDir()
			fakeEndpoint(t, root, tc.dir, tc.manifest...)
			if tc.manifest == nil {
				if err := os.WriteFile(filepath.Join(root, tc.dir, endpoint.ManifestName), []byte("{"), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			vmi, err := kubevirt.DecodeVMI([]byte(tc.vmi))
			if err != nil {
				t.Fatal(err)
			}
			_, err = AddDisks([]byte(tc.domain), vmi, Options{Root: root})
			if !errors.Is(err, tc.sentinel) {
				t.Fatalf("err = %v, want %v", err, tc.sentinel)
			}
			for _, m := range tc.mentioned {
				if !strings.Contains(err.Error(), m) {
					t.Errorf("error %q does not mention %q", err, m)
				}
			}
			conn := serve(t, Options{Root: root})
			res, err := v1alpha3.NewCallbacksClient(conn).OnDefineDomain(t.Context(),
				&v1alpha3.OnDefineDomainParams{DomainXML: []byte(tc.domain), Vmi: []byte(tc.vmi)})
			if status.Code(err) != tc.code || res != nil {
				t.Fatalf("over gRPC: %v (result %v), want code %v", err, res, tc.code)
			}
		})
	}
}
