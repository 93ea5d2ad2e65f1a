package security

import (
	"os"
	"testing"

	"github.com/quiverstorage/quiver/internal/testserver"
)

// quiverBin is the server binary, built once by TestMain.
var quiverBin string

func TestMain(m *testing.M) {
	if spec := os.Getenv(floodEnv); spec != "" { // a flooder process (flood_test.go)
		os.Exit(flood(spec))
	}
	if bin := os.Getenv(childBinEnv); bin != "" { // re-executed inside a network namespace
		quiverBin = bin
		os.Exit(m.Run())
	}
	os.Exit(testserver.MainWithBinary(m, &quiverBin))
}

// childBinEnv carries the server binary's path to the test binary when it
// re-executes itself inside a network namespace (TestAbuse).
const childBinEnv = "QUIVER_SECURITY_CHILD_BIN"
