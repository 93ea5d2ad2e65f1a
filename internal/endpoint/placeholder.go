package endpoint

import (
	"errors"
	"fmt"
	"io/fs"
	"os"

	"golang.org/x/sys/unix"
)

// PlaceholderName is the empty file beside the socket that KubeVirt's
// virt-handler finds as a Filesystem-mode PVC's disk.img: without one it
// would create a sparse disk of the PVC's size in the directory (and fail
// where the directory's filesystem is small). It never holds data: the
// KubeVirt hook gives QEMU the disks on the socket instead, and the file is
// made immutable where the filesystem allows it, so that a VM started
// without the hook fails to open its disk rather than write a node's local
// file.
const PlaceholderName = "disk.img"

// fsImmutableFL is the inode flag FS_IMMUTABLE_FL of linux/fs.h (not in
// x/sys/unix): no write, rename, link or removal, even by root.
const fsImmutableFL = 0x10

// placeholder makes dir's empty, immutable disk.img. Immutability is best
// effort (a filesystem without FS_IMMUTABLE_FL): the returned error says
// so, and the caller logs it.
func placeholder(dir string) (weak error, err error) {
	path := dir + "/" + PlaceholderName
	f, err := os.OpenFile(path, os.O_RDONLY|os.O_CREATE|unix.O_NOFOLLOW, 0o444)
	if err != nil {
		return nil, fmt.Errorf("placeholder %s: %w", path, err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("placeholder %s: %w", path, err)
	}
	if !fi.Mode().IsRegular() || fi.Size() != 0 {
		return nil, fmt.Errorf("placeholder %s: not an empty regular file (%v, %d bytes): it must never hold data", path, fi.Mode(), fi.Size())
	}
	if err := unix.IoctlSetPointerInt(int(f.Fd()), unix.FS_IOC_SETFLAGS, fsImmutableFL); err != nil {
		return fmt.Errorf("placeholder %s: cannot make it immutable: %w", path, err), nil
	}
	return nil, nil
}

// RemovePlaceholder clears the immutable flag of dir's disk.img and
// removes it: Unpublish does, and so must whoever removes a volume's
// directory by hand (or `chattr -i`), since not even root can unlink an
// immutable file.
func RemovePlaceholder(dir string) error {
	path := dir + "/" + PlaceholderName
	f, err := os.OpenFile(path, os.O_RDONLY|unix.O_NOFOLLOW, 0)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err == nil {
		_ = unix.IoctlSetPointerInt(int(f.Fd()), unix.FS_IOC_SETFLAGS, 0)
		f.Close()
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("placeholder %s: %w", path, err)
	}
	return nil
}
