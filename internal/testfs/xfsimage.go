package testfs

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// MakeXFS makes an XFS image of size bytes (sparse) at img holding files,
// by mounting it through a loop device: a guest's root filesystem made on
// the host. It needs root, mkfs.xfs and mount (the caller checks).
func MakeXFS(t testing.TB, img string, size int64, files map[string][]byte) {
	t.Helper()
	f, err := os.Create(img)
	if err == nil {
		err = f.Truncate(size)
		_ = f.Close()
	}
	if err != nil {
		t.Fatal(err)
	}
	must := func(name string, args ...string) {
		t.Helper()
		if out, err := exec.Command(name, args...).CombinedOutput(); err != nil {
			t.Fatalf("%s %v: %v\n%s", name, args, err, out)
		}
	}
	must("mkfs.xfs", "-q", img)
	mnt := t.TempDir()
	must("mount", "-o", "loop", img, mnt)
	defer must("umount", mnt)
	for name, data := range files {
		if err := os.WriteFile(filepath.Join(mnt, name), data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
}
