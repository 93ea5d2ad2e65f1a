package migration

import (
	"fmt"
	"path/filepath"
	"strings"

	"github.com/quiverstorage/quiver/internal/testguest"
)

// guestDisks are the guest's disks, in the order the guest writer numbers
// them (record disk 0, 1): the quiver disk names, which are also the QEMU
// device ids and the guest's device names.
var guestDisks = []string{"vda", "vdb"}

// guestWriterPkg is the guest writer's package, built for the guest.
const guestWriterPkg = "github.com/quiverstorage/quiver/test/migration/guestwriter"

// guest is what QEMU boots: the kernel and an initramfs whose /init loads
// the virtio modules and runs the guest writer on every disk.
type guest struct {
	kernel *testguest.Kernel
	initrd string
}

// buildGuest builds the initramfs in dir (testguest: busybox-static, the
// kernel's virtio modules, /dev/console) with the guest writer, built here
// for linux/amd64 without cgo, and /init: testguest's prologue, then the
// guest writer, and idling if it ever exits so that the test can still
// inspect the VM.
func buildGuest(dir string) (*guest, error) {
	gw, err := testguest.GoProgram(guestWriterPkg, dir, "guestwriter")
	if err != nil {
		return nil, err
	}
	g := &guest{initrd: filepath.Join(dir, "initramfs.cpio")}
	g.kernel, err = testguest.Build(testguest.VirtioBlk, g.initrd, fmt.Sprintf(`guestwriter /dev/%s
echo "init: guestwriter exited with status $?"
while :; do sleep 3600; done
`, strings.Join(guestDisks, " /dev/")), gw)
	if err != nil {
		return nil, err
	}
	return g, nil
}
