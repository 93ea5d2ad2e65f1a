package kubevirt

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"regexp"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/quiverstorage/quiver/internal/api"
	"github.com/quiverstorage/quiver/internal/endpoint"
	"github.com/quiverstorage/quiver/internal/testfs"
	"github.com/quiverstorage/quiver/internal/testserver"
)

// TestLibvirtEndpointEveryDisk: the volume vm1 (disks disk, data, logs) is
// published by a compute node's endpoint (internal/endpoint, in process,
// with an attachment made through the API), and its directory is bound
// where KubeVirt's compute container has the PVC (a bind mount, as the CSI
// node plugin does), with the empty disk.img placeholder. The domain of
// KubeVirt's shape goes through the hook, which makes every disk an NBD disk
// on the endpoint's socket; libvirtd defines and starts it; the guest sees
// three disks by serial and writes a marker to each. The markers are read
// back through the quiver server's own exports: they are on the quiver
// disks, and the placeholder stays empty.
func TestLibvirtEndpointEveryDisk(t *testing.T) {
	if testing.Short() {
		t.Skip("boots a VM")
	}
	testfs.RequireRoot(t)
	for _, tool := range []string{"libvirtd", "virtlogd", "virsh", "qemu-system-x86_64", "qemu-img", "apt-get", "dpkg"} {
		testfs.RequireTool(t, tool)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 4*time.Minute)
	defer cancel()

	work, err := os.MkdirTemp("", "quiver-ep-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(work) })
	if err := os.Chmod(work, 0o755); err != nil {
		t.Fatal(err)
	}
	kernel, initrd := buildGuest(t, work, guestInit)

	pool := filepath.Join(work, "pool")
	if err := os.Mkdir(pool, 0o755); err != nil {
		t.Fatal(err)
	}
	srv := testserver.StartT(t, testserver.Binary(t, true), testserver.Options{Pool: pool, NBDTCP: true})
	spec := api.VolumeSpec{Name: "vm1", Capacity: diskSize * int64(len(disks))}
	for _, d := range disks {
		spec.Disks = append(spec.Disks, api.DiskSpec{Name: d, Size: diskSize})
	}
	if _, err := srv.API.CreateVolume(ctx, spec); err != nil {
		t.Fatal(err)
	}
	att, err := srv.API.Attach(ctx, "vm1", api.AttachmentSpec{Node: "compute-1"})
	if err != nil {
		t.Fatal(err)
	}

	// The compute node's endpoint, as `quiver endpoint` runs it.
	epLog := &testserver.LogBuffer{}
	ep, err := endpoint.Open(endpoint.Config{Root: filepath.Join(work, "endpoint"), Locator: endpoint.NewLocator(srv.API),
		Log: slog.New(slog.NewTextHandler(epLog, nil))})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ep.Close()
		// Its immutable placeholder would stop the removal of work.
		vols, _ := filepath.Glob(filepath.Join(work, "endpoint", "volumes", "*"))
		for _, v := range vols {
			_ = endpoint.RemovePlaceholder(v)
		}
		if t.Failed() {
			t.Logf("endpoint log:\n%s", testserver.Tail(epLog.String(), 60))
		}
	})
	pub := endpoint.Volume{Name: "vm1", Token: att.Token}
	for _, d := range disks {
		pub.Disks = append(pub.Disks, endpoint.Disk{Name: d, Size: diskSize})
	}
	published, err := ep.Publish(ctx, pub)
	if err != nil {
		t.Fatal(err)
	}
	// The endpoint made the placeholder KubeVirt needs; the CSI node
	// plugin's part is to bind the directory at the PVC's path in the pod.
	if fi, err := os.Stat(filepath.Join(published.Dir, endpoint.PlaceholderName)); err != nil || fi.Size() != 0 {
		t.Fatalf("the endpoint's placeholder: %v %v", fi, err)
	}
	pvc := filepath.Join(work, "vmi-disks", "rootdisk")
	if err := os.MkdirAll(pvc, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount(published.Dir, pvc, "", unix.MS_BIND, ""); err != nil {
		testfs.SkipOrFail(t, "bind mount %s on %s: %v", published.Dir, pvc, err)
	}
	t.Cleanup(func() {
		if err := unix.Unmount(pvc, unix.MNT_DETACH); err != nil {
			t.Errorf("unmount %s: %v", pvc, err)
		}
	})

	name := fmt.Sprintf("quiver-kubevirt-ep-%d", os.Getpid())
	console := filepath.Join(work, "console.log")
	domainXML := callHook(t, ctx, []byte(kubevirtDomain(name, kernel, initrd, console, filepath.Join(pvc, "disk.img"))), []byte(endpointVMIJSON))
	sock := filepath.Join(pvc, endpoint.SocketName)
	for _, d := range disks {
		want := fmt.Sprintf(`<source protocol="nbd" name="%s">`, d)
		if !bytes.Contains(domainXML, []byte(want)) || bytes.Count(domainXML, []byte(`socket="`+sock+`"`)) != len(disks) {
			t.Fatalf("the hook's domain has no %s on %s:\n%s", want, sock, domainXML)
		}
	}
	domainFile := filepath.Join(work, "domain.xml")
	if err := os.WriteFile(domainFile, domainXML, 0o644); err != nil {
		t.Fatal(err)
	}

	startLibvirt(t, ctx)
	virsh(t, ctx, "define", domainFile)
	t.Cleanup(func() {
		ctx := context.Background()
		_, _ = virshErr(ctx, "destroy", name)
		if _, err := virshErr(ctx, "undefine", name); err != nil {
			t.Errorf("virsh undefine: %v", err)
		}
	})
	virsh(t, ctx, "start", name)
	logReconnect(t, name)
	if err := waitShutOff(ctx, name); err != nil {
		b, _ := os.ReadFile(console)
		t.Fatalf("%v; console:\n%s\ndomain:\n%s", err, testserver.Tail(string(b), 60), domainXML)
	}
	b, _ := os.ReadFile(console)
	if !bytes.Contains(b, []byte(done)) {
		t.Fatalf("the guest did not finish; console:\n%s", testserver.Tail(string(b), 60))
	}
	logConsole(t, b)

	// Every marker on the quiver disk its serial names, read through the
	// server's NBD exports (not the endpoint's socket).
	want := map[string]string{"disk": "serial= dev=vda", "data": "serial=data dev=vdb", "logs": "serial=logs dev=vdc"}
	for _, d := range disks {
		got := readNBD(t, ctx, srv, "vm1/"+d)
		marker, _, _ := bytes.Cut(got, []byte("\n"))
		if string(marker) != "quiver-marker "+want[d] {
			t.Errorf("disk %s through NBD starts %q, want %q", d, marker, "quiver-marker "+want[d])
		}
	}
	if fi, err := os.Stat(filepath.Join(pvc, "disk.img")); err != nil || fi.Size() != 0 {
		t.Errorf("the placeholder disk.img: %v, size %d; want it empty", err, fi.Size())
	}
}

// logReconnect logs whether libvirt gave QEMU the reconnect delay: libvirt
// 9.0 (Debian bookworm) predates <reconnect> in an NBD source and drops it
// without a word; newer libvirt passes it as reconnect-delay.
func logReconnect(t *testing.T, name string) {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("/var/log/libvirt/qemu", name+".log"))
	if err != nil {
		t.Logf("QEMU's command line: %v", err)
		return
	}
	m := regexp.MustCompile(`"reconnect-delay":[0-9]+`).FindAll(b, -1)
	if len(m) == 0 {
		t.Logf("libvirt passed no reconnect-delay to QEMU (libvirt 9.0 drops <reconnect> of an NBD source)")
		return
	}
	t.Logf("QEMU's NBD disks: %s", bytes.Join(m, []byte(", ")))
}
