package testfs

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// kind describes how to make one filesystem type.
type kind struct {
	name    string   // mount -t type
	mkfs    string   // tool
	args    []string // mkfs arguments before the image path
	minSize int64    // smallest image mkfs accepts, with some room
}

var (
	xfs = kind{
		name: "xfs", mkfs: "mkfs.xfs", minSize: 300 << 20,
		// -K: do not discard the image, which only slows mkfs down.
		args: []string{"-q", "-f", "-K", "-m", "reflink=1"},
	}
	btrfs = kind{
		name: "btrfs", mkfs: "mkfs.btrfs", minSize: 128 << 20,
		args: []string{"-q", "-f", "-K"},
	}
	ext4 = kind{
		name: "ext4", mkfs: "mkfs.ext4", minSize: 16 << 20,
		args: []string{"-q", "-F", "-E", "nodiscard"},
	}
)

// MountXFS formats a sparse image of size bytes in t.TempDir() as XFS with
// reflink enabled, mounts it through a loop device and returns the mount
// point; t.Cleanup unmounts it and detaches the device. XFS needs at least
// 300 MiB. Without root, mkfs.xfs or a working mount the test is skipped, or
// fails when CI is set.
func MountXFS(t testing.TB, size int64) string {
	t.Helper()
	return mount(t, xfs, size)
}

// MountBtrfs is MountXFS for btrfs (reflink is always on); it needs at least
// 128 MiB.
func MountBtrfs(t testing.TB, size int64) string {
	t.Helper()
	return mount(t, btrfs, size)
}

// MountExt4 is MountXFS for ext4, which has no reflink, so code under test
// takes its copy fallback.
func MountExt4(t testing.TB, size int64) string {
	t.Helper()
	return mount(t, ext4, size)
}

// MountTmpfs mounts a tmpfs of size bytes on a directory in t.TempDir() and
// returns it; t.Cleanup unmounts it. tmpfs reports holes but has no reflink,
// FIEMAP or extent hints. Without root the test is skipped, or fails when CI
// is set.
func MountTmpfs(t testing.TB, size int64) string {
	t.Helper()
	RequireRoot(t)
	RequireTool(t, "mount")
	RequireTool(t, "umount")
	mnt := filepath.Join(t.TempDir(), "mnt")
	if err := os.Mkdir(mnt, 0o755); err != nil {
		t.Fatalf("testfs: %v", err)
	}
	opt := "size=" + strconv.FormatInt(size, 10)
	if out, err := run("mount", "-t", "tmpfs", "-o", opt, "tmpfs", mnt); err != nil {
		SkipOrFail(t, "testfs: mount -t tmpfs -o %s tmpfs %s: %v: %s", opt, mnt, err, out)
	}
	t.Cleanup(func() { unmount(t, mnt) })
	return mnt
}

func mount(t testing.TB, k kind, size int64) string {
	t.Helper()
	if size < k.minSize {
		t.Fatalf("testfs: %s image of %d bytes is too small: need at least %d", k.name, size, k.minSize)
	}
	RequireRoot(t)
	for _, tool := range []string{k.mkfs, "losetup", "mount", "umount"} {
		RequireTool(t, tool)
	}

	dir := t.TempDir() // registered before our cleanups, so removed after them
	img := filepath.Join(dir, k.name+".img")
	mnt := filepath.Join(dir, "mnt")
	if err := os.Mkdir(mnt, 0o755); err != nil {
		t.Fatalf("testfs: %v", err)
	}
	f, err := os.Create(img)
	if err != nil {
		t.Fatalf("testfs: %v", err)
	}
	err = f.Truncate(size)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		t.Fatalf("testfs: sizing %s: %v", img, err)
	}

	if out, err := run(k.mkfs, slices.Concat(k.args, []string{img})...); err != nil {
		SkipOrFail(t, "testfs: %s %s: %v: %s", k.mkfs, img, err, out)
	}
	out, err := run("losetup", "--find", "--show", img)
	if err != nil {
		SkipOrFail(t, "testfs: losetup %s: %v: %s", img, err, out)
	}
	dev := strings.TrimSpace(out)
	t.Cleanup(func() {
		if out, err := run("losetup", "--detach", dev); err != nil {
			t.Errorf("testfs: detaching %s: %v: %s", dev, err, out)
		}
	})
	if out, err := run("mount", "-t", k.name, dev, mnt); err != nil {
		SkipOrFail(t, "testfs: mount -t %s %s %s: %v: %s", k.name, dev, mnt, err, out)
	}
	t.Cleanup(func() { unmount(t, mnt) })
	return mnt
}

// unmount unmounts mnt. If files are still open there it reports the leak as
// a test error and detaches the mount lazily, so the loop device is freed
// once the last file closes.
func unmount(t testing.TB, mnt string) {
	out, err := run("umount", mnt)
	if err == nil {
		return
	}
	t.Errorf("testfs: umount %s: %v: %s (files left open?)", mnt, err, out)
	if out, err := run("umount", "--lazy", mnt); err != nil {
		t.Errorf("testfs: umount --lazy %s: %v: %s", mnt, err, out)
	}
}

// run runs a command and returns its combined output.
func run(name string, args ...string) (string, error) {
	var out bytes.Buffer
	cmd := exec.Command(name, args...)
	cmd.Stdout = &out
	cmd.Stderr = &out
	err := cmd.Run()
	return strings.TrimSpace(out.String()), err
}
