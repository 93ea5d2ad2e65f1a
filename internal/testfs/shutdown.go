package testfs

import (
	"fmt"
	"os"
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
