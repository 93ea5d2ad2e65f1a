package csi

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net/url"
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

// ErrNoBlockTool: a tool Block mode needs (nbdfuse, losetup) is missing.
var ErrNoBlockTool = errors.New("block mode needs nbdfuse (libnbd-bin), losetup (util-linux) and /dev/fuse on the node")

// blockDevices turns an NBD export into a block device on this node and back.
type blockDevices interface {
	// attach exposes the export at uri as a block device: a FUSE file at
	// fuseDir/<file> and a loop device over it. It returns the loop device
	// and the pid of the process serving the file.
	attach(ctx context.Context, fuseDir, file, uri string, readOnly bool) (loop string, pid int, err error)
	// detach undoes attach, whatever part of it was done: the loop device
	// (only if it still points at the FUSE file), the FUSE mount, the
	// process. Detaching what is already gone succeeds.
	detach(ctx context.Context, fuseDir, file, loop string, pid int) error
	// healthy reports whether an attachment is still whole.
	healthy(fuseDir, file, loop string, pid int) bool
}

// nbdfuseLoop is the userspace Block-mode path for kernels without the nbd
// module: nbdfuse (libnbd) serves the export as a file on a FUSE mount, and
// a loop device over that file is a real block device, which mkfs, mount and
// QEMU accept. The loop device uses direct I/O, so the page cache of this
// node holds no stale copy of a disk that another node writes after a live
// migration.
type nbdfuseLoop struct {
	mounter mount.Interface

	mu       sync.Mutex
	children map[int]chan struct{} // closed when the nbdfuse child is reaped
}

var _ blockDevices = (*nbdfuseLoop)(nil)

func newNbdfuseLoop(m mount.Interface) *nbdfuseLoop {
	return &nbdfuseLoop{mounter: m, children: map[int]chan struct{}{}}
}

// startTimeout bounds how long nbdfuse may take to connect and mount.
const startTimeout = 20 * time.Second

func (b *nbdfuseLoop) attach(ctx context.Context, fuseDir, file, uri string, readOnly bool) (string, int, error) {
	for _, tool := range []string{"nbdfuse", "losetup"} {
		if _, err := exec.LookPath(tool); err != nil {
			return "", 0, fmt.Errorf("%s: %w", tool, ErrNoBlockTool)
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
	go func() {
		_ = cmd.Wait()
		close(done)
		b.mu.Lock()
		delete(b.children, pid)
		b.mu.Unlock()
	}()
	if err := waitPIDFile(ctx, pidFile, done); err != nil {
		_ = b.detach(context.WithoutCancel(ctx), fuseDir, file, "", pid)
		return "", 0, fmt.Errorf("nbdfuse did not serve the export: %w: %s", err, tail(logFile))
	}
	loop, err := losetupAttach(ctx, filepath.Join(fuseDir, file), readOnly)
	if err != nil {
		_ = b.detach(context.WithoutCancel(ctx), fuseDir, file, "", pid)
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

func (b *nbdfuseLoop) detach(ctx context.Context, fuseDir, file, loop string, pid int) error {
	if loop != "" && loopBacking(ctx, loop) == filepath.Join(fuseDir, file) {
		if _, err := run(ctx, "losetup", "--detach", loop); err != nil {
			return fmt.Errorf("detach %s: %w", loop, err)
		}
	}
	if mounted, err := b.mounter.IsMountPoint(fuseDir); err == nil && mounted {
		if err := unmountFUSE(ctx, fuseDir); err != nil {
			return err
		}
	} else if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("check %s: %w", fuseDir, err)
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
func (b *nbdfuseLoop) stop(pid int) error {
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
func (b *nbdfuseLoop) waitExit(pid int, d time.Duration) bool {
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

func (b *nbdfuseLoop) healthy(fuseDir, file, loop string, pid int) bool {
	if loop == "" || !isNbdfuse(pid) {
		return false
	}
	return loopBacking(context.Background(), loop) == filepath.Join(fuseDir, file)
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

// nbdURI is the NBD URI of an export on the server at addr: host:port, or
// unix:///path/to.sock. The export name is escaped as a URI path.
func nbdURI(addr, export string) (string, error) {
	path := (&url.URL{Path: "/" + export}).EscapedPath()
	if sock, ok := strings.CutPrefix(addr, "unix://"); ok {
		if !strings.HasPrefix(sock, "/") {
			return "", fmt.Errorf("NBD address %q: want unix:///absolute/path", addr)
		}
		return "nbd+unix://" + path + "?socket=" + url.QueryEscape(sock), nil
	}
	if addr == "" || strings.Contains(addr, "/") {
		return "", fmt.Errorf("NBD address %q: want host:port or unix:///path/to.sock (--nbd)", addr)
	}
	return "nbd://" + addr + path, nil
}
