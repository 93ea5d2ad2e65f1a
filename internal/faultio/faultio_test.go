package faultio

import (
	"errors"
	"io"
	"os"
	"syscall"
	"testing"

	"github.com/quiverstorage/quiver/internal/storage"
)

// TestFaults: each armed fault fails the call it names once, classified as
// the storage layer classifies the kernel's errors, and nothing else.
func TestFaults(t *testing.T) {
	osfs, err := storage.OpenOS(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	fsys := New(osfs)
	defer fsys.Close()
	f, err := fsys.OpenFile("f", os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	buf := make([]byte, 8)

	fsys.FailRead(2, syscall.EIO)
	if _, err := f.ReadAt(buf, 0); err != nil && !errors.Is(err, io.EOF) {
		t.Fatalf("read 1: %v", err)
	}
	if _, err := f.ReadAt(buf, 0); !errors.Is(err, storage.ErrIO) || !errors.Is(err, syscall.EIO) {
		t.Fatalf("read 2: %v, want ErrIO wrapping EIO", err)
	}

	fsys.ShortWrite(1)
	if n, err := f.WriteAt([]byte("12345678"), 0); n != 4 || !errors.Is(err, io.ErrShortWrite) {
		t.Fatalf("short write: %d, %v; want 4 bytes and io.ErrShortWrite", n, err)
	}

	fsys.LimitWrites(3)
	if n, err := f.WriteAt([]byte("abcdef"), 0); n != 3 || !errors.Is(err, storage.ErrNoSpace) || !errors.Is(err, syscall.ENOSPC) {
		t.Fatalf("write past the limit: %d, %v; want 3 bytes and ErrNoSpace wrapping ENOSPC", n, err)
	}
	fsys.LimitWrites(-1)

	fsys.FailSync(1, syscall.EIO)
	if err := f.Sync(); !errors.Is(err, storage.ErrIO) {
		t.Fatalf("sync 1: %v, want ErrIO", err)
	}
	if err := f.Sync(); err != nil {
		t.Fatalf("sync 2: %v (a failure is reported once)", err)
	}
	fsys.FailDirSync(1, syscall.ENOSPC)
	if err := fsys.SyncDir("."); !errors.Is(err, storage.ErrNoSpace) {
		t.Fatalf("dir sync: %v, want ErrNoSpace", err)
	}

	fsys.RemountReadOnly(true)
	for name, err := range map[string]error{
		"write":  func() error { _, err := f.WriteAt([]byte("x"), 0); return err }(),
		"create": func() error { _, err := fsys.OpenFile("g", os.O_RDWR|os.O_CREATE, 0o600); return err }(),
		"mkdir":  fsys.Mkdir("d", 0o755),
		"rename": fsys.Rename("f", "h"),
		"remove": fsys.Remove("f"),
		"trunc":  f.Truncate(0),
	} {
		if !errors.Is(err, storage.ErrReadOnly) || !errors.Is(err, syscall.EROFS) {
			t.Errorf("%s while read-only: %v, want ErrReadOnly wrapping EROFS", name, err)
		}
	}
	if _, err := f.ReadAt(buf[:1], 0); err != nil {
		t.Errorf("read while read-only: %v", err)
	}
	if fsys.Failures() != 5+6 {
		t.Errorf("%d faults injected, want 11", fsys.Failures())
	}
}
