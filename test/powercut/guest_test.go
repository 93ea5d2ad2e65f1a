package powercut

import (
	"fmt"
	"path/filepath"

	"github.com/quiverstorage/quiver/internal/testguest"
)

// guestKernel is what the guest needs: the pool's disk (virtio-blk over
// virtio-pci) formatted XFS, and a network card for the API and NBD.
// Debian's cloud kernel boots in about half the CPU time of the generic
// one under TCG. Its crc32c is built in: XFS checksums with it through the
// crypto API, and no modprobe could load one here.
var guestKernel = testguest.KernelSpec{
	Flavour: "cloud-amd64",
	Modules: []string{"virtio_pci", "virtio_blk", "virtio_net", "xfs"},
	Config: map[string][]string{
		"CONFIG_VIRTIO_PCI":    {"y", "m"},
		"CONFIG_VIRTIO_BLK":    {"y", "m"},
		"CONFIG_VIRTIO_NET":    {"y", "m"},
		"CONFIG_XFS_FS":        {"y", "m"},
		"CONFIG_INET":          {"y"},
		"CONFIG_CRYPTO_CRC32C": {"y"},
	},
}

// Guest ports, forwarded from loopback ports of the host by QEMU's user
// networking.
const (
	guestAPIPort = 7480
	guestNBDPort = 10809
)

// Where the guest mounts its pool disk's XFS, and what quiver keeps there:
// the pool, and the key file of the encrypted volumes' KEKs, which the
// server refuses inside the pool and which must survive the cuts as the
// pool does.
const (
	guestDiskDir = "/mnt/disk"
	guestPoolDir = guestDiskDir + "/pool"
	guestKeyFile = guestDiskDir + "/keys.json"
)

// Console lines of /init that the test waits for or rejects.
const (
	consoleMounted   = "powercut: pool mounted"
	consoleMountFail = "powercut: mount failed"
	consoleQuiverEnd = "powercut: quiver exited"
	consoleCache     = "powercut: write_cache "
)

// guest is what QEMU boots: Debian's kernel and an initramfs whose /init
// mounts the pool's XFS and runs quiver.
type guest struct {
	kernel *testguest.Kernel
	initrd string
}

// buildGuest builds, in dir, a static quiver (testguest.GoProgram) and the
// initramfs holding it, the API token and /init.
func buildGuest(dir, token string) (*guest, error) {
	quiver, err := testguest.GoProgram("github.com/quiverstorage/quiver/cmd/quiver", dir, "quiver")
	if err != nil {
		return nil, err
	}
	g := &guest{initrd: filepath.Join(dir, "initramfs.cpio")}
	g.kernel, err = testguest.Build(guestKernel, g.initrd, initBody, quiver,
		testguest.File{Path: "etc/quiver-token", Mode: 0o600, Data: []byte(token + "\n")})
	if err != nil {
		return nil, err
	}
	return g, nil
}

// initBody is the guest's /init after testguest's Prologue (which loads
// the modules): report whether the disk has a write cache (the kernel then
// sends flushes), bring up the network (QEMU's user networking: 10.0.2.15,
// gateway 10.0.2.2), mount the pool disk's XFS at /mnt/disk (log recovery
// after a cut happens here) and run quiver with its pool in /mnt/disk/pool
// and its key file (the KEKs of encrypted volumes) beside it, on the same
// disk but outside the pool as the server requires, its log in RAM: the
// serial console under TCG is slow. The pool directory is made, and the
// disk synced, at the first boot. The console shows the guest's uptime when the pool is
// mounted and when quiver is ready. If quiver exits, the tail of its log
// goes to the console.
var initBody = `echo "` + consoleCache + `$(cat /sys/block/vda/queue/write_cache)"
ip link set lo up
ip link set eth0 up
ip addr add 10.0.2.15/24 dev eth0
ip route add default via 10.0.2.2
# Write dirty pages back within 0.1 s: the disk's cache then holds
# unflushed writes when the power goes, instead of the guest's page cache
# holding everything until an fsync.
echo 10 >/proc/sys/vm/dirty_expire_centisecs
echo 10 >/proc/sys/vm/dirty_writeback_centisecs
mkdir -p ` + guestDiskDir + `
if ! mount -t xfs /dev/vda ` + guestDiskDir + `; then
	echo "` + consoleMountFail + `"
	dmesg | tail -n 30
	while :; do sleep 3600; done
fi
if [ ! -d ` + guestPoolDir + ` ]; then
	mkdir ` + guestPoolDir + ` && sync
fi
echo "` + consoleMounted + ` t=$(cut -d' ' -f1 /proc/uptime)"
quiver server --pool ` + guestPoolDir + ` --key-file ` + guestKeyFile + ` --listen 0.0.0.0:` + fmt.Sprint(guestAPIPort) + ` --nbd-listen 0.0.0.0:` + fmt.Sprint(guestNBDPort) + ` --token-file /etc/quiver-token --log-level warn --ready-file /tmp/ready >/tmp/quiver.log 2>&1 &
while [ ! -s /tmp/ready ]; do sleep 0.1; done
echo "powercut: quiver ready t=$(cut -d' ' -f1 /proc/uptime)"
wait
echo "` + consoleQuiverEnd + ` with status $?"
tail -n 40 /tmp/quiver.log
while :; do sleep 3600; done
`
