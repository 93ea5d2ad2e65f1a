package powercut

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/quiverstorage/quiver/internal/testfs"
	"github.com/quiverstorage/quiver/internal/testguest"
)

var (
	guestOnce  sync.Once
	theGuest   *guest
	guestErr   error
	guestDir   string
	guestToken string
)

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "qpc")
	if err != nil {
		fmt.Fprintln(os.Stderr, "powercut:", err)
		os.Exit(1)
	}
	guestDir = dir
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// requireGuest returns the guest to boot, building it on first use, and the
// API token its quiver requires.
func requireGuest(t *testing.T) (*guest, string) {
	t.Helper()
	for _, tool := range []string{"qemu-system-x86_64", "mkfs.xfs", "go"} {
		testfs.RequireTool(t, tool)
	}
	guestOnce.Do(func() {
		var b [16]byte
		_, _ = rand.Read(b[:])
		guestToken = hex.EncodeToString(b[:])
		start := time.Now()
		theGuest, guestErr = buildGuest(guestDir, guestToken)
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
	return theGuest, guestToken
}

// poolDiskSize is the pool disk: XFS refuses to make a filesystem under
// 300 MiB. The file is sparse; only what XFS writes takes space.
const poolDiskSize = 320 << 20

// newMedium formats a sparse image in dir as XFS (4 KiB sectors and blocks,
// reflink on: quiver's snapshots and clones reflink) and opens it as the
// pool disk's medium.
func newMedium(t *testing.T, dir string) *medium {
	t.Helper()
	path := filepath.Join(dir, "pool.img")
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Truncate(poolDiskSize); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command("mkfs.xfs", "-q", "-f", "-s", "size=4096", "-b", "size=4096", "-m", "reflink=1", path).CombinedOutput()
	if err != nil {
		t.Fatalf("mkfs.xfs: %v\n%s", err, out)
	}
	t.Cleanup(func() { f.Close() })
	return &medium{f: f, size: poolDiskSize}
}
