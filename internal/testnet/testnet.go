// Package testnet is test support: several hosts on one machine for the
// cluster tests, each in a network namespace of its own with an address
// on a bridge in a hub namespace, and connections made from the hub (how
// a test's clients reach the hosts). It needs root and iproute2; without
// them a test skips, or fails when CI is set.
//
// Imports from quiver: testfs.
package testnet

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

// Network is a hub namespace with a bridge, and a namespace per host with a
// veth pair to the bridge.
type Network struct {
	t      *testing.T
	prefix string // of every namespace name: unique per test process
	// Subnet is the bridge's /24 ("10.77.0."): the hub is .1, host i is
	// .10+i.
	Subnet string
	// Hub is the hub namespace's name.
	Hub  string
	veth string
}

// Run runs a command and fails the test if it fails.
func Run(t *testing.T, args ...string) {
	t.Helper()
	if out, err := exec.Command(args[0], args[1:]...).CombinedOutput(); err != nil {
		t.Fatalf("%s: %v: %s", strings.Join(args, " "), err, out)
	}
}

// New makes the hub namespace on subnet ("10.77.0."); t.Cleanup deletes
// every namespace it made (after the processes in them, registered later,
// are killed). Namespace names start with $QUIVER_NETNS_PREFIX (default
// prefix) and the process ID, so runs by different people on one machine
// never share one; tag starts the names of the veth pairs, so two suites
// of one machine keep theirs apart.
func New(t *testing.T, subnet, prefix, tag string) *Network {
	t.Helper()
	testfs.RequireRoot(t)
	testfs.RequireTool(t, "ip")
	if p := os.Getenv("QUIVER_NETNS_PREFIX"); p != "" {
		prefix = p
	}
	n := &Network{t: t, prefix: fmt.Sprintf("%s%d-", prefix, os.Getpid()), Subnet: subnet, veth: tag}
	n.Hub = n.prefix + "hub"
	if out, err := exec.Command("ip", "netns", "add", n.Hub).CombinedOutput(); err != nil {
		testfs.SkipOrFail(t, "ip netns add: %v: %s", err, out)
	}
	t.Cleanup(func() { n.del(n.Hub) })
	Run(t, "ip", "-n", n.Hub, "link", "set", "lo", "up")
	Run(t, "ip", "-n", n.Hub, "link", "add", "br0", "type", "bridge")
	Run(t, "ip", "-n", n.Hub, "addr", "add", subnet+"1/24", "dev", "br0")
	Run(t, "ip", "-n", n.Hub, "link", "set", "br0", "up")
	return n
}

func (n *Network) del(ns string) {
	if out, err := exec.Command("ip", "netns", "del", ns).CombinedOutput(); err != nil {
		n.t.Errorf("ip netns del %s: %v: %s", ns, err, out)
	}
}

// AddNode makes host i's namespace with its address on the bridge and
// returns the namespace's name and the address.
func (n *Network) AddNode(i int) (ns, ip string) {
	t := n.t
	t.Helper()
	ns, ip = fmt.Sprintf("%sn%d", n.prefix, i), fmt.Sprintf("%s%d", n.Subnet, 10+i)
	Run(t, "ip", "netns", "add", ns)
	t.Cleanup(func() { n.del(ns) })
	host, peer := fmt.Sprintf("%sh%d", n.veth, i), fmt.Sprintf("%sv%d", n.veth, i)
	Run(t, "ip", "link", "add", host, "netns", n.Hub, "type", "veth", "peer", "name", peer, "netns", ns)
	Run(t, "ip", "-n", n.Hub, "link", "set", host, "master", "br0", "up")
	Run(t, "ip", "-n", ns, "addr", "add", ip+"/24", "dev", peer)
	Run(t, "ip", "-n", ns, "link", "set", peer, "up")
	Run(t, "ip", "-n", ns, "link", "set", "lo", "up")
	return ns, ip
}

// HostLink is the name of host i's end of its veth pair in the hub
// namespace (down: the host is cut off).
func (n *Network) HostLink(i int) string { return fmt.Sprintf("%sh%d", n.veth, i) }

// Dial makes TCP connections from inside the hub namespace (inHub).
func (n *Network) Dial(ctx context.Context, network, addr string) (conn net.Conn, err error) {
	err = n.inHub(func() error {
		var d net.Dialer
		conn, err = d.DialContext(ctx, network, addr)
		return err
	})
	return conn, err
}

// Listen listens inside the hub namespace (inHub): a server of the test
// process (an S3 server) that the nodes reach at the hub's address.
func (n *Network) Listen(network, addr string) (ln net.Listener, err error) {
	err = n.inHub(func() error {
		ln, err = net.Listen(network, addr)
		return err
	})
	return ln, err
}

// inHub runs fn with the calling goroutine's thread in the hub namespace,
// for the socket() calls fn makes (a socket stays in the namespace it was
// made in), then leaves it again. A thread that cannot leave stays locked
// and dies with its goroutine.
func (n *Network) inHub(fn func() error) error {
	runtime.LockOSThread()
	self, err := os.Open("/proc/thread-self/ns/net")
	if err != nil {
		runtime.UnlockOSThread()
		return err
	}
	defer self.Close()
	target, err := os.Open("/run/netns/" + n.Hub)
	if err != nil {
		runtime.UnlockOSThread()
		return err
	}
	defer target.Close()
	if err := unix.Setns(int(target.Fd()), unix.CLONE_NEWNET); err != nil {
		runtime.UnlockOSThread()
		return fmt.Errorf("setns %s: %w", n.Hub, err)
	}
	ferr := fn()
	if err := unix.Setns(int(self.Fd()), unix.CLONE_NEWNET); err == nil {
		runtime.UnlockOSThread()
	}
	return ferr
}
