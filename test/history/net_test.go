package historytest

import (
	"fmt"
	"os/exec"
	"strings"
	"testing"

	"github.com/quiverstorage/quiver/internal/testnet"
)

// subnet is the bridge's network, inside the test's own namespaces only:
// the hub is .1, node i is .10+i. test/cluster uses 10.77.0.0/24; the two
// never share a namespace, so the same addresses would do, but another one
// keeps their logs apart.
const subnet = "10.78.0."

// network is the test's hosts (internal/testnet), their veth pairs named
// apart from test/cluster's.
type network = testnet.Network

func newNetwork(t *testing.T) *network { return testnet.New(t, subnet, "qvh", "h") }

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
