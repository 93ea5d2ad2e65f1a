package clustertest

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/quiverstorage/quiver/internal/api"
	"github.com/quiverstorage/quiver/internal/endpoint"
	"github.com/quiverstorage/quiver/internal/kubevirt"
	"github.com/quiverstorage/quiver/internal/testfs"
	"github.com/quiverstorage/quiver/internal/testguest"
	"github.com/quiverstorage/quiver/internal/testserver"
	guestrecord "github.com/quiverstorage/quiver/test/migration/record"
)

// endpointDisks are the three disks of the endpoint tests' guests, as the
// guest names them (and its guest writer numbers them), and volumeDisks the
// volume's disks they are, in the same order: disk.img's disk, then the
// extra disks, as the KubeVirt hook gives them to QEMU (targets vda, vdb,
// vdc; serials "", data, logs).
var (
	endpointDisks = []string{"vda", "vdb", "vdc"}
	volumeDisks   = []string{"disk", "data", "logs"}
)

// endpointProc is `quiver endpoint` running in the hub namespace: the
// compute node.
type endpointProc struct {
	cmd    *exec.Cmd
	log    *testserver.LogBuffer
	exited chan struct{}
}

// startEndpoint starts the compute node's endpoint in the hub namespace,
// asking the storage nodes' APIs in the order of nodes.
func (c *cluster) startEndpoint(t *testing.T, dir string, nodes ...*node) *endpointProc {
	t.Helper()
	var servers []string
	for _, nd := range nodes {
		servers = append(servers, "http://"+nd.ip+":7480")
	}
	p := &endpointProc{log: &testserver.LogBuffer{}, exited: make(chan struct{})}
	p.cmd = exec.Command("ip", "netns", "exec", c.net.Hub, quiverBin, "endpoint",
		"--servers", strings.Join(servers, ","), "--token-file", c.tokenFile(apiToken),
		"--root", filepath.Join(dir, "ep"), "--control", filepath.Join(dir, "ep.sock"),
		"--fuse-root", filepath.Join(dir, "fuse"), "--poll-interval", "1s")
	p.cmd.Stdout, p.cmd.Stderr = p.log, p.log
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { _ = p.cmd.Wait(); close(p.exited) }()
	t.Cleanup(func() {
		p.stop(syscall.SIGKILL)
		// Its immutable placeholders would stop the removal of dir.
		vols, _ := filepath.Glob(filepath.Join(dir, "ep", "volumes", "*"))
		for _, v := range vols {
			_ = endpoint.RemovePlaceholder(v)
		}
		if t.Failed() {
			t.Logf("--- endpoint log ---\n%s", testserver.Tail(p.log.String(), 80))
		}
	})
	ctl := endpoint.NewClient(filepath.Join(dir, "ep.sock"))
	deadline := time.Now().Add(30 * time.Second)
	for {
		if _, err := ctl.List(context.Background()); err == nil {
			return p
		} else if time.Now().After(deadline) {
			t.Fatalf("the endpoint does not answer: %v\n%s", err, p.log.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// stop signals the endpoint and waits for it to end.
func (p *endpointProc) stop(sig syscall.Signal) {
	_ = p.cmd.Process.Signal(sig)
	select {
	case <-p.exited:
	case <-time.After(20 * time.Second):
		_ = p.cmd.Process.Kill()
		<-p.exited
	}
}

// TestEndpointGuest is acceptances 2 and 4 (the endpoint's part) of issue
// 30, with the QEMU disks the KubeVirt hook gives a VM through the node's
// endpoint: a guest (the test/migration guest writer: records with
// sequence numbers, each written O_DIRECT|O_SYNC) runs under QEMU in the
// hub namespace, the compute node, with its three virtio-blk disks on a
// replicas=2 volume of three storage nodes, each an NBD disk on the unix
// socket of `quiver endpoint` (also in the hub namespace) with
// reconnect-delay, as the hook writes them. The endpoint was told the
// storage nodes with the primary first. Each storage node is SIGKILLed in
// turn (the primary, which is also the API the endpoint asked first; then
// the copy promoted meanwhile, then the node without a copy... whichever
// holds each role at that time) and restarted: the guest's writes must go on
// within L + 3 s of each kill with no failed request in QEMU and no I/O error
// on the console, and the endpoint's connections must go straight to the
// primary of the moment. Then the endpoint itself is restarted (SIGTERM)
// and crashed (SIGKILL) and started again while the guest writes: QEMU
// reconnects, the guest sees nothing. At the end the VM is stopped and each
// disk on the primary must hold exactly the records QEMU completed, intact,
// byte-identical on the other copy.
func TestEndpointGuest(t *testing.T) {
	testfs.RequireTool(t, "qemu-system-x86_64")
	testfs.RequireTool(t, "ss")
	c, k, initrd, v := startEndpointRig(t, "vm")
	ctx := context.Background()
	prim, cp := c.byName(v.Primary), c.byName(otherCopy(v))
	spare := c.other(prim, cp)
	dir := shortTempDir(t, "qep")
	ep := c.startEndpoint(t, dir, prim, cp, spare)
	ctl := endpoint.NewClient(filepath.Join(dir, "ep.sock"))
	_, pub := c.publishAt(t, ctl, v, "compute-1")
	// The domain virt-launcher writes for the Filesystem PVC (its
	// directory the endpoint's, as the CSI node plugin binds it), passed
	// through the KubeVirt hook with the webhook's annotation: QEMU gets
	// every disk as libvirt makes the hook's NBD disks.
	drives := qemuDrives(t, throughHook(t, launcherDomain(filePVCDisk(pub.Dir)),
		map[string]string{kubevirt.AnnotationEndpointDisks: `{"rootdisk":["disk","data","logs"]}`}))
	vm := startGuestVMRaw(t, c, k, initrd, endpointDisks, func(_ int, d string) []string { return drives[d] })
	vm.waitStarted(t)
	checkSerials(t, vm)
	c.waitEndpointConns(t, prim, 10*time.Second)
	t.Logf("the guest writes its 3 disks through the endpoint at %s; primary %s at term %d, copy %s, spare %s",
		pub.Socket, prim.name, v.Term, cp.name, spare.name)

	// Kill the primary first (the API the endpoint asked first, the node
	// its connections go to, and made etcd's leader), then whichever node holds each role
	// after: the copy promoted meanwhile, then the node without a copy.
	var stalls []string
	for i, role := range []string{leadingPrimary, "primary", "spare"} {
		stalls = append(stalls, c.killUnderGuest(t, vm, "vm", i, role, func(now api.Volume) {
			c.waitEndpointConns(t, c.byName(now.Primary), 10*time.Second)
		}))
	}

	// The endpoint restarts, then crashes, while the guest writes.
	for _, sig := range []syscall.Signal{syscall.SIGTERM, syscall.SIGKILL} {
		start := vm.writes(t)["vda"].WrOperations
		vm.waitWrites(t, start+50, 2*time.Minute)
		ep.stop(sig)
		stopped := time.Now()
		ep = c.startEndpoint(t, dir, prim, cp, spare)
		vm.waitWrites(t, start+100, 2*time.Minute)
		vm.checkHealthy(t)
		t.Logf("endpoint ended by %v and started again: the guest's writes went on %v after", sig, time.Since(stopped).Round(time.Millisecond))
	}
	if list, err := ctl.List(ctx); err != nil || len(list) != 1 || list[0].Connections != len(endpointDisks) {
		t.Fatalf("the restarted endpoint serves %+v (%v): want vm with QEMU's %d connections", list, err, len(endpointDisks))
	}

	c.checkGuestRecords(t, vm, "vm", true)
	t.Logf("from each kill to the guest's next writes: %v (limit L + 3 s = %v)", stalls, failoverLimit())
}

// startEndpointRig builds the guest of endpointDisks and starts three
// storage nodes with a replicas=2 volume of volumeDisks named name. Their
// etcd members run with the LAN timing docs/cluster.md gives for failovers
// within L + 3 s when the primary also leads etcd (etcdTiming).
func startEndpointRig(t *testing.T, name string) (*cluster, *testguest.Kernel, string, api.Volume) {
	t.Helper()
	k, initrd := buildWriterGuest(t, endpointDisks)
	c := startClusterWith(t, func(_ int, nd *node) { nd.args = append(nd.args, etcdTiming...) })
	c.waitNodes(c.nodes[0], "n1 n2 n3 up", allUp("n1", "n2", "n3"))
	spec := api.VolumeSpec{Name: name, Capacity: int64(len(volumeDisks)) * guestDiskSize, Replicas: 2}
	for _, d := range volumeDisks {
		spec.Disks = append(spec.Disks, api.DiskSpec{Name: d, Size: guestDiskSize})
	}
	v, err := c.nodes[0].api().CreateVolume(context.Background(), spec)
	if err != nil {
		t.Fatal(err)
	}
	return c, k, initrd, v
}

// shortTempDir is a new directory with a short path (unix sockets live in
// it), removed at the end of the test.
func shortTempDir(t *testing.T, prefix string) string {
	t.Helper()
	dir, err := os.MkdirTemp("", prefix)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}

// publishAt does what the CSI driver does for a compute node: an
// attachment of v for node (ControllerPublishVolume) and the publication
// of v's disks at the node's endpoint with its token (NodeStageVolume).
func (c *cluster) publishAt(t *testing.T, ctl *endpoint.Client, v api.Volume, node string) (api.Attachment, endpoint.Published) {
	t.Helper()
	ctx := context.Background()
	att, err := c.nodes[0].api().Attach(ctx, v.Name, api.AttachmentSpec{Node: node})
	if err != nil {
		t.Fatal(err)
	}
	pv := endpoint.Volume{Name: v.Name, Token: att.Token}
	for _, d := range v.Disks {
		pv.Disks = append(pv.Disks, endpoint.Disk{Name: d.Name, Size: d.Size})
	}
	pub, err := ctl.Publish(ctx, pv)
	if err != nil {
		t.Fatal(err)
	}
	return att, pub
}

// waitStarted waits for the guest writer to start.
func (vm *guestVM) waitStarted(t *testing.T) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	if err := vm.WaitConsole(ctx, "guestwriter: start"); err != nil {
		t.Fatal(err)
	}
}

// failoverLimit is issue 30's bound on a storage node's death under a
// guest: L + 3 s.
func failoverLimit() time.Duration {
	lease, _ := time.ParseDuration(leaseTTL)
	return lease + 3*time.Second
}

// leadingPrimary is killUnderGuest's role for the primary made etcd's
// leader first.
const leadingPrimary = "primary leading etcd"

// killUnderGuest SIGKILLs the node of volume that holds role ("primary",
// leadingPrimary, or "spare": the node without a copy) while the guest writes, checks that
// the guest's writes go on within failoverLimit, runs moved
// with the volume once another primary is up, then starts the node again
// and waits for its copy to be in sync. It returns the role and the stall,
// for the log.
func (c *cluster) killUnderGuest(t *testing.T, vm *guestVM, volume string, i int, role string, moved func(api.Volume)) string {
	t.Helper()
	start := vm.writes(t)["vda"].WrOperations
	vm.waitWrites(t, start+100, 2*time.Minute)
	cur := c.waitVolume(t, c.nodes[0], volume, "copies in sync", bothInSync)
	victim := c.byName(cur.Primary)
	if role == "spare" {
		victim = c.other(c.byName(cur.Primary), c.byName(otherCopy(cur)))
	}
	if role == leadingPrimary {
		// The costliest death: the primary also leads etcd, whose
		// members must elect another leader before the lease can expire.
		c.moveEtcdLeader(t, victim)
		role = "primary"
	}
	leader := c.etcdLeader(t) == victim
	most := int64(0)
	for _, s := range vm.writes(t) {
		most = max(most, s.WrOperations)
	}
	victim.proc.Kill()
	killed := time.Now()
	vm.waitWrites(t, most+2, 2*time.Minute)
	stall := time.Since(killed)
	shown := role
	if leader {
		shown += " (etcd leader)"
	}
	if allowed := failoverLimit(); stall > allowed {
		t.Errorf("cycle %d: the guest's writes went on %v after the kill of the %s %s, more than %v",
			i, stall.Round(time.Millisecond), shown, victim.name, allowed)
	}
	vm.waitWrites(t, most+30, 2*time.Minute)
	vm.checkHealthy(t)
	now := c.waitVolume(t, c.other(victim), volume, "a primary up", func(x api.Volume) bool { return x.Primary != "" && x.Primary != victim.name })
	if moved != nil {
		moved(now)
	}
	t.Logf("cycle %d: killed the %s %s; the guest's writes went on %v after; primary %s at term %d",
		i, shown, victim.name, stall.Round(time.Millisecond), now.Primary, now.Term)
	c.spawn(victim)
	c.waitReady(victim)
	if role == "primary" {
		c.waitInSync(t, c.byName(now.Primary), volume, victim.name, 2*time.Minute)
	}
	return shown + " " + stall.Round(time.Millisecond).String()
}

// checkGuestRecords stops the VM (QEMU completes every request in flight
// first) and checks that each disk of volume on its primary holds exactly
// the records QEMU completed on the guest's device, intact, and, with
// copies, that both copies are the same.
func (c *cluster) checkGuestRecords(t *testing.T, vm *guestVM, volume string, copies bool) {
	t.Helper()
	if err := vm.qmp.Execute(context.Background(), "stop", nil, nil); err != nil {
		t.Fatal(err)
	}
	stats := vm.writes(t)
	vm.checkHealthy(t)
	final := c.waitVolume(t, c.nodes[0], volume, "both copies in sync", bothInSync)
	fp := c.byName(final.Primary)
	for di, d := range endpointDisks {
		img, err := os.ReadFile(filepath.Join(fp.pool, "volumes", volume, "disks", volumeDisks[di]+".img"))
		if err != nil {
			t.Fatal(err)
		}
		n, err := guestrecord.Count(img, uint64(di))
		if err != nil {
			t.Fatalf("%s on the primary %s: %v", d, fp.name, err)
		}
		if s := stats[d]; n != s.WrOperations || s.FlushOperations == 0 {
			t.Fatalf("%s on the primary %s holds records 0..%d, QEMU completed %d writes and %d flushes",
				d, fp.name, n-1, s.WrOperations, s.FlushOperations)
		}
		if copies {
			if a, b := diskSum(t, fp, volume, volumeDisks[di]), diskSum(t, c.byName(otherCopy(final)), volume, volumeDisks[di]); a != b {
				t.Fatalf("%s: the copies differ: %s on %s, %s on the other", d, a, fp.name, b)
			}
		}
		t.Logf("%s (disk %s): records 0..%d intact on %s (primary at term %d)", d, volumeDisks[di], n-1, fp.name, final.Term)
	}
}

// waitEndpointConns waits until every NBD connection of the hub namespace
// (the endpoint's) goes to prim, the primary: the endpoint connects to the
// primary directly, not through another node.
func (c *cluster) waitEndpointConns(t *testing.T, prim *node, limit time.Duration) {
	t.Helper()
	deadline := time.Now().Add(limit)
	for {
		conns := c.qemuConns(t)
		ok := conns != ""
		for _, peer := range strings.Split(conns, ",") {
			ok = ok && peer == prim.ip+":10809"
		}
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the endpoint's NBD connections go to %q, want only the primary %s (%s)", conns, prim.name, prim.ip)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// checkSerials checks the guest's console for the serial of each disk (its
// /init prints them before the guest writer starts): vda has none (the
// PVC's own disk), vdb and vdc the names of the extra disks.
func checkSerials(t *testing.T, vm *guestVM) {
	t.Helper()
	console := vm.ConsoleText()
	lines := map[string]bool{}
	for line := range strings.Lines(console) {
		lines[strings.TrimSpace(line)] = true
	}
	for dev, serial := range map[string]string{"vda": "", "vdb": "data", "vdc": "logs"} {
		if want := "guest: serial " + dev + "=" + serial; !lines[want] {
			t.Fatalf("the guest's console lacks %q:\n%s", want, console)
		}
	}
}

// etcdTiming is the embedded members' raft timing of the endpoint tests:
// a heartbeat of 50 ms and an election timeout of 500 ms, as on a quiet
// LAN (docs/cluster.md, "QEMU guests through a failover"). When the killed
// primary also led etcd, the members elect a new leader one to two
// election timeouts later and it extends every lease by one: the dead
// primary's lease outlives L by 1 to 1.5 s, within issue 30's L + 3 s.
// With etcd's defaults (100 ms, 1 s) that case took L + 2.6 to 3.6 s.
var etcdTiming = []string{"--etcd-heartbeat-interval", "50ms", "--etcd-election-timeout", "500ms"}
