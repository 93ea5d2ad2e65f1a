package storage

import (
	"errors"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/quiverstorage/quiver/internal/testfs"
)

// TestSyncAfterShutdownFails: once XFS is shut down, a sync of a file or a
// directory on it fails with ErrIO, and so does confirmSynced, the check
// every sync makes after fdatasync or fsync returned success (it is what
// catches a shutdown that lands during the sync, which test/shutdown
// provokes; the race itself cannot be forced here). If a kernel stopped
// failing fstat on a shut-down XFS, this test says so.
func TestSyncAfterShutdownFails(t *testing.T) {
	mnt := testfs.MountXFS(t, 300<<20)
	fsys, err := OpenOS(mnt)
	if err != nil {
		t.Fatal(err)
	}
	defer fsys.Close()
	f, err := fsys.OpenFile("img", os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteAt(make([]byte, 4096), 0); err != nil {
		t.Fatal(err)
	}
	if err := f.Sync(); err != nil {
		t.Fatalf("sync before the shutdown: %v", err)
	}
	raw, err := os.Open(filepath.Join(mnt, "img"))
	if err != nil {
		t.Fatal(err)
	}
	defer raw.Close()
	if err := confirmSynced(int(raw.Fd())); err != nil {
		t.Fatalf("confirmSynced before the shutdown: %v", err)
	}

	if err := testfs.ShutdownXFS(mnt); err != nil {
		t.Fatal(err)
	}

	if err := confirmSynced(int(raw.Fd())); !errors.Is(err, unix.EIO) {
		t.Errorf("confirmSynced on a shut-down XFS: %v, want EIO", err)
	}
	if err := f.Sync(); !errors.Is(err, ErrIO) {
		t.Errorf("sync of a file on a shut-down XFS: %v, want ErrIO", err)
	}
	if err := fsys.SyncDir("."); !errors.Is(err, ErrIO) {
		t.Errorf("sync of a directory on a shut-down XFS: %v, want ErrIO", err)
	}
}
