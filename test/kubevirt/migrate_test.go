package kubevirt

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/quiverstorage/quiver/internal/testfs"
	"github.com/quiverstorage/quiver/internal/testserver"
)

// migrationSubnet holds the two daemons' addresses (.1 and .2), inside the
// test's own network namespaces only.
const migrationSubnet = "10.79.0."

// goOffset is where the test writes goFlag on the primary disk once the
// migration is done: sector 16, in another 4 KiB page than the markers.
const (
	goOffset = 16 * 512
	goFlag   = "quiver-go"
	// The guest's console lines for each phase.
	phase1 = "quiver-test: phase 1 markers written"
	phase2 = "quiver-test: phase 2 markers written"
)

// migrationInit writes a marker naming the serial and the device to the
// first sector of every virtio disk (phase 1), then waits, idle but for a
// read of the primary disk each second, until goFlag is on it; then writes
// a second marker to the second sector of every disk (phase 2) and powers
// off. The test migrates the domain during the wait, so phase 2 is written
// by the destination's QEMU.
const migrationInit = `
markers() {
	for b in /sys/block/vd*; do
		d=${b##*/}
		s=$(cat $b/serial 2>/dev/null)
		echo "quiver-test: $1 disk $d serial '$s'"
		printf 'quiver-%s serial=%s dev=%s\n' "$1" "$s" "$d" | dd of=/dev/$d bs=512 seek=$2 count=1 conv=sync,notrunc,fsync 2>/dev/null || echo "quiver-test: write to $d failed"
	done
}
markers marker 0
echo "` + phase1 + `"
while :; do
	blockdev --flushbufs /dev/vda
	dd if=/dev/vda bs=512 skip=16 count=1 2>/dev/null | grep -q ` + goFlag + ` && break
	sleep 1
done
markers after-migration 1
sync
echo "` + phase2 + `"
poweroff -f
`

