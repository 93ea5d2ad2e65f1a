package hook

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"libvirt.org/go/libvirtxml"

	"github.com/quiverstorage/quiver/internal/kubevirt"
	"github.com/quiverstorage/quiver/internal/kubevirt/hookapi/info"
	"github.com/quiverstorage/quiver/internal/kubevirt/hookapi/v1alpha2"
	"github.com/quiverstorage/quiver/internal/kubevirt/hookapi/v1alpha3"
	"github.com/quiverstorage/quiver/internal/testfs"
)

const pvcDir = "/var/run/kubevirt-private/vmi-disks/rootdisk"

func readFixture(t *testing.T, name string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", name))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// serve starts a Server on a unix socket and returns a client connection
// to it, as virt-launcher dials one.
func serve(t *testing.T, opts Options) *grpc.ClientConn {
	t.Helper()
	sock := filepath.Join(t.TempDir(), "hooks", "quiver.sock")
	s := NewServer(Config{Socket: sock, Options: opts})
	if err := s.Listen(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Serve(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Serve: %v", err)
		}
		if _, err := os.Stat(sock); !os.IsNotExist(err) {
			t.Errorf("socket %s left behind: %v", sock, err)
		}
	})
	conn, err := grpc.NewClient("unix://"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

// TestHookOverTheWire calls Info and OnDefineDomain (v1alpha3 and v1alpha2)
// over a unix socket with a KubeVirt-shaped domain and VMI: the output holds
// every disk of the volume, with the primary's driver settings, serial =
// disk name and fresh targets, and libvirt's schema accepts input and
// output.
func TestHookOverTheWire(t *testing.T) {
	domainXML, vmiJSON := readFixture(t, "domain.xml"), readFixture(t, "vmi.json")
	conn := serve(t, Options{})
	ctx := t.Context()

	res, err := info.NewInfoClient(conn).Info(ctx, &info.InfoParams{})
	if err != nil {
		t.Fatalf("Info: %v", err)
	}
	if res.GetName() != Name || strings.Join(res.GetVersions(), ",") != "v1alpha3,v1alpha2" ||
		len(res.GetHookPoints()) != 1 || res.GetHookPoints()[0].GetName() != "OnDefineDomain" {
		t.Fatalf("Info = %v", res)
	}

	r3, err := v1alpha3.NewCallbacksClient(conn).OnDefineDomain(ctx, &v1alpha3.OnDefineDomainParams{DomainXML: domainXML, Vmi: vmiJSON})
	if err != nil {
		t.Fatalf("v1alpha3 OnDefineDomain: %v", err)
	}
	r2, err := v1alpha2.NewCallbacksClient(conn).OnDefineDomain(ctx, &v1alpha2.OnDefineDomainParams{DomainXML: domainXML, Vmi: vmiJSON})
	if err != nil {
		t.Fatalf("v1alpha2 OnDefineDomain: %v", err)
	}
	if !bytes.Equal(r3.GetDomainXML(), r2.GetDomainXML()) {
		t.Error("v1alpha2 and v1alpha3 return different domains")
	}
	out := r3.GetDomainXML()

	var dom libvirtxml.Domain
	if err := dom.Unmarshal(string(out)); err != nil {
		t.Fatal(err)
	}
	type want struct{ file, dev, serial, alias string }
	wantDisks := []want{
		{pvcDir + "/disk.img", "vda", "", "ua-rootdisk"},
		{"/var/run/kubevirt-private/vmi-disks/scratch/disk.img", "vdb", "", "ua-scratch"},
		{"/var/run/kubevirt-ephemeral-disks/cloud-init-data/default/vm1/noCloud.iso", "vdc", "", "ua-cloudinitdisk"},
		{pvcDir + "/data.img", "vdd", "data", ""},
		{pvcDir + "/logs.img", "vde", "logs", ""},
	}
	if len(dom.Devices.Disks) != len(wantDisks) {
		t.Fatalf("%d disks, want %d:\n%s", len(dom.Devices.Disks), len(wantDisks), out)
	}
	primary := dom.Devices.Disks[0]
	for i, w := range wantDisks {
		d := dom.Devices.Disks[i]
		alias := ""
		if d.Alias != nil {
			alias = d.Alias.Name
		}
		got := want{d.Source.File.File, d.Target.Dev, d.Serial, alias}
		if got != w {
			t.Errorf("disk %d = %+v, want %+v", i, got, w)
		}
		if i < 3 {
			continue
		}
		if !reflect.DeepEqual(d.Driver, primary.Driver) || d.Model != primary.Model || d.Target.Bus != "virtio" || d.Boot != nil || d.Source.File == nil {
			t.Errorf("disk %s: driver %+v model %q bus %q boot %v, want the primary's driver %+v, model %q, virtio, no boot order",
				d.Serial, *d.Driver, d.Model, d.Target.Bus, d.Boot, *primary.Driver, primary.Model)
		}
	}
	if primary.Boot == nil || primary.Boot.Order != 1 {
		t.Errorf("primary boot order lost: %+v", primary.Boot)
	}
	assertSameTree(t, domainXML, out, 2) // the input's elements all kept; two disks added

	testfs.RequireTool(t, "virt-xml-validate")
	for name, b := range map[string][]byte{"input": domainXML, "output": out} {
		f := filepath.Join(t.TempDir(), name+".xml")
		if err := os.WriteFile(f, b, 0o644); err != nil {
			t.Fatal(err)
		}
		if msg, err := exec.Command("virt-xml-validate", f, "domain").CombinedOutput(); err != nil {
			t.Errorf("virt-xml-validate %s: %v\n%s", name, err, msg)
		}
	}
}

// TestHookUnknownVersion: a Callbacks version the hook does not serve is
// refused as Unimplemented, naming the service, so virt-launcher fails the
// VM instead of defining it without the hook.
func TestHookUnknownVersion(t *testing.T) {
	conn := serve(t, Options{})
	err := conn.Invoke(t.Context(), "/kubevirt.hooks.v1alpha1.Callbacks/OnDefineDomain",
		&v1alpha3.OnDefineDomainParams{}, &v1alpha3.OnDefineDomainResult{})
	if status.Code(err) != codes.Unimplemented || !strings.Contains(err.Error(), "kubevirt.hooks.v1alpha1.Callbacks") {
		t.Fatalf("v1alpha1 call: %v, want Unimplemented naming kubevirt.hooks.v1alpha1.Callbacks", err)
	}
}

// TestHookWithoutAnnotation: a VMI without quiver's annotation gets its
// domain back byte for byte.
func TestHookWithoutAnnotation(t *testing.T) {
	domainXML := readFixture(t, "domain.xml")
	out, err := AddDisks(domainXML, kubevirt.VMI{}, Options{})
	if err != nil || !bytes.Equal(out, domainXML) {
		t.Fatalf("AddDisks without annotation: err %v, changed %v", err, !bytes.Equal(out, domainXML))
	}
}
