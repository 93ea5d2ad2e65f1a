package migration

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/quiverstorage/quiver/internal/testfs"
	"github.com/quiverstorage/quiver/internal/testguest"
	"github.com/quiverstorage/quiver/internal/testserver"
)

var (
	quiverBin string // the server binary, built once by TestMain
	workDir   string // per-run scratch: the binary, the guest writer, the initramfs

	guestOnce sync.Once
	theGuest  *guest
	guestErr  error
)

func TestMain(m *testing.M) {
	os.Exit(runTests(m))
}

func runTests(m *testing.M) int {
	var err error
	workDir, err = os.MkdirTemp("", "quiver-migration-")
	if err != nil {
		fmt.Fprintln(os.Stderr, "migration:", err)
		return 1
	}
	defer os.RemoveAll(workDir)
	quiverBin = filepath.Join(workDir, "quiver")
	if err := testserver.Build(quiverBin, testserver.RaceEnabled); err != nil {
		fmt.Fprintln(os.Stderr, "migration:", err)
		return 1
	}
	return m.Run()
}

// requireGuest returns the guest to boot, building it on first use: the
// kernel from the cache or Debian's archive, the initramfs in workDir.
func requireGuest(t *testing.T) *guest {
	t.Helper()
	for _, tool := range []string{"qemu-system-x86_64", "qemu-img", "qemu-io", "apt-cache", "apt-get", "dpkg", "go"} {
		testfs.RequireTool(t, tool)
	}
	guestOnce.Do(func() {
		start := time.Now()
		theGuest, guestErr = buildGuest(workDir)
		if guestErr == nil {
			t.Logf("guest: %s with modules %v, initramfs built in %v",
				theGuest.kernel.Package, theGuest.kernel.Modules, time.Since(start).Round(time.Millisecond))
		}
	})
	if errors.Is(guestErr, testguest.ErrMissing) {
		testfs.SkipOrFail(t, "%v", guestErr)
	}
	if guestErr != nil {
		t.Fatalf("build the guest: %v", guestErr)
	}
	return theGuest
}
