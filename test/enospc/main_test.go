package enospc

import (
	"os"
	"testing"

	"github.com/quiverstorage/quiver/internal/testserver"
)

var quiverBin string // the server binary, built once by TestMain

func TestMain(m *testing.M) { os.Exit(testserver.MainWithBinary(m, &quiverBin)) }
