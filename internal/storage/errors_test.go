package storage

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
)

// TestClassify: the one classification of the kernel's errors. The class
// and the errno both match, and the message is the cause's.
func TestClassify(t *testing.T) {
	for _, tc := range []struct {
		errno unix.Errno
		class error // nil: none
	}{
		{unix.ENOSPC, ErrNoSpace},
		{unix.EDQUOT, ErrNoSpace},
		{unix.EFBIG, ErrNoSpace},
		{unix.EIO, ErrIO},
		{unix.EROFS, ErrReadOnly},
		{unix.EOPNOTSUPP, ErrNotSupported},
		{unix.ENOTTY, ErrNotSupported},
		{unix.ENOSYS, ErrNotSupported},
		{unix.ENOENT, nil},
		{unix.EACCES, nil},
	} {
		cause := &fs.PathError{Op: "write", Path: "/p/f", Err: tc.errno}
		err := Classify(fmt.Errorf("disk x: %w", cause))
		if !errors.Is(err, tc.errno) {
			t.Errorf("%v: the errno is lost: %v", tc.errno, err)
		}
		if tc.class != nil && !errors.Is(err, tc.class) {
			t.Errorf("%v: %v does not match %v", tc.errno, err, tc.class)
		}
		for _, other := range []error{ErrNoSpace, ErrIO, ErrReadOnly, ErrNotSupported} {
			if other != tc.class && errors.Is(err, other) {
				t.Errorf("%v: %v matches %v too", tc.errno, err, other)
			}
		}
		if err.Error() != "disk x: "+cause.Error() {
			t.Errorf("%v: message %q, want the cause's", tc.errno, err)
		}
		if Classify(err) != err {
			t.Errorf("%v: classifying twice wraps again", tc.errno)
		}
	}
	if Classify(nil) != nil {
		t.Error("Classify(nil) is not nil")
	}
}

// TestOSRefusesLinks: the OS layer keeps beneath's rules: a path through a
// symbolic link is refused with ErrEscape, for every kind of call.
func TestOSRefusesLinks(t *testing.T) {
	base := t.TempDir()
	root, outside := filepath.Join(base, "root"), filepath.Join(base, "outside")
	for _, d := range []string{root, outside} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(outside, "victim"), []byte("v"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(outside, filepath.Join(root, "link")); err != nil {
		t.Fatal(err)
	}
	fsys, err := OpenOS(root)
	if err != nil {
		t.Fatal(err)
	}
	defer fsys.Close()
	for name, err := range map[string]error{
		"open":   func() error { _, err := fsys.OpenFile("link/victim", os.O_RDWR, 0); return err }(),
		"create": func() error { _, err := fsys.OpenFile("link/new", os.O_RDWR|os.O_CREATE, 0o600); return err }(),
		"mkdir":  fsys.Mkdir("link/d", 0o755),
		"remove": fsys.Remove("link/victim"),
		"rename": fsys.Rename("link/victim", "stolen"),
		"sync":   fsys.SyncDir("link"),
		"escape": func() error { _, err := fsys.OpenFile("../outside/victim", os.O_RDONLY, 0); return err }(),
	} {
		if !errors.Is(err, ErrEscape) {
			t.Errorf("%s through a link: %v, want ErrEscape", name, err)
		}
	}
	if b, err := os.ReadFile(filepath.Join(outside, "victim")); err != nil || string(b) != "v" {
		t.Fatalf("the victim changed: %q, %v", b, err)
	}
}
