package blockdev

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	mount "k8s.io/mount-utils"
)

// NbdfuseLoop is the userspace Block-mode path for kernels without the nbd
// module: nbdfuse (libnbd) serves the export as a file on a FUSE mount, and
// a loop device over that file is a real block device, which mkfs, mount and
// QEMU accept. The loop device uses direct I/O, so the page cache of this
// node holds no stale copy of a disk that another node writes after a live
// migration.
type NbdfuseLoop struct {
	mounter mount.Interface

	mu       sync.Mutex
	children map[int]chan struct{} // closed when the nbdfuse child is reaped
}

var _ Devices = (*NbdfuseLoop)(nil)

// NewNbdfuseLoop returns the nbdfuse path; m checks and undoes mounts.
func NewNbdfuseLoop(m mount.Interface) *NbdfuseLoop {
	return &NbdfuseLoop{mounter: m, children: map[int]chan struct{}{}}
}

// startTimeout bounds how long nbdfuse may take to connect and mount.
const startTimeout = 20 * time.Second

func (b *NbdfuseLoop) Attach(ctx context.Context, fuseDir, file, uri string, readOnly bool) (string, int, error) {
	for _, tool := range []string{"nbdfuse", "losetup"} {
		if _, err := exec.LookPath(tool); err != nil {
			return "", 0, fmt.Errorf("%s: %w", tool, ErrNoTool)
		}
	}
	if err := os.MkdirAll(fuseDir, 0o700); err != nil {
		return "", 0, err
	}
	pidFile, logFile := fuseDir+".pid", fuseDir+".log"
	_ = os.Remove(pidFile)
	logf, err := os.Create(logFile)
	if err != nil {
		return "", 0, err
	}
	defer logf.Close()
	args := []string{"-P", pidFile}
	if readOnly {
		args = append(args, "-r")
	}
	args = append(args, filepath.Join(fuseDir, file), uri)
	cmd := exec.Command("nbdfuse", args...)
	cmd.Stdout, cmd.Stderr = logf, logf
	// Its own session: a signal to the plugin's process group does not
	// end the device behind a running VM.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		return "", 0, fmt.Errorf("start nbdfuse: %w", err)
	}
	pid := cmd.Process.Pid
	done := make(chan struct{})
	b.mu.Lock()
	b.children[pid] = done
	b.mu.Unlock()
	var waitErr error // set before done is closed
	go func() {
		waitErr = cmd.Wait()
		close(done)
		b.mu.Lock()
		delete(b.children, pid)
		b.mu.Unlock()
	}()
	if err := waitPIDFile(ctx, pidFile, done); err != nil {
		select {
		case <-done:
			err = fmt.Errorf("%w (%v)", err, waitErr)
		default:
		}
		out := tail(logFile) // before Detach removes it
		_ = b.Detach(context.WithoutCancel(ctx), fuseDir, file, "", pid)
		return "", 0, fmt.Errorf("nbdfuse did not serve the export: %w: %s", err, out)
	}
	loop, err := losetupAttach(ctx, filepath.Join(fuseDir, file), readOnly)
	if err != nil {
		_ = b.Detach(context.WithoutCancel(ctx), fuseDir, file, "", pid)
		return "", 0, err
	}
	return loop, pid, nil
}

// waitPIDFile waits until nbdfuse writes its pid file, which it does once
// the export is connected and the FUSE file is served.
func waitPIDFile(ctx context.Context, path string, exited <-chan struct{}) error {
	ctx, cancel := context.WithTimeout(ctx, startTimeout)
	defer cancel()
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		if data, err := os.ReadFile(path); err == nil && len(bytes.TrimSpace(data)) > 0 {
			return nil
		}
		select {
		case <-exited:
			return errors.New("nbdfuse exited")
		case <-ctx.Done():
			return ctx.Err()
		case <-tick.C:
		}
	}
}

// losetupAttach makes a loop device over file, with direct I/O when the
// kernel allows it on that file.
func losetupAttach(ctx context.Context, file string, readOnly bool) (string, error) {
	base := []string{"--find", "--show"}
	if readOnly {
		base = append(base, "--read-only")
	}
	out, err := run(ctx, "losetup", append(append(base, "--direct-io=on"), file)...)
	if err != nil {
		out, err = run(ctx, "losetup", append(base, file)...)
	}
	if err != nil {
		return "", fmt.Errorf("losetup %s: %w", file, err)
	}
	loop := strings.TrimSpace(out)
	if !strings.HasPrefix(loop, "/dev/loop") {
		return "", fmt.Errorf("losetup %s: unexpected output %q", file, out)
	}
	return loop, nil
}