// TestLiveMigrationEveryDisk live-migrates a KubeVirt-shaped domain with all
// the disks of one quiver volume (the hook's output) between two libvirtd,
// each in its own network namespace (a veth pair between them carries the
// migration stream) and its own mount namespace (private /run/libvirt,
// /var/lib/libvirt, /etc/libvirt, /var/log/libvirt and /var/cache/libvirt),
// sharing only the volume's disks directory, as two nodes share an RWX PVC.
// The guest writes a marker to every disk on the source; after the
// migration, the destination's guest writes a second one to every disk.
// Read back through quiver's NBD export, every disk must hold both, with
// its own serial.
func TestLiveMigrationEveryDisk(t *testing.T) {
	if testing.Short() {
		t.Skip("boots and migrates a VM")
	}
	testfs.RequireRoot(t)
	for _, tool := range []string{"libvirtd", "virsh", "ip", "unshare", "mount", "hostname", "cp",
		"qemu-system-x86_64", "qemu-img", "apt-get", "dpkg"} {
		testfs.RequireTool(t, tool)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 8*time.Minute)
	defer cancel()

	// Both QEMUs append to one console file.
	g := setupDomain(t, ctx, "quiver-kubevirt-migration", migrationInit, true)
	name, console := g.name, g.console

	nsA, nsB := twoNamespaces(t)
	begin := time.Now()
	src := startPrivateLibvirt(t, g.work, "src", nsA)
	dst := startPrivateLibvirt(t, g.work, "dst", nsB)
	src.waitReady(t, ctx)
	dst.waitReady(t, ctx)
	t.Logf("both libvirtd answer after %v", time.Since(begin).Round(time.Millisecond))
	t.Cleanup(func() {
		for _, d := range []*privateLibvirt{src, dst} {
			_, _ = d.virshErr(context.Background(), "destroy", name)
		}
	})
	begin = time.Now()
	src.virsh(t, ctx, "create", g.domainFile)
	if err := waitConsole(ctx, console, phase1); err != nil {
		t.Fatalf("%v; console:\n%s", err, tailFile(console))
	}
	t.Logf("the guest wrote its phase 1 markers %v after virsh create", time.Since(begin).Round(time.Millisecond))

	// libvirt 9.0 calls any local filesystem unshared storage and refuses
	// the migration unless told it is safe (--unsafe): here both QEMUs run
	// on one kernel and open the images with cache=none.
	start := time.Now()
	out2, err := src.virshErr(ctx, "migrate", "--live", "--unsafe", "--verbose", name, dst.uri,
		"--migrateuri", "tcp://"+migrationSubnet+"2")
	if err != nil {
		t.Fatalf("%v; console:\n%s\nsource QEMU log:\n%s", err, tailFile(console), tailFile(src.qemuLog(name)))
	}
	took := time.Since(start)
	t.Logf("virsh migrate --live took %v: %s", took.Round(time.Millisecond), strings.TrimSpace(lastLine(out2)))
	if state := strings.TrimSpace(dst.virsh(t, ctx, "domstate", name)); state != "running" {
		t.Fatalf("the destination's domain is %q after the migration, want running", state)
	}
	if names := src.virsh(t, ctx, "list", "--all", "--name"); strings.Contains(names, name) {
		t.Fatalf("the source still lists the domain after the migration: %s", names)
	}

	// Tell the guest, now on the destination, to write phase 2.
	if err := writeAt(filepath.Join(g.volPath, "disk.img"), goOffset, []byte(goFlag+"\n")); err != nil {
		t.Fatal(err)
	}
	if err := waitConsole(ctx, console, phase2); err != nil {
		t.Fatalf("%v; console:\n%s\ndestination QEMU log:\n%s", err, tailFile(console), tailFile(dst.qemuLog(name)))
	}
	if err := dst.waitGone(ctx, name); err != nil {
		t.Fatal(err)
	}
	t.Logf("the guest wrote its phase 2 markers and powered off %v after the migration", time.Since(start).Round(time.Millisecond))
	b, _ := os.ReadFile(console)
	logConsole(t, b)

	// Both markers on the disk their serial names, read through NBD.
	dev := map[string]string{"disk": "serial= dev=vda", "data": "serial=data dev=vdb", "logs": "serial=logs dev=vdc"}
	for _, d := range disks {
		got := readNBD(t, ctx, g.srv, "vm1/"+d)
		for i, kind := range []string{"marker", "after-migration"} {
			want := "quiver-" + kind + " " + dev[d]
			line, _, _ := bytes.Cut(got[i*512:], []byte("\n"))
			if string(line) != want {
				t.Errorf("disk %s sector %d through NBD: %q, want %q", d, i, line, want)
			}
		}
	}
}

// twoNamespaces makes two network namespaces joined by a veth pair, with
// migrationSubnet .1 in the first and .2 in the second; t.Cleanup deletes
// them (after the daemons in them, registered later, are stopped).
func twoNamespaces(t *testing.T) (a, b string) {
	t.Helper()
	prefix := fmt.Sprintf("qkv%d-", os.Getpid())
	a, b = prefix+"a", prefix+"b"
	for _, ns := range []string{a, b} {
		if out, err := exec.Command("ip", "netns", "add", ns).CombinedOutput(); err != nil {
			testfs.SkipOrFail(t, "ip netns add: %v: %s", err, out)
		}
		t.Cleanup(func() {
			if out, err := exec.Command("ip", "netns", "del", ns).CombinedOutput(); err != nil {
				t.Errorf("ip netns del %s: %v: %s", ns, err, out)
			}
		})
	}
	run := func(args ...string) {
		t.Helper()
		if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
			t.Fatalf("ip %s: %v: %s", strings.Join(args, " "), err, out)
		}
	}
	run("link", "add", "mig0", "netns", a, "type", "veth", "peer", "name", "mig0", "netns", b)
	for i, ns := range []string{a, b} {
		run("-n", ns, "addr", "add", fmt.Sprintf("%s%d/24", migrationSubnet, i+1), "dev", "mig0")
		run("-n", ns, "link", "set", "mig0", "up")
		run("-n", ns, "link", "set", "lo", "up")
	}
	return a, b
}

