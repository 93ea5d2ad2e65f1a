package enospc

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/quiverstorage/quiver/internal/api"
	"github.com/quiverstorage/quiver/internal/testfs"
	"github.com/quiverstorage/quiver/internal/testguest"
	"github.com/quiverstorage/quiver/internal/testserver"
)

// TestServerRestartsOnFullPool restarts the server on a pool whose XFS is
// full to the last block (no file can be made): the server must start,
// serve the disk over NBD, take overwrites of the data the disk holds, and
// refuse a write into unallocated space with ENOSPC. Before session 16 it
// refused to start (the capability probe needs new files), and after a
// start with room the first overwrite into each chunk failed (the unshare
// guard made a file to force the log).
func TestServerRestartsOnFullPool(t *testing.T) {
	testfs.RequireTool(t, "qemu-io")
	mnt := testfs.MountXFS(t, 300*miB)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	pool := filepath.Join(mnt, "pool")
	sock := filepath.Join(testguest.ShortDir(t, "qrs"), "nbd.sock")
	srv := testserver.StartT(t, quiverBin, testserver.Options{Pool: pool, NBDSocket: sock})
	if _, err := srv.API.CreateVolume(ctx, api.VolumeSpec{Name: "vm", Capacity: 16 * miB,
		Disks: []api.DiskSpec{{Name: "vda", Size: 16 * miB}}}); err != nil {
		t.Fatal(err)
	}
	qemuIO(t, ctx, srv, "write -P 0x5a 0 8M")
	fill(t, ctx, srv, mnt)
	// The rest, to the last block.
	f, err := os.Create(filepath.Join(mnt, "filler"))
	if err != nil {
		t.Fatal(err)
	}
	for off := int64(0); unix.Fallocate(int(f.Fd()), 0, off, 4096) == nil; off += 4096 {
	}
	_ = f.Close()
	if f, err := os.Create(filepath.Join(mnt, "one-more")); err == nil {
		f.Close()
		t.Fatalf("a file could still be made (%d bytes free): the pool is not full", freeBytes(t, mnt))
	}
	if err := srv.Stop(30 * time.Second); err != nil {
		t.Fatal(err)
	}

	srv = testserver.StartT(t, quiverBin, testserver.Options{Pool: pool, NBDSocket: sock})
	if _, err := srv.API.GetVolume(ctx, "vm"); err != nil {
		t.Fatalf("the volume after the restart on a full pool: %v", err)
	}
	qemuIO(t, ctx, srv, "write -P 0x6b 1M 1M", "read -P 0x5a 0 1M", "read -P 0x6b 1M 1M", "read -P 0x5a 2M 6M")
	out, err := exec.CommandContext(ctx, "qemu-io", "-f", "raw", "-c", "write -P 0x11 12M 1M", srv.UnixURI("vm/vda")).CombinedOutput()
	if err == nil && !strings.Contains(string(out), "No space left on device") {
		t.Fatalf("a write into unallocated space on a full pool did not fail with ENOSPC:\n%s", out)
	}
	if !strings.Contains(srv.Log.String(), "filesystem is full") {
		t.Errorf("the server did not warn that it opened a full pool:\n%s", testserver.Tail(srv.Log.String(), 20))
	}
}

// qemuIO runs qemu-io's commands on vm/vda through the server's NBD socket;
// each must succeed (and a read find its pattern).
func qemuIO(t *testing.T, ctx context.Context, srv *testserver.Process, cmds ...string) {
	t.Helper()
	args := []string{"-f", "raw"}
	for _, c := range cmds {
		args = append(args, "-c", c)
	}
	out, err := exec.CommandContext(ctx, "qemu-io", append(args, srv.UnixURI("vm/vda"))...).CombinedOutput()
	if err != nil || strings.Contains(string(out), "failed") || strings.Contains(string(out), "error") {
		t.Fatalf("qemu-io %q: %v\n%s", cmds, err, out)
	}
}
