package migration

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"github.com/quiverstorage/quiver/internal/testguest"
)

// guestKernel is what the guest needs of the kernel: virtio-blk disks on
// virtio-pci.
var guestKernel = testguest.KernelSpec{
	Modules: []string{"virtio_pci", "virtio_blk"},
	Config: map[string][]string{
		"CONFIG_VIRTIO_PCI": {"y", "m"},
		"CONFIG_VIRTIO_BLK": {"y", "m"},
	},
}

// guestDisks are the guest's disks, in the order the guest writer numbers
// them (record disk 0, 1): the quiver disk names, which are also the QEMU
// device ids and the guest's device names.
var guestDisks = []string{"vda", "vdb"}

// guest is what QEMU boots: the kernel and an initramfs whose /init loads
// the virtio modules and runs the guest writer on every disk.
type guest struct {
	kernel *testguest.Kernel
	initrd string
}

// buildGuest builds the initramfs in dir (testguest: busybox-static, the
// kernel's virtio modules, /dev/console) with the guest writer, built here
// for linux/amd64 without cgo, and /init.
func buildGuest(dir string) (*guest, error) {
	k, err := testguest.FetchKernel(guestKernel)
	if err != nil {
		return nil, err
	}
	writer := filepath.Join(dir, "guestwriter")
	build := exec.Command("go", "build", "-trimpath", "-ldflags=-s -w", "-o", writer, "./guestwriter")
	build.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux", "GOARCH=amd64")
	if out, err := build.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("build the guest writer: %v\n%s", err, out)
	}
	gw, err := os.ReadFile(writer)
	if err != nil {
		return nil, err
	}

	g := &guest{kernel: k, initrd: filepath.Join(dir, "initramfs.cpio")}
	w, err := testguest.NewInitramfs(g.initrd, k)
	if err != nil {
		return nil, err
	}
	w.File("bin/guestwriter", 0o755, gw)
	w.File("init", 0o755, []byte(initScript(k)))
	if err := w.Close(); err != nil {
		return nil, fmt.Errorf("write %s: %w", g.initrd, err)
	}
	return g, nil
}

// initScript is the guest's /init: mount the pseudo filesystems, load the
// modules in order, run the guest writer, and idle if it ever exits so that
// the test can still inspect the VM.
func initScript(k *testguest.Kernel) string {
	return `#!/bin/sh
export PATH=/bin
mount -t devtmpfs devtmpfs /dev
mount -t proc proc /proc
mount -t sysfs sysfs /sys
` + testguest.InsmodLines(k) + fmt.Sprintf(`guestwriter /dev/%s
echo "init: guestwriter exited with status $?"
while :; do sleep 3600; done
`, strings.Join(guestDisks, " /dev/"))
}