// privateLibvirt is a libvirtd in a network namespace of the test, with
// its own libvirt directories.
type privateLibvirt struct {
	name   string
	dir    string // its directories: run, lib, etc, log, cache
	uri    string // its unix socket, reachable from the test's namespace
	pid    int    // libvirtd's, in its namespaces
	exited chan struct{}
}

// libvirtDirs are the directories each daemon gets its own copy of, bound
// over the system's in its mount namespace.
var libvirtDirs = map[string]string{
	"run": "/run/libvirt", "lib": "/var/lib/libvirt", "etc": "/etc/libvirt",
	"log": "/var/log/libvirt", "cache": "/var/cache/libvirt",
}

// qemuConf is added to each daemon's copy of qemu.conf. QEMU runs as root
// without relabelling (dynamic_ownership 0, no security driver), so that
// neither daemon changes the owner of images the other's QEMU has open;
// without cgroups, so that the two daemons' domains of the same name and
// ID do not share a cgroup; its console and log in files, without virtlogd.
const qemuConf = `
user = "root"
group = "root"
dynamic_ownership = 0
remember_owner = 0
security_driver = "none"
cgroup_controllers = [ ]
stdio_handler = "file"
`

// startPrivateLibvirt starts libvirtd in network namespace ns, in a new
// mount namespace (unshare, private propagation) where work/<name>'s
// directories replace libvirt's, and a new UTS namespace with its own
// hostname; its configuration is a copy of /etc/libvirt with its own host
// UUID (libvirt refuses to migrate to the host it runs on) and no
// autostarted network; its QEMU capabilities cache starts as a copy of the
// system's, if any, which spares it probing QEMU again. t.Cleanup stops it
// by PID.
func startPrivateLibvirt(t *testing.T, work, name, ns string) *privateLibvirt {
	t.Helper()
	dir := filepath.Join(work, name)
	d := &privateLibvirt{name: name, dir: dir, uri: "qemu+unix:///system?socket=" + filepath.Join(dir, "run", "libvirt-sock"),
		exited: make(chan struct{})}
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("cp", "-a", "/etc/libvirt", filepath.Join(dir, "etc")).CombinedOutput(); err != nil {
		t.Fatalf("copy /etc/libvirt: %v: %s", err, out)
	}
	autostart, _ := filepath.Glob(filepath.Join(dir, "etc", "qemu", "networks", "autostart", "*"))
	for _, f := range autostart {
		if err := os.Remove(f); err != nil {
			t.Fatal(err)
		}
	}
	uuid, err := os.ReadFile("/proc/sys/kernel/random/uuid")
	if err != nil {
		t.Fatal(err)
	}
	appendFile(t, filepath.Join(dir, "etc", "libvirtd.conf"), fmt.Sprintf("\nhost_uuid = %q\n", strings.TrimSpace(string(uuid))))
	appendFile(t, filepath.Join(dir, "etc", "qemu.conf"), qemuConf)
	var script strings.Builder
	fmt.Fprintf(&script, "set -e\nhostname %s\n", ns)
	for sub, target := range libvirtDirs {
		if sub != "etc" {
			if err := os.Mkdir(filepath.Join(dir, sub), 0o755); err != nil {
				t.Fatal(err)
			}
		}
		fmt.Fprintf(&script, "mkdir -p %s\nmount --bind %s %s\n", target, filepath.Join(dir, sub), target)
	}
	fmt.Fprintf(&script, "exec libvirtd --pid-file %s\n", filepath.Join(dir, "libvirtd.pid"))
	caps := filepath.Join(dir, "cache", "qemu", "capabilities")
	if err := os.MkdirAll(caps, 0o755); err != nil {
		t.Fatal(err)
	}
	cached, _ := filepath.Glob("/var/cache/libvirt/qemu/capabilities/*.xml")
	for _, f := range cached {
		if b, err := os.ReadFile(f); err == nil {
			if err := os.WriteFile(filepath.Join(caps, filepath.Base(f)), b, 0o600); err != nil {
				t.Fatal(err)
			}
		}
	}

	logFile, err := os.Create(filepath.Join(dir, "libvirtd.log"))
	if err != nil {
		t.Fatal(err)
	}
	// ip netns exec and unshare exec in turn, then sh execs libvirtd: the
	// PID started is libvirtd's, and Pdeathsig survives the execs.
	cmd := exec.Command("ip", "netns", "exec", ns, "unshare", "--mount", "--propagation", "private", "--uts", "sh", "-c", script.String())
	cmd.Stdout, cmd.Stderr = logFile, logFile
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGTERM}
	if err := cmd.Start(); err != nil {
		t.Fatalf("start libvirtd in %s: %v", ns, err)
	}
	d.pid = cmd.Process.Pid
	go func() { _ = cmd.Wait(); close(d.exited) }()
	t.Cleanup(func() {
		stopDaemon(cmd.Process, d.exited)
		logFile.Close()
		if t.Failed() {
			t.Logf("libvirtd %s log:\n%s", name, tailFile(logFile.Name()))
		}
	})
	return d
}

