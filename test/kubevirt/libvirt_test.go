package kubevirt

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/quiverstorage/quiver/internal/api"
	"github.com/quiverstorage/quiver/internal/kubevirt/hook"
	"github.com/quiverstorage/quiver/internal/kubevirt/hookapi/v1alpha3"
	"github.com/quiverstorage/quiver/internal/testfs"
	"github.com/quiverstorage/quiver/internal/testguest"
	"github.com/quiverstorage/quiver/internal/testserver"
)

func TestMain(m *testing.M) { os.Exit(testserver.Main(m)) }

// disks are the quiver volume's disks: "disk" is the one KubeVirt boots
// (disk.img), the others reach the VM only through the hook.
var disks = []string{"disk", "data", "logs"}

const (
	diskSize = 8 << 20
	libvirt  = "qemu:///system"
	// done is what the guest prints once every marker is written.
	done = "quiver-test: markers written"
)

var guestKernel = testguest.KernelSpec{
	Modules: []string{"virtio_pci", "virtio_blk"},
	Config:  map[string][]string{"CONFIG_VIRTIO_PCI": {"y", "m"}, "CONFIG_VIRTIO_BLK": {"y", "m"}},
}

// guestInit lists the virtio disks with their serials (the attribute udev
// makes /dev/disk/by-id/virtio-<serial> from), writes a marker naming the
// serial and the device to the first sector of each, and powers off.
const guestInit = `
for b in /sys/block/vd*; do
	d=${b##*/}
	s=$(cat $b/serial 2>/dev/null)
	echo "quiver-test: disk $d serial '$s'"
	printf 'quiver-marker serial=%s dev=%s\n' "$s" "$d" | dd of=/dev/$d bs=512 count=1 conv=sync 2>/dev/null || echo "quiver-test: write to $d failed"
done
sync
echo "` + done + `"
poweroff -f
`

// TestLibvirtBootsEveryDisk is the test of the package comment.
func TestLibvirtBootsEveryDisk(t *testing.T) {
	if testing.Short() {
		t.Skip("boots a VM")
	}
	testfs.RequireRoot(t)
	for _, tool := range []string{"libvirtd", "virtlogd", "virsh", "qemu-system-x86_64", "qemu-img", "apt-get", "dpkg"} {
		testfs.RequireTool(t, tool)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 4*time.Minute)
	defer cancel()

	g := setupDomain(t, ctx, "quiver-kubevirt-test", guestInit, false)

	startLibvirt(t, ctx)
	virsh(t, ctx, "define", g.domainFile)
	t.Cleanup(func() {
		ctx := context.Background()
		_, _ = virshErr(ctx, "destroy", g.name)
		if _, err := virshErr(ctx, "undefine", g.name); err != nil {
			t.Errorf("virsh undefine: %v", err)
		}
	})
	virsh(t, ctx, "start", g.name)
	if err := waitShutOff(ctx, g.name); err != nil {
		b, _ := os.ReadFile(g.console)
		t.Fatalf("%v; console:\n%s\ndomain:\n%s", err, testserver.Tail(string(b), 60), g.domain)
	}
	b, _ := os.ReadFile(g.console)
	if !bytes.Contains(b, []byte(done)) {
		t.Fatalf("the guest did not finish; console:\n%s", testserver.Tail(string(b), 60))
	}
	logConsole(t, b)

	// Every marker on the disk its serial names, read through NBD.
	want := map[string]string{"disk": "serial= dev=vda", "data": "serial=data dev=vdb", "logs": "serial=logs dev=vdc"}
	for _, d := range disks {
		got := readNBD(t, ctx, g.srv, "vm1/"+d)
		marker, _, _ := bytes.Cut(got, []byte("\n"))
		if string(marker) != "quiver-marker "+want[d] {
			t.Errorf("disk %s through NBD starts %q, want %q", d, marker, "quiver-marker "+want[d])
		}
	}
}

