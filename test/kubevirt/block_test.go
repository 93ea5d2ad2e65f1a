package kubevirt

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	mount "k8s.io/mount-utils"

	"github.com/quiverstorage/quiver/internal/api"
	"github.com/quiverstorage/quiver/internal/blockdev"
	"github.com/quiverstorage/quiver/internal/endpoint"
	"github.com/quiverstorage/quiver/internal/kubevirt"
	"github.com/quiverstorage/quiver/internal/testfs"
	"github.com/quiverstorage/quiver/internal/testserver"
)

// TestLibvirtEndpointBlock is TestLibvirtEndpointEveryDisk for a
// Block-mode PVC: the volume vm1 (disks disk, data, logs) is published by
// an in-process endpoint, and the PVC's device is made as the CSI node
// plugin makes it, through the endpoint's device agent on its control
// socket: nbdfuse on the @disks export and a loop device over it, disk i
// at i*endpoint.SlotSize. The device node KubeVirt gives the compute
// container (/dev/<volume>) is a node made with the loop device's numbers.
// The domain of KubeVirt's shape for a Block PVC (one block disk, alias
// ua-rootdisk) and a VMI with the quiver.io/block-disks layout go through
// the hook over gRPC; libvirtd defines and starts the result, so libvirt
// 9.0 must accept <slices> on block sources with <shareable/>, and QEMU's
// image locking three nodes of one device opened for writing. The guest
// writes a marker naming its serial to every disk; read back through the
// server's own exports, each marker is on the disk its serial names.
func TestLibvirtEndpointBlock(t *testing.T) {
	if testing.Short() {
		t.Skip("boots a VM")
	}
	testfs.RequireRoot(t)
	for _, tool := range []string{"libvirtd", "virtlogd", "virsh", "qemu-system-x86_64", "qemu-img", "apt-get", "dpkg",
		"nbdfuse", "losetup"} {
		testfs.RequireTool(t, tool)
	}
	if _, err := os.Stat("/dev/fuse"); err != nil {
		testfs.SkipOrFail(t, "no /dev/fuse: %v", err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Minute)
	defer cancel()

	work, err := os.MkdirTemp("", "quiver-epb-") // short: unix socket paths
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

	// The compute node's endpoint with its device agent on the control
	// socket, as `quiver endpoint --fuse-root` serves them.
	_, ctl := startEndpoint(t, work, "endpoint", srv)
	pub := endpoint.Volume{Name: "vm1", Token: att.Token}
	for _, d := range disks {
		pub.Disks = append(pub.Disks, endpoint.Disk{Name: d, Size: diskSize})
	}
	published, err := ctl.Publish(ctx, pub)
	if err != nil {
		t.Fatal(err)
	}

	// The CSI node plugin's staging of a Block PVC: the device of every
	// disk, held by the endpoint.
	fuseDir := filepath.Join(work, "fuse", "vm1")
	uri := "nbd+unix:///" + endpoint.DisksExport + "?socket=" + published.Socket
	loop, pid, err := ctl.Attach(ctx, fuseDir, endpoint.DisksExport, uri, false)
	if err != nil {
		t.Fatalf("the endpoint's device of %s: %v", uri, err)
	}
	t.Cleanup(func() {
		if err := ctl.Detach(context.Background(), fuseDir, endpoint.DisksExport, loop, pid); err != nil {
			t.Errorf("detach %s: %v", loop, err)
		}
	})
	var st unix.Stat_t
	if err := unix.Stat(loop, &st); err != nil {
		t.Fatal(err)
	}
	sectors, err := os.ReadFile(filepath.Join("/sys/class/block", filepath.Base(loop), "size"))
	if err != nil {
		t.Fatal(err)
	}
	if want := fmt.Sprint(int64(len(disks)) * endpoint.SlotSize / 512); strings.TrimSpace(string(sectors)) != want {
		t.Fatalf("%s has %s sectors, want %s", loop, strings.TrimSpace(string(sectors)), want)
	}
	// KubeVirt's /dev/<volume> in the compute container: a node of the
	// PVC's device.
	devDir := filepath.Join(work, "dev")
	if err := os.Mkdir(devDir, 0o755); err != nil {
		t.Fatal(err)
	}
	dev := filepath.Join(devDir, "rootdisk")
	if err := unix.Mknod(dev, unix.S_IFBLK|0o660, int(st.Rdev)); err != nil {
		testfs.SkipOrFail(t, "mknod %s: %v", dev, err)
	}

	layout := kubevirt.BlockDisks{"rootdisk": nil}
	for _, d := range disks {
		layout["rootdisk"] = append(layout["rootdisk"], kubevirt.BlockDisk{Name: d, Size: diskSize})
	}
	vmi := blockVMI(t, layout)
	name := fmt.Sprintf("quiver-kubevirt-block-%d", os.Getpid())
	console := filepath.Join(work, "console.log")
	domainXML := callHook(t, ctx, []byte(kubevirtBlockDomain(t, name, kernel, initrd, console, dev)), vmi)
	for i, d := range disks {
		want := fmt.Sprintf(`<slice type="storage" offset="%d" size="%d">`, int64(i)*endpoint.SlotSize, diskSize)
		if !bytes.Contains(domainXML, []byte(want)) {
			t.Fatalf("the hook's domain has no %s for %s:\n%s", want, d, domainXML)
		}
	}
	if n := bytes.Count(domainXML, []byte(`<source dev="`+dev+`">`)); n != len(disks) {
		t.Fatalf("the hook's domain has %d disks of %s, want %d:\n%s", n, dev, len(disks), domainXML)
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
	if _, err := virshErr(ctx, "start", name); err != nil {
		t.Fatalf("%v\nQEMU log:\n%s\ndomain:\n%s", err, tailFile(filepath.Join("/var/log/libvirt/qemu", name+".log")), domainXML)
	}
	logBlockdevs(t, name)
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
	// server's NBD exports (not the endpoint's socket or the device).
	want := map[string]string{"disk": "serial= dev=vda", "data": "serial=data dev=vdb", "logs": "serial=logs dev=vdc"}
	for _, d := range disks {
		got := readNBD(t, ctx, srv, "vm1/"+d)
		marker, _, _ := bytes.Cut(got, []byte("\n"))
		if string(marker) != "quiver-marker "+want[d] {
			t.Errorf("disk %s through NBD starts %q, want %q", d, marker, "quiver-marker "+want[d])
		}
	}
}

// startEndpoint opens an endpoint on work/<name> whose locator asks srv,
// and serves its control API with a device agent (nbdfuse and loop
// devices, FUSE directories under work/fuse) on work/<name>.sock, as
// `quiver endpoint` does. t.Cleanup closes both and removes the
// placeholders.
func startEndpoint(t *testing.T, work, name string, srv *testserver.Process) (*endpoint.Endpoint, *endpoint.Client) {
	t.Helper()
	log := &testserver.LogBuffer{}
	logger := slog.New(slog.NewTextHandler(log, nil)).With("endpoint", name)
	root := filepath.Join(work, name)
	ep, err := endpoint.Open(endpoint.Config{Root: root, Locator: endpoint.NewLocator(srv.API), Log: logger})
	if err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(work, name+".sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		ep.Close()
		t.Fatal(err)
	}
	agent := &blockdev.Agent{Root: filepath.Join(work, "fuse"), Devices: blockdev.NewNbdfuseLoop(mount.New("")), Log: logger}
	hs := &http.Server{Handler: ep.Handler(agent)}
	served := make(chan error, 1)
	go func() { served <- hs.Serve(ln) }()
	t.Cleanup(func() {
		_ = hs.Close()
		if err := <-served; err != http.ErrServerClosed {
			t.Errorf("endpoint %s control: %v", name, err)
		}
		ep.Close()
		// Its immutable placeholders would stop the removal of work.
		vols, _ := filepath.Glob(filepath.Join(root, "volumes", "*"))
		for _, v := range vols {
			_ = endpoint.RemovePlaceholder(v)
		}
		if t.Failed() {
			t.Logf("endpoint %s log:\n%s", name, testserver.Tail(log.String(), 60))
		}
	})
	return ep, endpoint.NewClient(sock)
}

// blockVMI is the VMI virt-launcher sends with the domain of a Block PVC:
// volume rootdisk is the PVC, annotated by the webhook with its layout and
// the hook sidecar.
func blockVMI(t *testing.T, layout kubevirt.BlockDisks) []byte {
	t.Helper()
	value, err := json.Marshal(layout)
	if err != nil {
		t.Fatal(err)
	}
	vmi := map[string]any{
		"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance",
		"metadata": map[string]any{"name": "vm1", "namespace": "default", "annotations": map[string]string{
			kubevirt.AnnotationBlockDisks:   string(value),
			kubevirt.AnnotationHookSidecars: `[{"image":"quiver:dev","args":["kubevirt-hook"]}]`,
		}},
		"spec": map[string]any{
			"domain":  map[string]any{"devices": map[string]any{"disks": []any{map[string]any{"name": "rootdisk", "disk": map[string]string{"bus": "virtio"}}}}},
			"volumes": []any{map[string]any{"name": "rootdisk", "persistentVolumeClaim": map[string]string{"claimName": "vm1-disks"}}},
		},
	}
	b, err := json.Marshal(vmi)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// kubevirtBlockDomain is kubevirtDomain with the primary disk as KubeVirt's
// converter writes it for a Block PVC: a block disk of the device dev.
func kubevirtBlockDomain(t *testing.T, name, kernel, initrd, console, dev string) string {
	t.Helper()
	file := fmt.Sprintf(`<disk device="disk" type="file" model="virtio-non-transitional">
      <source file="%s"></source>`, dev)
	block := fmt.Sprintf(`<disk device="disk" type="block" model="virtio-non-transitional">
      <source dev="%s"></source>`, dev)
	d := kubevirtDomain(name, kernel, initrd, console, dev)
	if !strings.Contains(d, file) {
		t.Fatalf("kubevirtDomain has no primary disk %s", file)
	}
	return strings.Replace(d, file, block, 1)
}

// logBlockdevs logs the -blockdev options libvirt gave QEMU for the
// device's slices (its command line, in the domain's QEMU log).
func logBlockdevs(t *testing.T, name string) {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("/var/log/libvirt/qemu", name+".log"))
	if err != nil {
		t.Logf("QEMU's command line: %v", err)
		return
	}
	for _, field := range strings.Fields(string(b)) {
		if strings.Contains(field, `"driver":"host_device"`) || strings.Contains(field, `"offset":`) || strings.Contains(field, "share-rw") {
			t.Logf("QEMU: %s", strings.Trim(field, `'\`))
		}
	}
}