// waitReady waits until the daemon answers.
func (d *privateLibvirt) waitReady(t *testing.T, ctx context.Context) {
	t.Helper()
	for {
		if _, err := d.virshErr(ctx, "version"); err == nil {
			return
		}
		select {
		case <-d.exited:
			t.Fatalf("libvirtd %s exited:\n%s", d.name, tailFile(filepath.Join(d.dir, "libvirtd.log")))
		case <-ctx.Done():
			t.Fatalf("libvirtd %s did not answer on %s:\n%s", d.name, d.uri, tailFile(filepath.Join(d.dir, "libvirtd.log")))
		case <-time.After(200 * time.Millisecond):
		}
	}
}

func (d *privateLibvirt) virsh(t *testing.T, ctx context.Context, args ...string) string {
	t.Helper()
	out, err := d.virshErr(ctx, args...)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func (d *privateLibvirt) virshErr(ctx context.Context, args ...string) (string, error) {
	return virshAt(ctx, d.uri, args...)
}

// qemuLog is the daemon's log of the domain's QEMU.
func (d *privateLibvirt) qemuLog(domain string) string {
	return filepath.Join(d.dir, "log", "qemu", domain+".log")
}

// waitGone waits until the transient domain has gone (the guest powered
// off).
func (d *privateLibvirt) waitGone(ctx context.Context, name string) error {
	for {
		out, err := d.virshErr(ctx, "list", "--all", "--name")
		if err == nil && !strings.Contains(out, name) {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("domain %s still there: %w", name, ctx.Err())
		case <-time.After(500 * time.Millisecond):
		}
	}
}

// waitConsole waits until the console file holds line.
func waitConsole(ctx context.Context, console, line string) error {
	for {
		if b, err := os.ReadFile(console); err == nil && bytes.Contains(b, []byte(line)) {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("the console never showed %q: %w", line, ctx.Err())
		case <-time.After(500 * time.Millisecond):
		}
	}
}

func appendFile(t *testing.T, path, text string) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteString(text); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
}

// writeAt writes b at off of the file at path and syncs it.
func writeAt(path string, off int64, b []byte) error {
	f, err := os.OpenFile(path, os.O_WRONLY, 0)
	if err != nil {
		return err
	}
	if _, err := f.WriteAt(b, off); err != nil {
		f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

func tailFile(path string) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return err.Error()
	}
	return testserver.Tail(string(b), 40)
}

func lastLine(s string) string {
	s = strings.TrimSpace(s)
	if i := strings.LastIndexAny(s, "\r\n"); i >= 0 {
		return s[i+1:]
	}
	return s
}
