package testfs

import (
	"fmt"
	"os"
	"strings"
	"time"
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
// still open on it make the unmount fail (after 5 s of retries, for closes
// still under way).
//
// The unmount must end the filesystem's superblock, or the mount finds it
// still alive (after ShutdownXFS: shut down, every call EIO) and replays
// nothing. A process that made its own mount namespace (ip netns exec,
// unshare --mount) while mnt was mounted holds a copy of the mount, which
// keeps the superblock alive where mount propagation does not reach it.
// Remount drops such copies by removing the directory mnt and making it
// again (the kernel detaches mounts on a removed directory in every other
// namespace), then waits for the device to be free.
func Remount(mnt string) error {
	dev, fstype, err := MountSource(mnt)
	if err != nil {
		return fmt.Errorf("remount: %w", err)
	}
	for range 100 {
		if err = unix.Unmount(mnt, 0); err != unix.EBUSY {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if err != nil {
		return fmt.Errorf("remount: unmount %s: %w", mnt, err)
	}
	fi, err := os.Stat(mnt) // the directory under the mount
	if err != nil {
		return fmt.Errorf("remount: %w", err)
	}
	if err := os.Remove(mnt); err != nil {
		return fmt.Errorf("remount: %w", err)
	}
	if err := os.Mkdir(mnt, fi.Mode().Perm()); err != nil {
		return fmt.Errorf("remount: %w", err)
	}
	if err := waitFree(dev, 10*time.Second); err != nil {
		return fmt.Errorf("remount: %w", err)
	}
	if err := unix.Mount(dev, mnt, fstype, 0, ""); err != nil {
		return fmt.Errorf("remount: mount %s at %s: %w", dev, mnt, err)
	}
	return nil
}

// waitFree waits until no filesystem holds the block device dev: an
// exclusive open succeeds only then.
func waitFree(dev string, d time.Duration) error {
	deadline := time.Now().Add(d)
	for {
		fd, err := unix.Open(dev, unix.O_RDONLY|unix.O_EXCL|unix.O_CLOEXEC, 0)
		if err == nil {
			return unix.Close(fd)
		}
		if err != unix.EBUSY || time.Now().After(deadline) {
			return fmt.Errorf("%s is still in use %v after its unmount (mounted elsewhere?): %w", dev, d, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// MountSource returns the device mounted at mnt and its filesystem type,
// from /proc/self/mounts (the last mount there, the one in view).
func MountSource(mnt string) (dev, fstype string, err error) {
	b, err := os.ReadFile("/proc/self/mounts")
	if err != nil {
		return "", "", err
	}
	for _, l := range strings.Split(string(b), "\n") {
		if f := strings.Fields(l); len(f) >= 3 && f[1] == mnt {
			dev, fstype = f[0], f[2]
		}
	}
	if dev == "" {
		return "", "", fmt.Errorf("nothing is mounted at %s", mnt)
	}
	return dev, fstype, nil
}
