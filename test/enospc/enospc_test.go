package enospc

import (
	"context"
	"encoding/json"
	"fmt"
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

const (
	miB = int64(1) << 20
	// diskSize is the guest's disk; the guest writes guestWrite MiB from
	// guestBase on, while the full pool has only about headroom bytes free.
	// guestBase is half of quiver's chunk (pool.ChunkSize, 1 MiB), so on
	// XFS every guest write straddles two chunks and the first write into
	// each chunk rewrites it whole: the copy-up path runs out of space too.
	diskSize   = 64 * miB
	guestBase  = miB / 2
	guestWrite = 24
	headroom   = 8 * miB
)

// TestGuestPausesOnFullPool boots a guest whose disk's pool is nearly
// full, on XFS and on ext4: its writes must stop the VM with ENOSPC
// (BLOCK_IO_ERROR nospace=true, action stop; run state io-error), and once
// the filler volume is deleted and the VM continued, every write must land.
func TestGuestPausesOnFullPool(t *testing.T) {
	dir := testguest.ShortDir(t, "qen")
	k, initrd := buildGuest(t, dir, guestBase, guestWrite)
	for _, fs := range []struct {
		name  string
		mount func(testing.TB, int64) string
		size  int64
	}{
		{"xfs", testfs.MountXFS, 300 * miB},
		{"ext4", testfs.MountExt4, 96 * miB},
	} {
		t.Run(fs.name, func(t *testing.T) {
			guestPausesOnFullPool(t, fs.mount(t, fs.size), k, initrd)
		})
	}
}

func guestPausesOnFullPool(t *testing.T, mnt string, k *testguest.Kernel, initrd string) {
	ctx := testguest.Context(t, 3*time.Minute)
	start := time.Now()
	dir := testguest.ShortDir(t, "qen")
	pool := filepath.Join(mnt, "pool")
	srv := testserver.StartT(t, quiverBin, testserver.Options{Pool: pool, NBDSocket: filepath.Join(dir, "nbd.sock")})
	if _, err := srv.API.CreateVolume(ctx, api.VolumeSpec{Name: "vm", Capacity: diskSize,
		Disks: []api.DiskSpec{{Name: "vda", Size: diskSize}}}); err != nil {
		t.Fatal(err)
	}
	fill(t, ctx, srv, mnt)
	free := freeBytes(t, mnt)
	if free >= guestWrite*miB {
		t.Fatalf("%d MiB free after the filler: the guest's %d MiB would fit", free/miB, guestWrite)
	}

	v := startVM(t, ctx, dir, k, initrd, srv.Socket, "vm/vda")
	v.waitConsole(t, ctx, guestStart)
	booted := time.Now()

	// The write that does not fit stops the VM: BLOCK_IO_ERROR with
	// nospace, then STOP, and the run state io-error. An EIO instead of
	// ENOSPC would give nospace=false and, with werror=enospc, action
	// "report": the guest would see an I/O error and go on.
	ioErr, n, err := v.QMP.WaitEvent(ctx, 0, func(e testguest.Event) bool { return e.Name == "BLOCK_IO_ERROR" })
	if err != nil {
		t.Fatalf("no BLOCK_IO_ERROR (%v); guest console:\n%s", err, testserver.Tail(v.ConsoleText(), 20))
	}
	var blockErr struct {
		NodeName  string `json:"node-name"`
		Operation string `json:"operation"`
		Action    string `json:"action"`
		NoSpace   bool   `json:"nospace"`
		Reason    string `json:"reason"`
	}
	if err := json.Unmarshal(ioErr.Data, &blockErr); err != nil {
		t.Fatal(err)
	}
	if !blockErr.NoSpace || blockErr.Action != "stop" || blockErr.Operation != "write" {
		t.Fatalf("BLOCK_IO_ERROR %s: want a write with nospace=true and action stop (ENOSPC through NBD)", ioErr.Data)
	}
	if _, _, err := v.QMP.WaitEvent(ctx, n, func(e testguest.Event) bool { return e.Name == "STOP" }); err != nil {
		t.Fatalf("no STOP after BLOCK_IO_ERROR: %v", err)
	}
	if st := v.status(t, ctx); st != "io-error" {
		t.Errorf("run state %q after ENOSPC, want io-error", st)
	}
	if st := v.ioStatus(t, ctx); st != "nospace" {
		t.Errorf("disk io-status %q after ENOSPC, want nospace", st)
	}
	paused := v.writeStats(t, ctx)
	t.Logf("guest booted in %v; %v later BLOCK_IO_ERROR %s, VM stopped (io-error) after %.1f MiB written, %d MiB free",
		booted.Sub(start).Round(time.Millisecond), ioErr.At.Sub(booted).Round(time.Millisecond), ioErr.Data,
		float64(paused.WrBytes)/float64(miB), freeBytes(t, mnt)/miB)
	if !serverLoggedNoSpace(srv.Log.String()) {
		t.Errorf("the server log has no warning of the ENOSPC:\n%s", testserver.Tail(srv.Log.String(), 20))
	}
	if _, err := srv.API.GetVolume(ctx, "vm"); err != nil {
		t.Fatalf("the API while the pool is full: %v", err)
	}

	// Free the space and continue: QEMU retries the failed write, and the
	// guest finishes without ever seeing an error.
	if _, err := srv.API.DeleteVolume(ctx, "filler"); err != nil {
		t.Fatal(err)
	}
	deleted := time.Now()
	waitFree(t, ctx, mnt, 2*guestWrite*miB)
	t.Logf("filler deleted: %d MiB free after %v", freeBytes(t, mnt)/miB, time.Since(deleted).Round(time.Millisecond))
	contAt := time.Now()
	if err := v.QMP.Execute(ctx, "cont", nil, nil); err != nil {
		t.Fatal(err)
	}
	_, resumed, err := v.QMP.WaitEvent(ctx, n, func(e testguest.Event) bool { return e.Name == "RESUME" })
	if err != nil {
		t.Fatalf("no RESUME after cont: %v", err)
	}
	// A BLOCK_IO_ERROR now would stop the VM again: fail at once rather
	// than wait for a marker that cannot come.
	wctx, cancel := context.WithCancel(ctx)
	watched := make(chan struct{})
	t.Cleanup(func() { <-watched })
	go func() {
		defer close(watched)
		defer cancel()
		if e, _, err := v.QMP.WaitEvent(wctx, resumed, func(e testguest.Event) bool { return e.Name == "BLOCK_IO_ERROR" }); err == nil {
			t.Errorf("BLOCK_IO_ERROR after cont with the space freed: %s", e.Data)
		}
	}()
	v.waitConsole(t, wctx, guestDone)
	cancel()
	<-watched
	done := v.writeStats(t, ctx)
	t.Logf("continued; the guest finished %v later: %d writes, %.1f MiB, %d failed",
		time.Since(contAt).Round(time.Millisecond), done.WrOperations, float64(done.WrBytes)/float64(miB), done.FailedWrOperations)
	if st := v.status(t, ctx); st != "running" {
		t.Errorf("run state %q after cont, want running", st)
	}
	// Not checked: QEMU 7.2 leaves the io-status of a -device's own
	// backend (-blockdev, no drive name) at nospace after cont; it resets
	// only named drives' status.
	t.Logf("disk io-status after cont: %q", v.ioStatus(t, ctx))
	if done.FailedWrOperations != 0 {
		t.Errorf("%d writes failed in the guest's view", done.FailedWrOperations)
	}
	if c := v.ConsoleText(); strings.Contains(c, guestError) || strings.Contains(c, "I/O error") {
		t.Errorf("the guest saw a write fail:\n%s", testserver.Tail(c, 20))
	}
	if err := v.Quit(ctx); err != nil {
		t.Fatal(err)
	}

	verifyDisk(t, ctx, srv)
	if err := srv.EndedByItself(); err != nil {
		t.Fatal(err)
	}
	if _, err := srv.API.GetVolume(ctx, "vm"); err != nil {
		t.Errorf("the API after the pool filled up: %v", err)
	}
	t.Logf("%v in all", time.Since(start).Round(time.Millisecond))
}

// fill creates volume "filler" with one disk that takes all but headroom
// of the pool's free space, and allocates its image (fallocate), as a VM
// that wrote its whole disk would have.
func fill(t *testing.T, ctx context.Context, srv *testserver.Process, mnt string) {
	t.Helper()
	size := (freeBytes(t, mnt) - headroom) / miB * miB
	if _, err := srv.API.CreateVolume(ctx, api.VolumeSpec{Name: "filler", Capacity: size,
		Disks: []api.DiskSpec{{Name: "data", Size: size}}}); err != nil {
		t.Fatal(err)
	}
	f, err := os.OpenFile(filepath.Join(srv.Pool, "volumes", "filler", "disks", "data.img"), os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	// The filesystem's own metadata grows meanwhile: allocate what still
	// fits, leaving about headroom.
	size = min(size, (freeBytes(t, mnt)-headroom)/miB*miB)
	if err := unix.Fallocate(int(f.Fd()), unix.FALLOC_FL_KEEP_SIZE, 0, size); err != nil {
		t.Fatalf("fallocate the filler's %d MiB: %v", size/miB, err)
	}
	if err := f.Sync(); err != nil {
		t.Fatal(err)
	}
}

func freeBytes(t *testing.T, mnt string) int64 {
	t.Helper()
	var st unix.Statfs_t
	if err := unix.Statfs(mnt, &st); err != nil {
		t.Fatal(err)
	}
	return int64(st.Bavail) * st.Bsize
}

// waitFree waits until the filesystem at mnt has want bytes free: XFS
// frees the blocks of a deleted file in the background.
func waitFree(t *testing.T, ctx context.Context, mnt string, want int64) {
	t.Helper()
	for freeBytes(t, mnt) < want {
		select {
		case <-ctx.Done():
			t.Fatalf("%d MiB free after the filler was deleted, want %d: %v", freeBytes(t, mnt)/miB, want/miB, ctx.Err())
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// serverLoggedNoSpace reports whether the log holds the warning of a
// request that failed with ENOSPC.
func serverLoggedNoSpace(log string) bool {
	for line := range strings.Lines(log) {
		if strings.Contains(line, "level=WARN") && strings.Contains(line, "errno=ENOSPC") {
			return true
		}
	}
	return false
}

// verifyDisk reads the disk back over NBD with qemu-io: the MiB the guest
// wrote at guestBase + i MiB holds the byte i+1, and the rest reads as
// zeros.
func verifyDisk(t *testing.T, ctx context.Context, srv *testserver.Process) {
	t.Helper()
	end := guestBase + guestWrite*miB
	args := []string{"-r", "-f", "raw", "-c", fmt.Sprintf("read -P 0 0 %d", guestBase)}
	for i := range guestWrite {
		args = append(args, "-c", fmt.Sprintf("read -P %d %d 1M", i+1, guestBase+int64(i)*miB))
	}
	args = append(args, "-c", fmt.Sprintf("read -P 0 %d %d", end, diskSize-end), srv.UnixURI("vm/vda"))
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, "qemu-io", args...).CombinedOutput()
	if err != nil || strings.Contains(string(out), "verification failed") || strings.Count(string(out), "read ") != guestWrite+2 {
		t.Fatalf("qemu-io read back of vm/vda (%v): want %d reads with their patterns:\n%s", err, guestWrite+2, out)
	}
}
