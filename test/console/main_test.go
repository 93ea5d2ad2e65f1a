package console

import (
	"os"
	"testing"

	"github.com/quiverstorage/quiver/internal/testserver"
)

// quiverBin is the server binary, built once by TestMain.
var quiverBin string

func TestMain(m *testing.M) {
	os.Exit(testserver.MainWithBinary(m, &quiverBin))
}
