package testfs

import (
	"fmt"
	"os"
	"strings"
	"unsafe"

	"golang.org/x/sys/unix"
)

// XFS_IOC_GOINGDOWN (_IOR('X', 125, __u32)) and its flag that drops the
// in-memory log, from the kernel's xfs_fs.h.
const (
	xfsIOCGoingDown        = 0x8004587d
	xfsGoingDownNoLogFlush = 0x2
)

// ShutdownXFS shuts down the XFS mounted at mnt as a crash would: without
// flushing its log, so what the log holds in memory is lost and what
// reached the device stays. Every later call on the filesystem fails with
// EIO until it is unmounted and mounted again (log recovery). It needs
// root (CAP_SYS_ADMIN).
func ShutdownXFS(mnt string) error {
	d, err := os.Open(mnt)
	if err != nil {
		return err
	}
	defer d.Close()
	flags := uint32(xfsGoingDownNoLogFlush)
	if _, _, e := unix.Syscall(unix.SYS_IOCTL, d.Fd(), xfsIOCGoingDown, uintptr(unsafe.Pointer(&flags))); e != 0 {
		return fmt.Errorf("XFS_IOC_GOINGDOWN on %s: %w", mnt, e)
	}
	return nil
}

// Remount unmounts the filesystem mounted at mnt and mounts its device
// there again, as a restart after a crash does: XFS replays its log. Files
// still open on it make the unmount fail.
func Remount(mnt string) error {
	b, err := os.ReadFile("/proc/self/mounts")
	if err != nil {
		return err
	}
	var dev, fstype string
	for _, l := range strings.Split(string(b), "\n") {
		if f := strings.Fields(l); len(f) >= 3 && f[1] == mnt {
			dev, fstype = f[0], f[2]
		}
	}
	if dev == "" {
		return fmt.Errorf("remount: nothing is mounted at %s", mnt)
	}
	if err := unix.Unmount(mnt, 0); err != nil {
		return fmt.Errorf("remount: unmount %s: %w", mnt, err)
	}
	if err := unix.Mount(dev, mnt, fstype, 0, ""); err != nil {
		return fmt.Errorf("remount: mount %s at %s: %w", dev, mnt, err)
	}
	return nil
}
