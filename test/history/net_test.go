package historytest

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
// the hub is .1, node i is .10+i. test/cluster uses 10.77.0.0/24; the two
// never share a namespace, so the same addresses would do, but another one
// keeps their logs apart.
const subnet = "10.78.0."

// network is a hub namespace with a bridge, and a namespace per node with a
// veth pair to the bridge (as test/cluster's).
type network struct {
	t      *testing.T
	prefix string
	hub    string
}

func run(t *testing.T, args ...string) {
	t.Helper()
	if out, err := exec.Command(args[0], args[1:]...).CombinedOutput(); err != nil {
		t.Fatalf("%s: %v: %s", strings.Join(args, " "), err, out)
	}
}

func newNetwork(t *testing.T) *network {
	t.Helper()
	testfs.RequireRoot(t)
	testfs.RequireTool(t, "ip")
	pfx := os.Getenv("QUIVER_NETNS_PREFIX")
	if pfx == "" {
		pfx = "qvh"
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

// addNode makes node i's namespace with its address on the bridge.
func (n *network) addNode(i int) (ns, ip string) {
	t := n.t
	t.Helper()
	ns, ip = fmt.Sprintf("%sn%d", n.prefix, i), fmt.Sprintf("%s%d", subnet, 10+i)
	run(t, "ip", "netns", "add", ns)
	t.Cleanup(func() { n.del(ns) })
	host, peer := fmt.Sprintf("hh%d", i), fmt.Sprintf("hv%d", i)
	run(t, "ip", "link", "add", host, "netns", n.hub, "type", "veth", "peer", "name", peer, "netns", ns)
	run(t, "ip", "-n", n.hub, "link", "set", host, "master", "br0", "up")
	run(t, "ip", "-n", ns, "addr", "add", ip+"/24", "dev", peer)
	run(t, "ip", "-n", ns, "link", "set", peer, "up")
	run(t, "ip", "-n", ns, "link", "set", "lo", "up")
	return ns, ip
}

// dial makes TCP connections from inside the hub namespace: the calling
// goroutine's thread enters it for the socket() call and leaves it again;
// a thread that cannot leave stays locked and dies with its goroutine.
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

// rules adds iptables rules in namespace ns and returns their undo, which
// t.Cleanup also runs.
func rules(t *testing.T, ns string, rs [][]string) (undo func()) {
	t.Helper()
	ipt := func(op string, r []string) error {
		args := append([]string{"netns", "exec", ns, "iptables", "-w", op}, r...)
		if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
			return fmt.Errorf("iptables %s %s: %v: %s", op, strings.Join(r, " "), err, out)
		}
		return nil
	}
	for _, r := range rs {
		if err := ipt("-A", r); err != nil {
			t.Fatal(err)
		}
	}
	done := false
	undo = func() {
		if done {
			return
		}
		done = true
		for _, r := range rs {
			if err := ipt("-D", r); err != nil {
				t.Error(err)
			}
		}
	}
	t.Cleanup(undo)
	return undo
}
