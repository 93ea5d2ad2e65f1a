package nodeplugin

import (
	"os"
	"testing"

	"github.com/quiverstorage/quiver/internal/testserver"
)

var quiverBin string // built once by TestMain

func TestMain(m *testing.M) { os.Exit(testserver.MainWithBinary(m, &quiverBin)) }
