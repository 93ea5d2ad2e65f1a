package clustertest

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/quiverstorage/quiver/internal/api"
	"github.com/quiverstorage/quiver/internal/testfs"
)

// fillFS fills the filesystem of dir with a ballast file until a write
// fails with ENOSPC, and returns the ballast's path.
func fillFS(t *testing.T, dir string) string {
	t.Helper()
	path := filepath.Join(dir, "ballast")
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		t.Fatal(err)
	}
	size := int64(st.Bfree) * st.Bsize
	for size > 0 && unix.Fallocate(int(f.Fd()), 0, 0, size) != nil {
		size -= 1 << 20
	}
	buf := make([]byte, 4096)
	for off := size; ; off += int64(len(buf)) {
		if _, err := f.WriteAt(buf, off); err != nil {
			if !errors.Is(err, unix.ENOSPC) {
				t.Fatal(err)
			}
			break
		}
	}
	if err := f.Sync(); err != nil && !errors.Is(err, unix.ENOSPC) {
		t.Fatal(err)
	}
	return path
}

// TestCopyDiskFull is the last case of acceptance 7 of issue 15: the
// filesystem under one copy (a small ext4 on a loop device, n3's pool) is
// full. A write through the primary is acknowledged (the primary and the
// in-sync set hold it) and the copy leaves the in-sync set, recorded
// degraded with the copy's error: never silently divergent. While the
// filesystem stays full the resync fails and the copy stays degraded; once
// space is freed it is resynced, and both copies are byte-identical.
func TestCopyDiskFull(t *testing.T) {
	testfs.RequireTool(t, "qemu-io")
	testfs.RequireTool(t, "mkfs.ext4")
	mnt := testfs.MountExt4(t, 96*mib)
	etcdDir := t.TempDir() // off the small filesystem
	c := startClusterWith(t, func(i int, nd *node) {
		if i == 2 {
			nd.pool = filepath.Join(mnt, "pool")
			nd.args = append(nd.args, "--etcd-data-dir", filepath.Join(etcdDir, "etcd3"))
		}
	})
	ctx := context.Background()
	v, err := c.nodes[0].api().CreateVolume(ctx, api.VolumeSpec{Name: "full", Capacity: 32 * mib, Replicas: 2,
		Disks: []api.DiskSpec{{Name: "root", Size: 32 * mib}}})
	if err != nil {
		t.Fatal(err)
	}
	n3 := c.nodes[2]
	if nodes := copyNodes(v); len(nodes) != 2 || nodes[1] != n3.name {
		t.Fatalf("copies on %v: want the second on n3 (the only node of zone-b)", nodes)
	}
	prim := c.byName(v.Primary)
	att, err := prim.api().Attach(ctx, "full", api.AttachmentSpec{Node: "worker-1"})
	if err != nil {
		t.Fatal(err)
	}
	uri := fmt.Sprintf("nbd://%s:10809/full/root/%s", prim.ip, att.Token)
	c.qemuIO(t, uri, "write -P 0x11 0 1M", "flush")

	ballast := fillFS(t, mnt)
	c.qemuIO(t, uri, "write -P 0x22 4M 8M", "flush")
	st, got, err := copyState(ctx, prim, "full", n3.name)
	if err != nil || st.State != api.CopyDegraded {
		t.Fatalf("copy on the full filesystem after an acknowledged write: %+v (%v)", st, err)
	}
	t.Logf("after the write: %s", formatCopies(got))
	if !allBytes(fileBytes(t, prim, "full", "root", 4*mib, 8*mib), 0x22) {
		t.Fatal("the primary lacks the acknowledged write")
	}
	// Full still: every resync fails, and the copy never shows in sync.
	deadline := time.Now().Add(8 * time.Second)
	sawStopped := false
	for time.Now().Before(deadline) {
		st, _, err := copyState(ctx, prim, "full", n3.name)
		if err != nil {
			t.Fatal(err)
		}
		if st.State == api.CopyInSync {
			t.Fatalf("a copy on a full filesystem is in sync: %+v", st)
		}
		sawStopped = sawStopped || strings.Contains(st.Reason, "resync stopped")
		time.Sleep(200 * time.Millisecond)
	}
	if !sawStopped {
		t.Error("no resync was tried (and stopped) while the filesystem was full")
	}
	c.qemuIO(t, uri, "write -P 0x33 20M 1M", "flush")

	if err := os.Remove(ballast); err != nil {
		t.Fatal(err)
	}
	seen := c.waitInSync(t, prim, "full", n3.name, 2*time.Minute)
	t.Logf("states after the space came back: %v", seen)
	c.qemuIO(t, uri, "flush")
	if a, b := diskSum(t, prim, "full", "root"), diskSum(t, n3, "full", "root"); a != b {
		t.Fatalf("after the resync: primary %s, copy %s", a, b)
	}
}
