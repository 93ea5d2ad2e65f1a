package clustertest

import (
	"testing"

	"github.com/quiverstorage/quiver/internal/testnet"
)

// subnet is the bridge's network, inside the test's own namespaces only:
// the hub is .1, node i is .10+i.
const subnet = "10.77.0."

// network is the test's hosts (internal/testnet).
type network = testnet.Network

// newNetwork makes the hub namespace; t.Cleanup deletes every namespace it
// made (after the processes in them, registered later, are killed).
func newNetwork(t *testing.T) *network { return testnet.New(t, subnet, "qvc", "") }

func run(t *testing.T, args ...string) {
	t.Helper()
	testnet.Run(t, args...)
}