// guestDomain is what both tests start from: a work directory, a real
// server whose pool holds volume vm1 with the disks of disks, and the
// domain KubeVirt would define for it, through the hook.
type guestDomain struct {
	work       string // readable by the libvirt-qemu user
	srv        *testserver.Process
	volPath    string // vm1's directory in the pool
	name       string // the domain's name
	console    string // the guest's console file
	domain     []byte // the hook's output
	domainFile string // domain, written for virsh
}

// setupDomain builds a guest whose init runs script, starts the server,
// creates vm1 and passes the domain of name prefix-<pid> through the hook.
// With appendConsole the console file is opened for append (two QEMUs,
// one file).
func setupDomain(t *testing.T, ctx context.Context, prefix, script string, appendConsole bool) *guestDomain {
	t.Helper()
	// Everything QEMU opens lives under one directory the libvirt-qemu user
	// can traverse (t.TempDir's are 0700, and root's home is closed).
	work, err := os.MkdirTemp("", prefix+"-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(work) })
	if err := os.Chmod(work, 0o755); err != nil {
		t.Fatal(err)
	}

	kernel, initrd := buildGuest(t, work, script)

	// The quiver volume, in a real server's pool.
	pool := filepath.Join(work, "pool")
	if err := os.Mkdir(pool, 0o755); err != nil {
		t.Fatal(err)
	}
	srv := testserver.StartT(t, testserver.Binary(t, true), testserver.Options{Pool: pool})
	spec := api.VolumeSpec{Name: "vm1", Capacity: diskSize * int64(len(disks))}
	for _, d := range disks {
		spec.Disks = append(spec.Disks, api.DiskSpec{Name: d, Size: diskSize})
	}
	vol, err := srv.API.CreateVolume(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}

	// The domain KubeVirt would define, through the hook over gRPC.
	g := &guestDomain{work: work, srv: srv, volPath: vol.Path,
		name:    fmt.Sprintf("%s-%d", prefix, os.Getpid()),
		console: filepath.Join(work, "console.log")}
	domainXML := kubevirtDomain(g.name, kernel, initrd, g.console, filepath.Join(vol.Path, "disk.img"))
	if appendConsole {
		plain := fmt.Sprintf(`<source path="%s">`, g.console)
		if !strings.Contains(domainXML, plain) {
			t.Fatalf("no console source %s in the domain", plain)
		}
		domainXML = strings.Replace(domainXML, plain, fmt.Sprintf(`<source path="%s" append="on">`, g.console), 1)
	}
	g.domain = callHook(t, ctx, []byte(domainXML), []byte(vmiJSON))
	g.domainFile = filepath.Join(work, "domain.xml")
	if err := os.WriteFile(g.domainFile, g.domain, 0o644); err != nil {
		t.Fatal(err)
	}
	return g
}

// logConsole logs the guest's quiver-test: lines of console.
func logConsole(t *testing.T, console []byte) {
	t.Helper()
	for _, line := range strings.Split(string(console), "\n") {
		if strings.HasPrefix(line, "quiver-test:") {
			t.Log(strings.TrimSpace(line))
		}
	}
}

// buildGuest writes the guest's kernel and an initramfs whose init runs
// script into work (readable by the libvirt-qemu user), and returns their
// paths.
func buildGuest(t *testing.T, work, script string) (kernel, initrd string) {
	t.Helper()
	k, err := testguest.FetchKernel(guestKernel)
	if errors.Is(err, testguest.ErrMissing) {
		testfs.SkipOrFail(t, "%v", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	kernel, initrd = filepath.Join(work, "vmlinuz"), filepath.Join(work, "initramfs.cpio")
	if err := copyFile(k.VmlinuzPath(), kernel); err != nil {
		t.Fatal(err)
	}
	w, err := testguest.NewInitramfs(initrd, k)
	if errors.Is(err, testguest.ErrMissing) {
		testfs.SkipOrFail(t, "%v", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	w.File("init", 0o755, []byte("#!/bin/sh\nexport PATH=/bin\nmount -t devtmpfs devtmpfs /dev\nmount -t proc proc /proc\nmount -t sysfs sysfs /sys\n"+
		testguest.InsmodLines(k)+script))
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{kernel, initrd} {
		if err := os.Chmod(f, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return kernel, initrd
}

// vmiJSON is the VMI virt-launcher would send with the domain: volume
// rootdisk is the PVC, annotated as the webhook annotates it.
const vmiJSON = `{"apiVersion":"kubevirt.io/v1","kind":"VirtualMachineInstance",
"metadata":{"name":"vm1","namespace":"default","annotations":{"quiver.io/extra-disks":"{\"rootdisk\":[\"data\",\"logs\"]}"}},
"spec":{"domain":{"devices":{"disks":[{"name":"rootdisk","disk":{"bus":"virtio"}}]}},
"volumes":[{"name":"rootdisk","persistentVolumeClaim":{"claimName":"vm1-disks"}}]}}`

// endpointVMIJSON is vmiJSON as the webhook annotates it when the volume is
// a cluster's: the PVC's directory is the compute node's endpoint, and every
// disk, disk.img's too, reaches QEMU on its socket.
var endpointVMIJSON = strings.Replace(vmiJSON, `"quiver.io/extra-disks":"{\"rootdisk\":[\"data\",\"logs\"]}"`,
	`"quiver.io/endpoint-disks":"{\"rootdisk\":[\"disk\",\"data\",\"logs\"]}"`, 1)

// kubevirtDomain is a domain of the shape KubeVirt's converter writes for
// a VMI with one Filesystem PVC (internal/kubevirt/hook/testdata has the
// full shape), with what this test needs instead of KubeVirt's boot path:
// TCG, direct kernel boot, the console in a file.
func kubevirtDomain(name, kernel, initrd, console, primary string) string {
	return fmt.Sprintf(`<domain type="qemu">
  <name>%s</name>
  <memory unit="MiB">192</memory>
  <vcpu placement="static">1</vcpu>
  <iothreads>1</iothreads>
  <os>
    <type arch="x86_64" machine="q35">hvm</type>
    <kernel>%s</kernel>
    <initrd>%s</initrd>
    <cmdline>console=ttyS0 panic=-1 quiet</cmdline>
  </os>
  <features>
    <acpi></acpi>
  </features>
  <on_poweroff>destroy</on_poweroff>
  <on_reboot>destroy</on_reboot>
  <on_crash>destroy</on_crash>
  <devices>
    <controller type="usb" index="0" model="none"></controller>
    <controller type="virtio-serial" index="0" model="virtio-non-transitional"></controller>
    <disk device="disk" type="file" model="virtio-non-transitional">
      <source file="%s"></source>
      <target bus="virtio" dev="vda"></target>
      <driver cache="none" error_policy="stop" name="qemu" type="raw" iothread="1" io="native" discard="unmap"></driver>
      <alias name="ua-rootdisk"></alias>
      <boot order="1"></boot>
    </disk>
    <serial type="file">
      <source path="%s"></source>
      <target port="0"></target>
    </serial>
    <memballoon model="none"></memballoon>
  </devices>
</domain>
`, name, kernel, initrd, primary, console)
}

// callHook serves the hook on a unix socket and calls OnDefineDomain
// (v1alpha3) as virt-launcher does.
func callHook(t *testing.T, ctx context.Context, domainXML, vmi []byte) []byte {
	t.Helper()
	sock := testserver.SocketPath(t)
	s := hook.NewServer(hook.Config{Socket: sock})
	if err := s.Listen(); err != nil {
		t.Fatal(err)
	}
	sctx, stop := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- s.Serve(sctx) }()
	t.Cleanup(func() {
		stop()
		if err := <-served; err != nil {
			t.Errorf("hook: %v", err)
		}
	})
	conn, err := grpc.NewClient("unix://"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	res, err := v1alpha3.NewCallbacksClient(conn).OnDefineDomain(ctx, &v1alpha3.OnDefineDomainParams{DomainXML: domainXML, Vmi: vmi})
	if err != nil {
		t.Fatalf("OnDefineDomain: %v", err)
	}
	return res.GetDomainXML()
}

// startLibvirt starts virtlogd and libvirtd unless a libvirtd already
// answers; t.Cleanup stops what it started, by PID.
func startLibvirt(t *testing.T, ctx context.Context) {
	t.Helper()
	if _, err := virshErr(ctx, "version"); err == nil {
		t.Log("using the libvirtd that is running")
		return
	}
	dir := t.TempDir()
	for _, daemon := range []string{"virtlogd", "libvirtd"} {
		logFile, err := os.Create(filepath.Join(dir, daemon+".log"))
		if err != nil {
			t.Fatal(err)
		}
		cmd := exec.Command(daemon)
		cmd.Stdout, cmd.Stderr = logFile, logFile
		cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGTERM}
		if err := cmd.Start(); err != nil {
			t.Fatalf("start %s: %v", daemon, err)
		}
		exited := make(chan struct{})
		t.Cleanup(func() {
			go func() { _ = cmd.Wait(); close(exited) }()
			stopDaemon(cmd.Process, exited)
			logFile.Close()
			if t.Failed() {
				b, _ := os.ReadFile(logFile.Name())
				t.Logf("%s log:\n%s", daemon, testserver.Tail(string(b), 40))
			}
		})
	}
	for {
		if _, err := virshErr(ctx, "version"); err == nil {
			return
		}
		select {
		case <-ctx.Done():
			t.Fatalf("libvirtd did not answer on %s", libvirt)
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// stopDaemon sends p SIGTERM and waits until exited is closed; after 15
// seconds it kills p.
func stopDaemon(p *os.Process, exited <-chan struct{}) {
	_ = p.Signal(syscall.SIGTERM)
	select {
	case <-exited:
	case <-time.After(15 * time.Second):
		_ = p.Kill()
		<-exited
	}
}

func virsh(t *testing.T, ctx context.Context, args ...string) string {
	t.Helper()
	out, err := virshErr(ctx, args...)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func virshErr(ctx context.Context, args ...string) (string, error) {
	return virshAt(ctx, libvirt, args...)
}

// virshAt runs virsh against the libvirtd at uri.
func virshAt(ctx context.Context, uri string, args ...string) (string, error) {
	out, err := exec.CommandContext(ctx, "virsh", append([]string{"-c", uri}, args...)...).CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("virsh %s: %v: %s", strings.Join(args, " "), err, out)
	}
	return string(out), nil
}

// waitShutOff waits until the guest has powered off.
func waitShutOff(ctx context.Context, name string) error {
	for {
		out, err := virshErr(ctx, "domstate", name)
		if err == nil && strings.TrimSpace(out) == "shut off" {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("domain %s still %q: %w", name, strings.TrimSpace(out), ctx.Err())
		case <-time.After(500 * time.Millisecond):
		}
	}
}

// readNBD reads a disk's first 8 KiB (sectors 0 to 15) through quiver's
// NBD unix socket.
func readNBD(t *testing.T, ctx context.Context, srv *testserver.Process, export string) []byte {
	t.Helper()
	out := filepath.Join(t.TempDir(), "disk.raw")
	cmd := exec.CommandContext(ctx, "qemu-img", "convert", "-f", "raw", "-O", "raw", srv.UnixURI(export), out)
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("qemu-img convert %s: %v\n%s", export, err, b)
	}
	b, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	return b[:goOffset]
}

func copyFile(from, to string) error {
	b, err := os.ReadFile(from)
	if err != nil {
		return err
	}
	return os.WriteFile(to, b, 0o644)
}
