package nodeplugin

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/quiverstorage/quiver/internal/api"
	"github.com/quiverstorage/quiver/internal/testfs"
	"github.com/quiverstorage/quiver/internal/testguest"
	"github.com/quiverstorage/quiver/internal/testserver"
)

// records is how many 512-byte records the guest writes, each made
// durable (O_DIRECT, then fsync: an NBD FLUSH) before the next.
const records = 240

// proc is a quiver process of the test: the device agent or a plugin.
type proc struct {
	cmd    *exec.Cmd
	log    *testserver.LogBuffer
	exited chan struct{}
}

func start(t *testing.T, ownPIDNamespace bool, args ...string) *proc {
	t.Helper()
	p := &proc{log: &testserver.LogBuffer{}, exited: make(chan struct{})}
	p.cmd = exec.Command(quiverBin, args...)
	p.cmd.Stdout, p.cmd.Stderr = p.log, p.log
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if ownPIDNamespace {
		// As in a container: when the plugin (PID 1 of the namespace)
		// dies, the kernel kills every process left in the namespace,
		// whatever its session or process group.
		p.cmd.SysProcAttr.Cloneflags = syscall.CLONE_NEWPID
	}
	if err := p.cmd.Start(); err != nil {
		t.Fatalf("start %v: %v", args, err)
	}
	go func() { _ = p.cmd.Wait(); close(p.exited) }()
	t.Cleanup(func() {
		p.kill()
		if t.Failed() {
			t.Logf("--- %s %s log ---\n%s", filepath.Base(quiverBin), args[0], testserver.Tail(p.log.String(), 60))
		}
	})
	return p
}

// kill ends the process with SIGKILL (and, for a plugin in its own PID
// namespace, everything in that namespace) and waits for it.
func (p *proc) kill() {
	_ = p.cmd.Process.Kill()
	<-p.exited
}

// node is a CSI node plugin process and a client of its socket.
type node struct {
	*proc
	csi.NodeClient
}

// rig is what every case shares: a server with one Block-mode volume and
// its rw attachment for the node, and the node's paths.
type rig struct {
	srv              *testserver.Process
	pub              map[string]string // publish_context of ControllerPublishVolume
	stateDir, socket string
	staging, target  string
	// endpoint, when set, is the control socket of `quiver endpoint`,
	// which the plugin is told of (--quiver-endpoint) instead of an agent.
	endpoint string
}

func newRig(t *testing.T) *rig { return newRigWith(t, testserver.Options{}) }

func newRigWith(t *testing.T, o testserver.Options) *rig {
	t.Helper()
	testfs.RequireRoot(t)
	for _, tool := range []string{"nbdfuse", "losetup", "fusermount3"} {
		testfs.RequireTool(t, tool)
	}
	if _, err := os.Stat("/dev/fuse"); err != nil {
		testfs.SkipOrFail(t, "no /dev/fuse: %v", err)
	}
	srv := testserver.StartT(t, quiverBin, o)
	ctx := t.Context()
	if _, err := srv.API.CreateVolume(ctx, api.VolumeSpec{Name: "vm", Capacity: 64 << 20,
		Disks: []api.DiskSpec{{Name: "root", Size: 64 << 20}}}); err != nil {
		t.Fatal(err)
	}
	att, err := srv.API.Attach(ctx, "vm", api.AttachmentSpec{Node: "node-a", Mode: "rw"})
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	return &rig{
		srv:      srv,
		pub:      map[string]string{"quiver.io/attachment": att.ID, "quiver.io/token": att.Token},
		stateDir: filepath.Join(dir, "state"),
		socket:   filepath.Join(dir, "agent.sock"),
		staging:  filepath.Join(dir, "staging"),
		target:   filepath.Join(dir, "pod", "vm-disk"),
	}
}