func (b *NbdfuseLoop) Detach(ctx context.Context, fuseDir, file, loop string, pid int) error {
	if loop != "" && loopBacking(ctx, loop) == filepath.Join(fuseDir, file) {
		if _, err := run(ctx, "losetup", "--detach", loop); err != nil {
			return fmt.Errorf("detach %s: %w", loop, err)
		}
	}
	mounted, err := b.mounter.IsMountPoint(fuseDir)
	switch {
	case err != nil && mount.IsCorruptedMnt(err):
		// nbdfuse died under its mount (killed with a plugin's
		// container): the kernel answers ENOTCONN for the mount point,
		// which must still be unmounted.
		mounted = true
	case err != nil && !errors.Is(err, fs.ErrNotExist):
		return fmt.Errorf("check %s: %w", fuseDir, err)
	}
	if mounted {
		if err := unmountFUSE(ctx, fuseDir); err != nil {
			return err
		}
	}
	if err := b.stop(pid); err != nil {
		return err
	}
	for _, p := range []string{fuseDir + ".pid", fuseDir + ".log"} {
		_ = os.Remove(p)
	}
	if err := os.Remove(fuseDir); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("remove %s: %w", fuseDir, err)
	}
	return nil
}

// unmountFUSE unmounts nbdfuse's mount point, which makes nbdfuse exit.
func unmountFUSE(ctx context.Context, dir string) error {
	if _, err := exec.LookPath("fusermount3"); err == nil {
		if _, err := run(ctx, "fusermount3", "-u", dir); err == nil {
			return nil
		}
	}
	if err := syscall.Unmount(dir, 0); err != nil && !errors.Is(err, syscall.EINVAL) {
		return fmt.Errorf("unmount %s: %w", dir, err)
	}
	return nil
}

// stop waits for nbdfuse to exit after its unmount, and ends it if it does
// not: SIGTERM, then SIGKILL. A pid whose process is not nbdfuse (the pid
// was reused after a crash) is left alone.
func (b *NbdfuseLoop) stop(pid int) error {
	if pid <= 0 {
		return nil
	}
	for _, sig := range []syscall.Signal{0, syscall.SIGTERM, syscall.SIGKILL} {
		if sig != 0 {
			if !isNbdfuse(pid) {
				return nil
			}
			_ = syscall.Kill(pid, sig)
		}
		if b.waitExit(pid, 5*time.Second) {
			return nil
		}
	}
	return fmt.Errorf("nbdfuse (pid %d) did not exit", pid)
}

// waitExit waits for pid to exit, reaped by this process when it is our
// child, or gone from /proc when it was started by an earlier run.
func (b *NbdfuseLoop) waitExit(pid int, d time.Duration) bool {
	b.mu.Lock()
	done, child := b.children[pid]
	b.mu.Unlock()
	if child {
		select {
		case <-done:
			return true
		case <-time.After(d):
			return false
		}
	}
	deadline := time.Now().Add(d)
	for time.Now().Before(deadline) {
		if !isNbdfuse(pid) {
			return true
		}
		time.Sleep(20 * time.Millisecond)
	}
	return false
}

func isNbdfuse(pid int) bool {
	data, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cmdline")
	if err != nil {
		return false
	}
	arg0, _, _ := bytes.Cut(data, []byte{0})
	if filepath.Base(string(arg0)) != "nbdfuse" {
		return false
	}
	stat, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	// A zombie (state Z) has exited; only its parent's wait is missing.
	return err == nil && !bytes.Contains(stat, []byte(") Z "))
}

func (b *NbdfuseLoop) Healthy(ctx context.Context, fuseDir, file, loop string, pid int) (bool, error) {
	if loop == "" || !isNbdfuse(pid) {
		return false, nil
	}
	return loopBacking(ctx, loop) == filepath.Join(fuseDir, file), nil
}

// loopBacking returns the file behind a loop device, or "" when it has none.
func loopBacking(ctx context.Context, loop string) string {
	out, err := run(ctx, "losetup", "--noheadings", "--output", "BACK-FILE", loop)
	if err != nil {
		return ""
	}
	return strings.TrimSpace(out)
}

// run runs a command and returns its standard output; a failure carries its
// standard error.
func run(ctx context.Context, name string, args ...string) (string, error) {
	var stdout, stderr bytes.Buffer
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return stdout.String(), fmt.Errorf("%s %s: %w: %s", name, strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return stdout.String(), nil
}

// tail returns the end of a log file, for error messages.
func tail(path string) string {
	data, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	if len(data) > 2000 {
		data = data[len(data)-2000:]
	}
	return strings.TrimSpace(string(data))
}
