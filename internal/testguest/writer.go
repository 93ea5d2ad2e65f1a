package testguest

import (
	"fmt"
	"path/filepath"
	"strings"
)

// WriterPkg is the guest writer (test/migration/guestwriter): it writes
// numbered records to every disk it is given, each an O_DIRECT|O_SYNC
// pwrite, and test/migration/record counts them back.
const WriterPkg = "github.com/quiverstorage/quiver/test/migration/guestwriter"

// WriterTrouble are console lines of a writer guest that saw an I/O error
// or worse: the kernel's block layer, a filesystem's "WRITE ERROR", the
// writer's own error and a full disk, /init's complaints, panics.
var WriterTrouble = []string{"I/O error", "WRITE ERROR", "guestwriter: I/O", "disks full", "init: ",
	"Kernel panic", "BUG:", "Oops", "WARNING:", "segfault"}

// BuildWriter builds, in dir, a guest whose /init runs the guest writer on
// /dev/<disk> for each of disks (record disk 0, 1, ... in that order) after
// printing each virtio disk's serial, and idles if the writer ever exits;
// it returns the kernel and the initramfs. ErrMissing when a tool is.
func BuildWriter(dir string, disks []string) (*Kernel, string, error) {
	gw, err := GoProgram(WriterPkg, dir, "guestwriter")
	if err != nil {
		return nil, "", err
	}
	initrd := filepath.Join(dir, "initramfs.cpio")
	k, err := Build(VirtioBlk, initrd, fmt.Sprintf(`for b in /sys/block/vd*; do echo "guest: serial ${b##*/}=$(cat $b/serial 2>/dev/null)"; done
guestwriter /dev/%s
echo "init: guestwriter exited with status $?"
while :; do sleep 3600; done
`, strings.Join(disks, " /dev/")), gw)
	if err != nil {
		return nil, "", err
	}
	return k, initrd, nil
}
