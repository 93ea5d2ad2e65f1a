package powercut

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

// Soak knobs for telling quiver's faults from the filesystem's.
const (
	// fsckEnv: "1" checks the pool disk's XFS after every cut, on the host:
	// log recovery on a copy (a loop mount), then xfs_repair -n. A lane
	// fails at the first cut after which the filesystem is inconsistent,
	// before quiver runs on it again.
	fsckEnv = "QUIVER_POWERCUT_FSCK"
	// keepEnv: a directory; a failed lane copies its pool disk there, as
	// the power cut after the failure left it.
	keepEnv = "QUIVER_POWERCUT_KEEP"
)

// fsckMedium checks the XFS on the medium at path as a power cut left it.
// It works on a copy: mounting replays the log, which the next boot must
// do itself.
func fsckMedium(path string) error {
	dir, err := os.MkdirTemp("", "qpcfsck")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	img, mnt := filepath.Join(dir, "fsck.img"), filepath.Join(dir, "mnt")
	if err := os.Mkdir(mnt, 0o755); err != nil {
		return err
	}
	run := func(name string, args ...string) (string, error) {
		out, err := exec.Command(name, args...).CombinedOutput()
		if err != nil {
			return string(out), fmt.Errorf("%s %s: %w\n%s", name, strings.Join(args, " "), err, out)
		}
		return string(out), nil
	}
	if _, err := run("cp", "--sparse=always", "--reflink=auto", path, img); err != nil {
		return err
	}
	if _, err := run("mount", "-t", "xfs", "-o", "loop", img, mnt); err != nil {
		return fmt.Errorf("log recovery: %w", err)
	}
	if _, err := run("umount", mnt); err != nil {
		return err
	}
	if _, err := run("xfs_repair", "-n", img); err != nil {
		return fmt.Errorf("the pool disk's XFS is inconsistent after the cut: %w", err)
	}
	return nil
}

// keepMedium copies the lane's medium into the directory keepEnv names, if
// set, and returns where it went.
func keepMedium(m *medium, name string) string {
	dir := os.Getenv(keepEnv)
	if dir == "" {
		return ""
	}
	dst := filepath.Join(dir, name+".img")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "keeping the pool disk: " + err.Error()
	}
	out, err := exec.Command("cp", "--sparse=always", "--reflink=auto", m.f.Name(), dst).CombinedOutput()
	if err != nil {
		return fmt.Sprintf("keeping the pool disk: %v: %s", err, out)
	}
	return "the pool disk after the failure is kept in " + dst
}
