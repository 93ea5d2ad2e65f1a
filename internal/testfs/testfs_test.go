package testfs

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

func TestMount(t *testing.T) {
	tests := []struct {
		name  string
		mount func(testing.TB, int64) string
		size  int64
		magic int64
	}{
		{"xfs", MountXFS, 320 << 20, unix.XFS_SUPER_MAGIC},
		{"btrfs", MountBtrfs, 256 << 20, unix.BTRFS_SUPER_MAGIC},
		{"ext4", MountExt4, 64 << 20, unix.EXT4_SUPER_MAGIC},
		{"tmpfs", MountTmpfs, 64 << 20, unix.TMPFS_MAGIC},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var mnt string
			t.Run("mounted", func(t *testing.T) {
				mnt = tc.mount(t, tc.size)
				var st unix.Statfs_t
				if err := unix.Statfs(mnt, &st); err != nil {
					t.Fatal(err)
				}
				if int64(st.Type) != tc.magic {
					t.Errorf("statfs type = %#x, want %#x", st.Type, tc.magic)
				}
				if got := int64(st.Blocks) * int64(st.Bsize); got > tc.size {
					t.Errorf("filesystem size %d exceeds image size %d", got, tc.size)
				}
				if err := os.WriteFile(filepath.Join(mnt, "f"), []byte("data"), 0o644); err != nil {
					t.Fatal(err)
				}
				if !isMounted(t, mnt) {
					t.Errorf("%s is not in /proc/self/mountinfo", mnt)
				}
			})
			if mnt == "" {
				t.Skip("mount was skipped")
			}
			if isMounted(t, mnt) {
				t.Errorf("%s still mounted after cleanup", mnt)
			}
			if _, err := os.Stat(filepath.Dir(mnt)); !os.IsNotExist(err) {
				t.Errorf("directory %s not removed after cleanup: %v", filepath.Dir(mnt), err)
			}
		})
	}
}

// isMounted reports whether path is a mount point of this process.
func isMounted(t *testing.T, path string) bool {
	t.Helper()
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	s := bufio.NewScanner(f)
	for s.Scan() {
		// Field 5 is the mount point (octal escapes only for unusual bytes).
		if fields := strings.Fields(s.Text()); len(fields) > 4 && fields[4] == path {
			return true
		}
	}
	if err := s.Err(); err != nil {
		t.Fatal(err)
	}
	return false
}

// recorder is a testing.TB whose Skip and Fatal only record the outcome and
// end the goroutine, so the tests below can watch the helpers stop a test.
type recorder struct {
	testing.TB
	skipped, failed bool
	msg             string
}

func (r *recorder) Helper() {}

func (r *recorder) Skip(args ...any) { r.stop(&r.skipped, fmt.Sprint(args...)) }
func (r *recorder) Skipf(format string, args ...any) {
	r.stop(&r.skipped, fmt.Sprintf(format, args...))
}
func (r *recorder) Fatal(args ...any) { r.stop(&r.failed, fmt.Sprint(args...)) }
func (r *recorder) Fatalf(format string, args ...any) {
	r.stop(&r.failed, fmt.Sprintf(format, args...))
}

func (r *recorder) stop(flag *bool, msg string) {
	*flag, r.msg = true, msg
	runtime.Goexit()
}

// runRecorded runs fn in its own goroutine, as the testing package runs a
// test, and reports how it ended.
func runRecorded(t *testing.T, fn func(testing.TB)) *recorder {
	r := &recorder{TB: t}
	done := make(chan struct{})
	go func() {
		defer close(done)
		fn(r)
	}()
	<-done
	return r
}

func TestSkipOrFail(t *testing.T) {
	const missing = "quiver-testfs-no-such-tool"
	emptyPath := t.TempDir()
	tests := []struct {
		name        string
		ci          string
		path        string // PATH override; "" keeps PATH
		fn          func(testing.TB)
		wantSkipped bool
		wantFailed  bool
	}{
		{name: "missing tool, local", fn: func(t testing.TB) { RequireTool(t, missing) }, wantSkipped: true},
		{name: "missing tool, CI", ci: "true", fn: func(t testing.TB) { RequireTool(t, missing) }, wantFailed: true},
		{name: "present tool, CI", ci: "true", fn: func(t testing.TB) { RequireTool(t, "sh") }},
		{name: "SkipOrFail, local", fn: func(t testing.TB) { SkipOrFail(t, "no %s", "qemu") }, wantSkipped: true},
		{name: "SkipOrFail, CI", ci: "1", fn: func(t testing.TB) { SkipOrFail(t, "no %s", "qemu") }, wantFailed: true},
		{name: "no mkfs, local", path: emptyPath, fn: func(t testing.TB) { MountXFS(t, 1<<30) }, wantSkipped: true},
		{name: "no mkfs, CI", ci: "1", path: emptyPath, fn: func(t testing.TB) { MountXFS(t, 1<<30) }, wantFailed: true},
		{name: "image too small, local", fn: func(t testing.TB) { MountXFS(t, 100<<20) }, wantFailed: true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv("CI", tc.ci)
			if tc.path != "" {
				t.Setenv("PATH", tc.path)
			}
			r := runRecorded(t, tc.fn)
			if r.skipped != tc.wantSkipped || r.failed != tc.wantFailed {
				t.Errorf("skipped=%v failed=%v (%q), want skipped=%v failed=%v",
					r.skipped, r.failed, r.msg, tc.wantSkipped, tc.wantFailed)
			}
		})
	}
}
