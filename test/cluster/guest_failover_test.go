package clustertest

import (
	"context"
	"encoding/json"
	"errors"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/quiverstorage/quiver/internal/api"
	"github.com/quiverstorage/quiver/internal/testfs"
	"github.com/quiverstorage/quiver/internal/testguest"
	"github.com/quiverstorage/quiver/internal/testserver"
	guestrecord "github.com/quiverstorage/quiver/test/migration/record"
)

// guestDisks are the disks of the guest's volume, in the order the guest
// writer numbers them (record disk 0, 1), as in test/migration.
var guestDisks = []string{"vda", "vdb"}

// guestDiskSize: 16384 records per disk, more than the guest writes in a
// few failovers under TCG (about 100 to 300 records a second here).
const guestDiskSize = 64 << 20

// guestConsoleTrouble are console lines of a guest that saw an I/O error
// or worse: the kernel's block layer ("I/O error, dev vda", "Buffer I/O
// error"), a filesystem's "WRITE ERROR", the guest writer's own error and
// a full disk (the run outlived the disks), /init's complaints, panics.
var guestConsoleTrouble = testguest.WriterTrouble

// TestFailoverGuest is acceptance 4 of issue 15: the test/migration guest
// (its guest writer: records with sequence numbers, each pwrite with
// O_DIRECT|O_SYNC, so a write and a FLUSH before it returns) runs under
// QEMU (TCG) in the hub namespace, its two virtio-blk disks on a replicas=2
// volume through QEMU's NBD client with reconnect-delay: vda connected to
// the node that holds no copy, which forwards every request to the primary
// of the moment; vdb to a host name of the three nodes, the primary first,
// so that QEMU's connection breaks and QEMU reconnects to the next address.
// Mid-run the primary is SIGKILLed (every other cycle its NBD port drops
// connection requests first, as a host that is gone); the guest must keep
// writing (QEMU's write counters grow again) with no failed request in
// QEMU and no I/O error on the guest console, and vdb's connection must
// have left the dead primary; the victim is restarted and resynced before
// the next cycle. At the end the VM is stopped (QMP stop: every request in
// flight completes) and each disk's image on the primary of the moment
// must hold exactly the records QEMU completed, every one intact
// (record.Count), and the copies must be byte-identical.
// QUIVER_GUEST_FAILOVERS sets the number of primary kills (default 2).
func TestFailoverGuest(t *testing.T) {
	cycles := envCount(t, "QUIVER_GUEST_FAILOVERS", 2)
	testfs.RequireTool(t, "qemu-system-x86_64")
	k, initrd := buildWriterGuest(t, guestDisks)
	c := startCluster(t)
	c.waitNodes(c.nodes[0], "n1 n2 n3 up", allUp("n1", "n2", "n3"))
	ctx := context.Background()
	spec := api.VolumeSpec{Name: "guest", Capacity: int64(len(guestDisks)) * guestDiskSize, Replicas: 2}
	for _, d := range guestDisks {
		spec.Disks = append(spec.Disks, api.DiskSpec{Name: d, Size: guestDiskSize})
	}
	v, err := c.nodes[0].api().CreateVolume(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	att, err := c.byName(v.Primary).api().Attach(ctx, "guest", api.AttachmentSpec{Node: "worker-1"})
	if err != nil {
		t.Fatal(err)
	}
	via := c.other(c.byName(v.Primary), c.byName(copyNodes(v)[1])) // the node without a copy
	// vda: through the node without a copy, which forwards. vdb: through
	// a host name of all three nodes, the primary first, so that QEMU's
	// connection breaks when the primary dies and QEMU reconnects to the
	// next address that answers.
	servers := map[string]string{"vda": via.ip, "vdb": c.nodesName(t, c.byName(v.Primary), c.byName(copyNodes(v)[1]), via)}
	// A host that is gone drops connection requests instead of refusing
	// them, and connect() to it waits for the kernel's SYN retries (about
	// 2 minutes with the default 6), longer than reconnect-delay. One
	// retry (connect gives up after 3 s) in QEMU's namespace lets QEMU
	// try the next address in time (docs/cluster.md).
	run(t, "ip", "netns", "exec", c.net.Hub, "sysctl", "-q", "-w", "net.ipv4.tcp_syn_retries=1")
	vm := startGuestVM(t, c, k, initrd, guestDisks, func(d string) map[string]any {
		return map[string]any{"server": map[string]string{"type": "inet", "host": servers[d], "port": "10809"},
			"export": "guest/" + d + "/" + att.Token}
	})
	wctx, cancel := context.WithTimeout(ctx, 3*time.Minute)
	err = vm.WaitConsole(wctx, "guestwriter: start")
	cancel()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("the guest writes vda through %s, vdb through %s; primary %s at term %d", via.name, servers["vdb"], v.Primary, v.Term)

	var stalls []time.Duration
	for i := range cycles {
		// Mid-run: at least 200 more records on vda than at the start of
		// the cycle, the first time past the guest's boot.
		start := vm.writes(t)["vda"].WrOperations
		vm.waitWrites(t, start+200, 2*time.Minute)
		cur := c.waitVolume(t, via, "guest", "copies in sync", bothInSync)
		prim, cp := c.byName(cur.Primary), c.byName(otherCopy(cur))
		// QEMU reads the name again when it reconnects: the primary of
		// the moment first, so that its death is what QEMU meets first.
		c.nodesName(t, prim, cp, via)
		conns := c.qemuConns(t)
		// Every other cycle the primary's host is gone rather than its
		// process: its NBD port drops new connections.
		gone := i%2 == 1
		if gone {
			c.dropSYN(t, prim, true)
		}
		before := vm.writes(t)
		prim.proc.Kill()
		killed := time.Now()
		// The guest goes on: two more completed writes on each disk than
		// at the kill (the guest writer has one in flight at a time), so at
		// least one sent after the kill, then 50.
		most := max(before["vda"].WrOperations, before["vdb"].WrOperations)
		vm.waitWrites(t, most+2, 2*time.Minute)
		stall := time.Since(killed)
		stalls = append(stalls, stall)
		vm.waitWrites(t, most+50, 2*time.Minute)
		got := c.waitVolume(t, via, "guest", "the copy promoted", func(x api.Volume) bool { return x.Primary == cp.name })
		if got.Term != cur.Term+1 {
			t.Fatalf("cycle %d: %s promoted at term %d, want %d", i, cp.name, got.Term, cur.Term+1)
		}
		vm.checkHealthy(t)
		after := c.qemuConns(t)
		if !strings.Contains(conns, prim.ip+":10809") || strings.Contains(after, prim.ip+":10809") {
			t.Fatalf("cycle %d: QEMU's NBD connections %s before and %s after the kill: want one to the primary %s (vdb) before, none after",
				i, conns, after, prim.ip)
		}
		t.Logf("cycle %d: QEMU's NBD connections to %s before the kill, to %s after", i, conns, after)
		how := "process killed"
		if gone {
			how = "host gone: SYNs dropped"
			c.dropSYN(t, prim, false)
		}
		t.Logf("cycle %d: killed primary %s (%s) at %d records on vda; %s primary at term %d; the guest's writes went on %v after the kill",
			i, prim.name, how, before["vda"].WrOperations, cp.name, got.Term, stall.Round(time.Millisecond))
		c.spawn(prim)
		c.waitReady(prim)
		seen := c.waitInSync(t, cp, "guest", prim.name, 2*time.Minute)
		t.Logf("cycle %d: the old primary %s back in sync (states %v)", i, prim.name, seen)
	}
	vm.waitWrites(t, vm.writes(t)["vda"].WrOperations+50, 2*time.Minute)

	// Stop the VM: QEMU drains every request in flight first, so its
	// counters are final and every write it counted is acknowledged.
	if err := vm.qmp.Execute(ctx, "stop", nil, nil); err != nil {
		t.Fatal(err)
	}
	stats := vm.writes(t)
	vm.checkHealthy(t)
	final := c.waitVolume(t, via, "guest", "both copies in sync", bothInSync)
	prim := c.byName(final.Primary)
	for di, d := range guestDisks {
		img, err := os.ReadFile(filepath.Join(prim.pool, "volumes", "guest", "disks", d+".img"))
		if err != nil {
			t.Fatal(err)
		}
		n, err := guestrecord.Count(img, uint64(di))
		if err != nil {
			t.Fatalf("%s on the primary %s: %v", d, prim.name, err)
		}
		if s := stats[d]; n != s.WrOperations || s.FlushOperations == 0 {
			t.Fatalf("%s on the primary %s holds records 0..%d, QEMU completed %d writes and %d flushes",
				d, prim.name, n-1, s.WrOperations, s.FlushOperations)
		}
		if a, b := diskSum(t, prim, "guest", d), diskSum(t, c.byName(otherCopy(final)), "guest", d); a != b {
			t.Fatalf("%s: the copies differ after the resync: %s on %s, %s on the other", d, a, prim.name, b)
		}
		t.Logf("%s: records 0..%d intact on %s (primary at term %d) and on its copy; %d flushes", d, n-1, prim.name,
			final.Term, stats[d].FlushOperations)
	}
	t.Logf("%d failover(s) under the guest: from the kill to the guest's next writes %v", cycles, stalls)
}

func bothInSync(v api.Volume) bool {
	n := 0
	for _, cp := range v.Copies {
		if cp.State == api.CopyInSync {
			n++
		}
	}
	return n == 2
}

func otherCopy(v api.Volume) string {
	for _, n := range copyNodes(v) {
		if n != v.Primary {
			return n
		}
	}
	return ""
}

// buildWriterGuest builds the test/migration guest: testguest's virtio-blk
// kernel and an initramfs whose /init runs the guest writer on every disk
// of disks (the guest's device names, in the order it numbers them).
func buildWriterGuest(t *testing.T, disks []string) (*testguest.Kernel, string) {
	t.Helper()
	k, initrd, err := testguest.BuildWriter(t.TempDir(), disks)
	if errors.Is(err, testguest.ErrMissing) {
		testfs.SkipOrFail(t, "%v", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	return k, initrd
}

// guestVM is QEMU in the hub namespace with QMP on a unix socket.
type guestVM struct {
	*testguest.VM
	disks []string
	out   *testserver.LogBuffer
	qmp   *testguest.QMP
}

// nodesName makes the host name quiver-nbd, in the hub namespace only,
// resolve to the nodes' addresses in that order: `ip netns exec` mounts
// /etc/netns/<namespace>/hosts over /etc/hosts, and getaddrinfo returns
// every address of a name in /etc/hosts, which QEMU tries in turn when it
// connects and reconnects. Called again, it rewrites the file in place (the
// mount is of its inode), and QEMU's next lookup reads the new order.
func (c *cluster) nodesName(t *testing.T, nodes ...*node) string {
	t.Helper()
	dir := filepath.Join("/etc/netns", c.net.Hub)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	hosts := "127.0.0.1 localhost\n"
	for _, nd := range nodes {
		hosts += nd.ip + " quiver-nbd\n"
	}
	if err := os.WriteFile(filepath.Join(dir, "hosts"), []byte(hosts), 0o644); err != nil {
		t.Fatal(err)
	}
	return "quiver-nbd"
}

// dropSYN makes nd's NBD port drop (on) or again refuse (off) new
// connections, as a host that is gone would: no reset comes back.
func (c *cluster) dropSYN(t *testing.T, nd *node, on bool) {
	t.Helper()
	op := "-D"
	if on {
		op = "-A"
	}
	run(t, "ip", "netns", "exec", nd.ns, "iptables", "-w", op, "INPUT", "-p", "tcp", "--dport", "10809", "--syn", "-j", "DROP")
}

// qemuConns lists the peers of the hub namespace's established TCP
// connections to NBD port 10809 (QEMU's; the test's own API connections
// go to port 7480).
func (c *cluster) qemuConns(t *testing.T) string {
	t.Helper()
	out, err := exec.Command("ip", "netns", "exec", c.net.Hub, "ss", "-Htn", "state", "established", "dport", "10809").CombinedOutput()
	if err != nil {
		t.Fatalf("ss: %v: %s", err, out)
	}
	var peers []string
	for line := range strings.Lines(string(out)) {
		if f := strings.Fields(line); len(f) >= 4 {
			peers = append(peers, f[3])
		}
	}
	slices.Sort(peers)
	return strings.Join(peers, ",")
}

// startGuestVM boots the guest with each disk of volume "guest" on QEMU's
// NBD client, connected to servers[disk] port 10809 with reconnect-delay.
// startGuestVM starts QEMU in the hub namespace with a virtio-blk disk for
// each of disks, each an NBD blockdev whose server and export source(d)
// gives, with reconnect-delay; extra are more QEMU arguments.
func startGuestVM(t *testing.T, c *cluster, k *testguest.Kernel, initrd string, disks []string, source func(d string) map[string]any, extra ...string) *guestVM {
	t.Helper()
	return startGuestVMRaw(t, c, k, initrd, disks, func(_ int, d string) []string {
		bd := map[string]any{
			"driver":    "nbd",
			"node-name": "disk-" + d,
			// A request on a broken connection waits up to
			// reconnect-delay seconds for a new one before it fails
			// (QEMU's default is 0: at once).
			"reconnect-delay": reconnectDelay(t),
		}
		maps.Copy(bd, source(d))
		return []string{"-blockdev", jsonArg(t, bd), "-device", "virtio-blk-pci,drive=disk-" + d + ",id=" + d}
	}, extra...)
}

// jsonArg is v in JSON, for a QEMU argument.
func jsonArg(t *testing.T, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func itoa(n int64) string { return strconv.FormatInt(n, 10) }

// startGuestVMRaw starts QEMU in the hub namespace with the arguments
// drive(i, d) gives for each of disks (a block node named "disk-"+d, which
// query-blockstats reports); extra are more QEMU arguments.
func startGuestVMRaw(t *testing.T, c *cluster, k *testguest.Kernel, initrd string, disks []string, drive func(i int, d string) []string, extra ...string) *guestVM {
	t.Helper()
	dir, err := os.MkdirTemp("", "qgf") // short: a unix socket path
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	vm := &guestVM{out: &testserver.LogBuffer{}, disks: disks}
	console, qmpPath := filepath.Join(dir, "console"), filepath.Join(dir, "qmp")
	args := append([]string{"netns", "exec", c.net.Hub, "qemu-system-x86_64"}, testguest.QEMUArgs(k, initrd, console)...)
	args = append(args, "-qmp", "unix:"+qmpPath+",server=on,wait=off")
	for i, d := range disks {
		args = append(args, drive(i, d)...)
	}
	args = append(args, extra...)
	cmd := exec.Command("ip", args...)
	cmd.Stdout, cmd.Stderr = vm.out, vm.out
	if vm.VM, err = testguest.StartVM(cmd, console); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		vm.Kill()
		if vm.qmp != nil {
			vm.qmp.Close()
		}
		if t.Failed() {
			t.Logf("--- guest console ---\n%s\n--- QEMU ---\n%s", testserver.Tail(vm.ConsoleText(), 40), vm.out.String())
		}
	})
	qctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if vm.qmp, err = testguest.DialQMP(qctx, qmpPath); err != nil {
		t.Fatal(err)
	}
	return vm
}

// reconnectDelay is QEMU's reconnect-delay for the guest's disks:
// QUIVER_GUEST_RECONNECT_DELAY seconds, default 60. With 0, or less than
// a failover takes, the guest's requests on vdb fail (see docs/cluster.md).
func reconnectDelay(t *testing.T) int {
	t.Helper()
	s := os.Getenv("QUIVER_GUEST_RECONNECT_DELAY")
	if s == "" {
		return 60
	}
	n, err := strconv.Atoi(s)
	if err != nil || n < 0 {
		t.Fatalf("QUIVER_GUEST_RECONNECT_DELAY=%q: want seconds", s)
	}
	return n
}

// diskStats are the counters of QMP query-blockstats the test reads.
type diskStats struct {
	WrOperations          int64 `json:"wr_operations"`
	FailedWrOperations    int64 `json:"failed_wr_operations"`
	FlushOperations       int64 `json:"flush_operations"`
	FailedFlushOperations int64 `json:"failed_flush_operations"`
	FailedRdOperations    int64 `json:"failed_rd_operations"`
}

// writes returns query-blockstats per disk.
func (vm *guestVM) writes(t *testing.T) map[string]diskStats {
	t.Helper()
	var list []struct {
		NodeName string    `json:"node-name"`
		Stats    diskStats `json:"stats"`
	}
	if err := vm.qmp.Execute(context.Background(), "query-blockstats", nil, &list); err != nil {
		t.Fatal(err)
	}
	out := map[string]diskStats{}
	for _, e := range list {
		if d, ok := strings.CutPrefix(e.NodeName, "disk-"); ok {
			out[d] = e.Stats
		}
	}
	if len(out) != len(vm.disks) {
		t.Fatalf("query-blockstats names %d of the %d disks: %+v", len(out), len(vm.disks), list)
	}
	return out
}

// waitWrites waits until QEMU has completed at least n writes on every
// disk, failing the test at once when a request failed or the console
// shows trouble.
func (vm *guestVM) waitWrites(t *testing.T, n int64, limit time.Duration) {
	t.Helper()
	deadline := time.Now().Add(limit)
	for {
		stats := vm.writes(t)
		done := true
		for d, s := range stats {
			if s.FailedWrOperations+s.FailedFlushOperations+s.FailedRdOperations != 0 {
				t.Fatalf("disk %s: failed requests: %+v", d, s)
			}
			done = done && s.WrOperations >= n
		}
		vm.checkConsole(t)
		if done {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("waiting for %d writes per disk, have %+v after %v", n, stats, limit)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// checkHealthy fails the test unless every disk's io-status is ok, no
// request failed, and the console is clean.
func (vm *guestVM) checkHealthy(t *testing.T) {
	t.Helper()
	var list []struct {
		IOStatus string `json:"io-status"`
		Inserted struct {
			NodeName string `json:"node-name"`
		} `json:"inserted"`
	}
	if err := vm.qmp.Execute(context.Background(), "query-block", nil, &list); err != nil {
		t.Fatal(err)
	}
	for _, e := range list {
		if e.IOStatus != "" && e.IOStatus != "ok" {
			t.Errorf("%s: io-status %q", e.Inserted.NodeName, e.IOStatus)
		}
	}
	for d, s := range vm.writes(t) {
		if s.FailedWrOperations+s.FailedFlushOperations+s.FailedRdOperations != 0 {
			t.Errorf("disk %s: failed requests: %+v", d, s)
		}
	}
	vm.checkConsole(t)
}

func (vm *guestVM) checkConsole(t *testing.T) {
	t.Helper()
	for line := range strings.Lines(vm.ConsoleText()) {
		for _, bad := range guestConsoleTrouble {
			if strings.Contains(line, bad) {
				t.Fatalf("guest console: %s", strings.TrimSpace(line))
			}
		}
	}
}
