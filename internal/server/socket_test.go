package server

import (
	"net"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/quiverstorage/quiver/internal/testfs"
)

// TestListenUnix: the socket gets exactly 0600, or 0660 and the group,
// whatever the umask; a stale socket is replaced, any other file is not;
// closing removes the socket.
func TestListenUnix(t *testing.T) {
	old := syscall.Umask(0)
	t.Cleanup(func() { syscall.Umask(old) })
	for _, tc := range []struct {
		name, group string
		mode        os.FileMode
		gid         int
	}{
		{"owner only", "", 0o600, os.Getegid()},
		{"group by number", "4242", 0o660, 4242},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.group != "" {
				testfs.RequireRoot(t) // chown to another group
			}
			dir, err := os.MkdirTemp("", "qvs")
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = os.RemoveAll(dir) })
			path := filepath.Join(dir, "api.sock")
			stale, err := net.Listen("unix", path)
			if err != nil {
				t.Fatal(err)
			}
			stale.(*net.UnixListener).SetUnlinkOnClose(false)
			_ = stale.Close()
			ln, err := ListenUnix(path, tc.group)
			if err != nil {
				t.Fatal(err)
			}
			st, err := os.Stat(path)
			if err != nil {
				t.Fatal(err)
			}
			if st.Mode().Perm() != tc.mode || int(st.Sys().(*syscall.Stat_t).Gid) != tc.gid {
				t.Errorf("socket mode %v gid %d, want %v gid %d", st.Mode().Perm(), st.Sys().(*syscall.Stat_t).Gid, tc.mode, tc.gid)
			}
			if ln.Addr().String() != path {
				t.Errorf("Addr %s, want %s", ln.Addr(), path)
			}
			c, err := net.Dial("unix", path)
			if err != nil {
				t.Fatalf("dial: %v", err)
			}
			_ = c.Close()
			if entries, _ := os.ReadDir(dir); len(entries) != 1 {
				t.Errorf("directory holds %d entries, want the socket only", len(entries))
			}
			_ = ln.Close()
			if _, err := os.Lstat(path); !os.IsNotExist(err) {
				t.Errorf("socket still there after Close: %v", err)
			}
		})
	}
	t.Run("not a socket", func(t *testing.T) {
		path := filepath.Join(t.TempDir(), "file")
		if err := os.WriteFile(path, []byte("keep"), 0o600); err != nil {
			t.Fatal(err)
		}
		if _, err := ListenUnix(path, ""); err == nil {
			t.Fatal("listenUnix replaced a regular file")
		}
		if b, _ := os.ReadFile(path); string(b) != "keep" {
			t.Error("the file changed")
		}
	})
}
