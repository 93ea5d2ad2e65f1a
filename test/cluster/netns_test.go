package clustertest

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/quiverstorage/quiver/internal/testfs"
)

// subnet is the bridge's network, inside the test's own namespaces only:
// the hub is .1, node i is .10+i.
const subnet = "10.77.0."

// network is a hub namespace with a bridge, and a namespace per node with a
// veth pair to the bridge.
type network struct {
	t      *testing.T
	prefix string // of every namespace name: unique per test process
	hub    string
}

func run(t *testing.T, args ...string) {
	t.Helper()
	if out, err := exec.Command(args[0], args[1:]...).CombinedOutput(); err != nil {
		t.Fatalf("%s: %v: %s", strings.Join(args, " "), err, out)
	}
}

// newNetwork makes the hub namespace; t.Cleanup deletes every namespace it
// made (after the processes in them, registered later, are killed).
func newNetwork(t *testing.T) *network {
	t.Helper()
	testfs.RequireRoot(t)
	testfs.RequireTool(t, "ip")
	// QUIVER_NETNS_PREFIX (default qvc) starts every namespace name, so
	// that runs by different people on one machine never share one.
	pfx := os.Getenv("QUIVER_NETNS_PREFIX")
	if pfx == "" {
		pfx = "qvc"
	}
	n := &network{t: t, prefix: fmt.Sprintf("%s%d-", pfx, os.Getpid())}
	n.hub = n.prefix + "hub"
	if out, err := exec.Command("ip", "netns", "add", n.hub).CombinedOutput(); err != nil {
		testfs.SkipOrFail(t, "ip netns add: %v: %s", err, out)
	}
	t.Cleanup(func() { n.del(n.hub) })
	run(t, "ip", "-n", n.hub, "link", "set", "lo", "up")
	run(t, "ip", "-n", n.hub, "link", "add", "br0", "type", "bridge")
	run(t, "ip", "-n", n.hub, "addr", "add", subnet+"1/24", "dev", "br0")
	run(t, "ip", "-n", n.hub, "link", "set", "br0", "up")
	return n
}

func (n *network) del(ns string) {
	if out, err := exec.Command("ip", "netns", "del", ns).CombinedOutput(); err != nil {
		n.t.Errorf("ip netns del %s: %v: %s", ns, err, out)
	}
}

// addNode makes node i's namespace with its address on the bridge and
// returns the namespace's name and the address.
func (n *network) addNode(i int) (ns, ip string) {
	t := n.t
	t.Helper()
	ns, ip = fmt.Sprintf("%sn%d", n.prefix, i), fmt.Sprintf("%s%d", subnet, 10+i)
	run(t, "ip", "netns", "add", ns)
	t.Cleanup(func() { n.del(ns) })
	host, peer := fmt.Sprintf("h%d", i), fmt.Sprintf("v%d", i)
	run(t, "ip", "link", "add", host, "netns", n.hub, "type", "veth", "peer", "name", peer, "netns", ns)
	run(t, "ip", "-n", n.hub, "link", "set", host, "master", "br0", "up")
	run(t, "ip", "-n", ns, "addr", "add", ip+"/24", "dev", peer)
	run(t, "ip", "-n", ns, "link", "set", peer, "up")
	run(t, "ip", "-n", ns, "link", "set", "lo", "up")
	return ns, ip
}

// dial makes TCP connections from inside the hub namespace: the calling
// goroutine's thread enters it for the socket() call (a socket stays in the
// namespace it was made in) and leaves it again. A thread that cannot leave
// stays locked and dies with its goroutine.
func (n *network) dial(ctx context.Context, network, addr string) (net.Conn, error) {
	runtime.LockOSThread()
	self, err := os.Open("/proc/thread-self/ns/net")
	if err != nil {
		runtime.UnlockOSThread()
		return nil, err
	}
	defer self.Close()
	target, err := os.Open("/run/netns/" + n.hub)
	if err != nil {
		runtime.UnlockOSThread()
		return nil, err
	}
	defer target.Close()
	if err := unix.Setns(int(target.Fd()), unix.CLONE_NEWNET); err != nil {
		runtime.UnlockOSThread()
		return nil, fmt.Errorf("setns %s: %w", n.hub, err)
	}
	var d net.Dialer
	conn, derr := d.DialContext(ctx, network, addr)
	if err := unix.Setns(int(self.Fd()), unix.CLONE_NEWNET); err == nil {
		runtime.UnlockOSThread()
	}
	return conn, derr
}
