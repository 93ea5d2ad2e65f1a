package testfs

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// A process in a mount namespace of its own (as ip netns exec and libvirtd
// in other test packages make) holds a copy of every mount that existed
// when it unshared, and mount propagation does not reach it when / is
// private. Remount must still end the shut-down filesystem and replay its
// log; before it dropped such copies, the mount found the old superblock
// alive and every call failed with EIO (seen in CI, 2026-12-03).
func TestRemountAfterShutdownWithACopyInAnotherNamespace(t *testing.T) {
	RequireTool(t, "unshare")
	mnt := MountXFS(t, 320<<20)
	file := filepath.Join(mnt, "f")
	if err := os.WriteFile(file, []byte("data"), 0o644); err != nil {
		t.Fatal(err)
	}
	unix.Sync() // f survives the crash
	cmd := exec.Command("unshare", "--mount", "--propagation", "private", "sleep", "60")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	// unshare execs sleep in the new namespace: wait until its pid's
	// mounts are that namespace's and hold the copy.
	mine, _ := os.Readlink("/proc/self/ns/mnt")
	pid := strconv.Itoa(cmd.Process.Pid)
	for deadline := time.Now().Add(10 * time.Second); ; {
		ns, _ := os.Readlink("/proc/" + pid + "/ns/mnt")
		info, _ := os.ReadFile("/proc/" + pid + "/mountinfo")
		if ns != "" && ns != mine && bytes.Contains(info, []byte(" "+mnt+" ")) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("unshare made no namespace with a copy of %s", mnt)
		}
		time.Sleep(20 * time.Millisecond)
	}

	if err := ShutdownXFS(mnt); err != nil {
		t.Fatal(err)
	}
	if _, err := os.ReadFile(file); err == nil {
		t.Fatal("read after ShutdownXFS succeeded: the filesystem is not down")
	}
	if err := Remount(mnt); err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile(file)
	if err != nil {
		t.Fatalf("read after Remount: %v (the shut-down filesystem is still mounted)", err)
	}
	if string(got) != "data" {
		t.Fatalf("read %q after Remount, want %q", got, "data")
	}
}