// startNode starts a node plugin in a PID namespace of its own (or the
// test's, for cleaning up) and waits until it answers.
func (r *rig) startNode(t *testing.T, ownPIDNamespace bool, agent bool) *node {
	t.Helper()
	sock := filepath.Join(t.TempDir(), "csi.sock")
	args := []string{"csi", "--mode", "node", "--node-id", "node-a", "--endpoint", "unix://" + sock,
		"--server", "http://" + r.srv.APIAddr, "--nbd", "unix://" + r.srv.Socket, "--state-dir", r.stateDir}
	switch {
	case agent && r.endpoint != "":
		args = append(args, "--quiver-endpoint", r.endpoint)
	case agent:
		args = append(args, "--device-agent", r.socket)
	}
	p := start(t, ownPIDNamespace, args...)
	conn, err := grpc.NewClient("unix://"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	n := &node{proc: p, NodeClient: csi.NewNodeClient(conn)}
	deadline := time.Now().Add(30 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(t.Context(), time.Second)
		_, err := n.NodeGetCapabilities(ctx, &csi.NodeGetCapabilitiesRequest{})
		cancel()
		if err == nil {
			return n
		}
		if time.Now().After(deadline) {
			t.Fatalf("the node plugin does not answer: %v\n%s", err, p.log.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

var blockRW = &csi.VolumeCapability{
	AccessType: &csi.VolumeCapability_Block{Block: &csi.VolumeCapability_BlockVolume{}},
	AccessMode: &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER},
}

// publish is kubelet's sequence for the pod: NodeStageVolume, then
// NodePublishVolume. Kubelet repeats both after a plugin restart; they
// must answer OK without touching a whole staging.
func (r *rig) publish(t *testing.T, n *node) {
	t.Helper()
	ctx := t.Context()
	if _, err := n.NodeStageVolume(ctx, &csi.NodeStageVolumeRequest{VolumeId: "vm", StagingTargetPath: r.staging,
		VolumeCapability: blockRW, PublishContext: r.pub}); err != nil {
		t.Fatalf("NodeStageVolume: %v", err)
	}
	if _, err := n.NodePublishVolume(ctx, &csi.NodePublishVolumeRequest{VolumeId: "vm", StagingTargetPath: r.staging,
		TargetPath: r.target, VolumeCapability: blockRW, PublishContext: r.pub}); err != nil {
		t.Fatalf("NodePublishVolume: %v", err)
	}
}

func (r *rig) unpublish(t *testing.T, n *node) {
	t.Helper()
	ctx := context.WithoutCancel(t.Context())
	if _, err := n.NodeUnpublishVolume(ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: "vm", TargetPath: r.target}); err != nil {
		t.Errorf("NodeUnpublishVolume: %v", err)
	}
	if _, err := n.NodeUnstageVolume(ctx, &csi.NodeUnstageVolumeRequest{VolumeId: "vm", StagingTargetPath: r.staging}); err != nil {
		t.Errorf("NodeUnstageVolume: %v", err)
	}
}

// staged is the node's record of the staging: its loop device and the pid
// of nbdfuse.
type staged struct {
	Loop string `json:"loop"`
	PID  int    `json:"pid"`
}

func (r *rig) record(t *testing.T) staged {
	t.Helper()
	var s staged
	b, err := os.ReadFile(filepath.Join(r.stateDir, "volumes", "vm.json"))
	if err == nil {
		err = json.Unmarshal(b, &s)
	}
	if err != nil || s.Loop == "" || s.PID == 0 {
		t.Fatalf("the node's staging record: %+v %v", s, err)
	}
	return s
}

// readDevice reads the first 4 KiB of the published device with O_DIRECT.
func (r *rig) readDevice() error {
	out, err := exec.Command("dd", "if="+r.target, "of=/dev/null", "bs=4096", "count=1", "iflag=direct").CombinedOutput()
	if err != nil {
		return fmt.Errorf("%v: %s", err, strings.TrimSpace(string(out)))
	}
	return nil
}

// TestPluginRestartWithoutAgent shows the flaw the device agent exists
// for, and that this test's restart is a real one: a plugin that holds
// nbdfuse itself takes the device down when it dies with its namespace.
func TestPluginRestartWithoutAgent(t *testing.T) {
	r := newRig(t)
	n := r.startNode(t, true, false)
	r.publish(t, n)
	if err := r.readDevice(); err != nil {
		t.Fatalf("the published device does not read: %v", err)
	}
	n.kill()
	if err := r.readDevice(); err == nil {
		t.Fatal("the device still reads after its plugin and nbdfuse were killed: the restart in this test proves nothing")
	} else {
		t.Logf("as expected, without a device agent the device died with the plugin: %v", err)
	}
	// Clean up from the test's own PID namespace: the recorded pid was
	// the plugin namespace's, so Detach leaves it alone.
	r.unpublish(t, r.startNode(t, false, false))
}

// TestPluginRestartUnderGuestWrites is acceptance 5 of the cluster issue: a
// QEMU guest writes through the Block-mode device while the node plugin is
// killed with its whole PID namespace and started again. The guest sees no
// I/O error and reads back every record; the device stays published (the
// same loop device and nbdfuse), and the restarted plugin unpublishes it.
func TestPluginRestartUnderGuestWrites(t *testing.T) {
	r := newRig(t)
	testfs.RequireTool(t, "qemu-system-x86_64")
	k, initrd := buildGuest(t)
	agent := start(t, false, "device-agent", "--socket", r.socket, "--root", filepath.Join(r.stateDir, "fuse"))
	waitSocket(t, r.socket, agent)

	n := r.startNode(t, true, true)
	r.publish(t, n)
	before := r.record(t)

	g := startGuest(t, k, initrd, r.target)
	g.waitConsole(t, "guest: rec 50")
	n = r.restartUnderGuest(t, n, g, before, "the device agent")
	if strings.Contains(agent.log.String(), "msg=detached") {
		t.Fatalf("the agent detached the device during the restart:\n%s", agent.log.String())
	}

	r.unpublish(t, n)
	deadline := time.Now().Add(10 * time.Second)
	for isAlive(before.PID) {
		if time.Now().After(deadline) {
			t.Fatalf("nbdfuse (pid %d) still runs after unstage", before.PID)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if out, _ := exec.Command("losetup", "--noheadings", "--output", "BACK-FILE", before.Loop).Output(); strings.Contains(string(out), r.stateDir) {
		t.Fatalf("%s still backs onto the FUSE file after unstage: %s", before.Loop, out)
	}
}

// TestPluginRestartWithEndpoint is acceptance 4 of issue 30 for the CSI
// node plugin: with the node's endpoint (`quiver endpoint`), a Block-mode
// volume's device is nbdfuse on the endpoint's socket (its export of every
// disk, disk 0 at offset 0), held by the endpoint. A QEMU guest writes
// through it while the plugin is killed with its whole PID namespace and
// started again: the guest sees no I/O error and reads back every record,
// the device stays the same, and the restarted plugin unstages it, which
// unpublishes the volume at the endpoint.
func TestPluginRestartWithEndpoint(t *testing.T) {
	r := newRigWith(t, testserver.Options{NBDTCP: true})
	testfs.RequireTool(t, "qemu-system-x86_64")
	k, initrd := buildGuest(t)
	dir := t.TempDir()
	r.endpoint = filepath.Join(dir, "endpoint.sock")
	ep := start(t, false, "endpoint", "--servers", "http://"+r.srv.APIAddr, "--control", r.endpoint,
		"--root", filepath.Join(dir, "endpoint"), "--fuse-root", filepath.Join(r.stateDir, "fuse"))
	waitSocket(t, r.endpoint, ep)

	n := r.startNode(t, true, true)
	r.publish(t, n)
	before := r.record(t)
	sock := filepath.Join(dir, "endpoint", "volumes", "vm", "nbd.sock")
	if _, err := os.Stat(sock); err != nil {
		t.Fatalf("the endpoint serves no socket for the volume: %v", err)
	}

	g := startGuest(t, k, initrd, r.target)
	g.waitConsole(t, "guest: rec 50")
	n = r.restartUnderGuest(t, n, g, before, "the endpoint")
	// Every record is on the volume's disk, through the storage node.
	img, err := os.ReadFile(filepath.Join(r.srv.Pool, "volumes", "vm", "disks", "root.img"))
	if err != nil {
		t.Fatal(err)
	}
	for i := range records {
		if want := fmt.Sprintf("rec %08d", i); string(img[i*512:i*512+12]) != want {
			t.Fatalf("record %d on the disk: %q, want %q", i, img[i*512:i*512+12], want)
		}
	}
	r.unpublish(t, n)
	if _, err := os.Stat(sock); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the endpoint still serves the volume after unstage: %v", err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for isAlive(before.PID) {
		if time.Now().After(deadline) {
			t.Fatalf("nbdfuse (pid %d) still runs after unstage", before.PID)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// restartUnderGuest kills the node plugin n with its namespace while the
// guest g writes through the device before, held by holder, starts it
// again and repeats kubelet's calls: nbdfuse must live on, the staging
// stay the same, and the guest verify every record without an error. It
// returns the restarted plugin.
func (r *rig) restartUnderGuest(t *testing.T, n *node, g *guest, before staged, holder string) *node {
	t.Helper()
	n.kill()
	if !isAlive(before.PID) {
		t.Fatalf("nbdfuse (pid %d) died with the plugin although %s holds it", before.PID, holder)
	}
	t.Logf("plugin killed with its namespace while the guest writes; nbdfuse %d lives on", before.PID)
	n = r.startNode(t, true, true)
	r.publish(t, n)
	if after := r.record(t); after != before {
		t.Fatalf("the restarted plugin staged the volume again: %+v, was %+v", after, before)
	}
	g.waitConsole(t, "guest: verified")
	console := g.ConsoleText()
	if strings.Contains(console, "write error") || strings.Contains(console, "mismatch") ||
		!strings.Contains(console, fmt.Sprintf("guest: verified %d records, 0 bad", records)) {
		t.Fatalf("the guest saw I/O errors or lost records:\n%s", testserver.Tail(console, 40))
	}
	g.wait(t)
	return n
}

func isAlive(pid int) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	return err == nil && !strings.Contains(string(b), ") Z ")
}

func waitSocket(t *testing.T, path string, p *proc) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		if fi, err := os.Stat(path); err == nil && fi.Mode()&os.ModeSocket != 0 {
			if fi.Mode().Perm() != 0o600 {
				t.Fatalf("the agent's socket has mode %v, want 0600", fi.Mode().Perm())
			}
			return
		}
		select {
		case <-p.exited:
			t.Fatalf("the device agent exited:\n%s", p.log.String())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("no agent socket at %s", path)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// buildGuest writes an initramfs whose /init writes `records` records of
// 512 bytes to /dev/vda, each with O_DIRECT and an fsync (a FLUSH), then
// reads every one back and powers off.
func buildGuest(t *testing.T) (*testguest.Kernel, string) {
	t.Helper()
	initrd := filepath.Join(t.TempDir(), "initramfs.cpio")
	k, err := testguest.Build(testguest.VirtioBlk, initrd, `n=`+strconv.Itoa(records)+`
i=0
while [ $i -lt $n ]; do
	printf "rec %08d%-500s" $i "" | dd of=/dev/vda bs=512 seek=$i count=1 iflag=fullblock oflag=direct conv=fsync 2>/dev/null || echo "guest: write error at $i"
	[ $((i % 25)) -eq 0 ] && echo "guest: rec $i"
	i=$((i + 1))
done
bad=0
i=0
while [ $i -lt $n ]; do
	got=$(dd if=/dev/vda bs=512 skip=$i count=1 iflag=direct 2>/dev/null | head -c 12)
	[ "$got" = "$(printf "rec %08d" $i)" ] || { echo "guest: mismatch at $i: $got"; bad=$((bad + 1)); }
	i=$((i + 1))
done
echo "guest: verified $n records, $bad bad"
poweroff -f
`)
	if errors.Is(err, testguest.ErrMissing) {
		testfs.SkipOrFail(t, "%v", err)
	} else if err != nil {
		t.Fatal(err)
	}
	return k, initrd
}

// guest is QEMU (TCG) with the published block device as its virtio disk.
type guest struct {
	*testguest.VM
	out *testserver.LogBuffer
}

func startGuest(t *testing.T, k *testguest.Kernel, initrd, device string) *guest {
	t.Helper()
	console := filepath.Join(t.TempDir(), "console")
	g := &guest{out: &testserver.LogBuffer{}}
	cmd := exec.Command("qemu-system-x86_64", append(testguest.QEMUArgs(k, initrd, console),
		"-blockdev", "driver=host_device,node-name=d0,filename="+device+",cache.direct=on",
		"-device", "virtio-blk-pci,drive=d0,werror=report,rerror=report",
	)...)
	cmd.Stdout, cmd.Stderr = g.out, g.out
	var err error
	if g.VM, err = testguest.StartVM(cmd, console); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		g.Kill()
		if t.Failed() {
			t.Logf("--- guest console ---\n%s\n--- QEMU ---\n%s", testserver.Tail(g.ConsoleText(), 40), g.out.String())
		}
	})
	return g
}

// waitConsole waits up to 5 minutes for the guest to print want.
func (g *guest) waitConsole(t *testing.T, want string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Minute)
	defer cancel()
	if err := g.WaitConsole(ctx, want); err != nil {
		t.Fatal(err)
	}
}

func (g *guest) wait(t *testing.T) {
	t.Helper()
	select {
	case <-g.Exited():
	case <-time.After(time.Minute):
		t.Fatal("the guest did not power off")
	}
}
