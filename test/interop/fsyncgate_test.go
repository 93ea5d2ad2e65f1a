package interop

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/quiverstorage/quiver/internal/testfs"
	"github.com/quiverstorage/quiver/internal/testserver"
)

// failingExt4 mounts an ext4 on a device that fails every write while the
// returned trigger file exists: a loop device over nbdfuse over nbdkit's
// memory plugin with its error filter. t.Cleanup takes it all down.
func failingExt4(t *testing.T) (mnt, trigger string) {
	t.Helper()
	testfs.RequireRoot(t)
	requireTools(t, "nbdkit", "nbdfuse", "losetup", "mkfs.ext4")
	dir := t.TempDir()
	trigger = filepath.Join(dir, "inject")
	sock, pidFile := filepath.Join(dir, "nbdkit.sock"), filepath.Join(dir, "nbdkit.pid")
	run(t, "nbdkit", "-U", sock, "-P", pidFile, "memory", "size=256M", "--filter=error",
		"error-pwrite=EIO", "error-pwrite-rate=100%", "error-pwrite-file="+trigger)
	t.Cleanup(func() {
		if b, err := os.ReadFile(pidFile); err == nil {
			var pid int
			if _, err := fmt.Sscan(string(b), &pid); err == nil && pid > 0 {
				if p, err := os.FindProcess(pid); err == nil {
					_ = p.Kill()
				}
			}
		}
	})
	fuseDir := filepath.Join(dir, "fuse")
	if err := os.Mkdir(fuseDir, 0o755); err != nil {
		t.Fatal(err)
	}
	fuse := exec.Command("nbdfuse", filepath.Join(fuseDir, "disk"), "--unix", sock)
	if err := fuse.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = fuse.Process.Signal(os.Interrupt)
		done := make(chan struct{})
		go func() { _ = fuse.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			_ = fuse.Process.Kill()
		}
	})
	img := filepath.Join(fuseDir, "disk")
	for deadline := time.Now().Add(10 * time.Second); ; {
		if st, err := os.Stat(img); err == nil && st.Size() > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("nbdfuse did not show the disk")
		}
		time.Sleep(20 * time.Millisecond)
	}
	loop := strings.TrimSpace(run(t, "losetup", "-f", "--show", img))
	t.Cleanup(func() { _, _ = exe(context.Background(), "losetup", "-d", loop) })
	run(t, "mkfs.ext4", "-q", loop)
	mnt = filepath.Join(dir, "mnt")
	if err := os.Mkdir(mnt, 0o755); err != nil {
		t.Fatal(err)
	}
	run(t, "mount", "-o", "commit=300", loop, mnt)
	t.Cleanup(func() {
		if out, err := exe(context.Background(), "umount", mnt); err != nil {
			t.Errorf("umount: %v\n%s", err, out)
		}
	})
	return mnt, trigger
}

// driverScript is one libnbd connection to argv[1] driven by lines on
// stdin: "write <byte> <off> <len> [fua]", "flush", "read <off>" (prints the
// byte there); each prints "ok [value]" or "errno <name>".
const driverScript = `
import nbd, sys
h = nbd.NBD()
h.set_uri_allow_local_file(True)  # nbds:// URIs name a certificate directory
h.connect_uri(sys.argv[1])
print("ready", flush=True)
for line in sys.stdin:
    w = line.split()
    try:
        if w[0] == "write":
            h.pwrite(bytes([int(w[1], 0)]) * int(w[3]), int(w[2]), nbd.CMD_FLAG_FUA if len(w) > 4 else 0)
            print("ok", flush=True)
        elif w[0] == "flush":
            h.flush()
            print("ok", flush=True)
        elif w[0] == "read":
            print("ok", hex(h.pread(1, int(w[1]))[0]), flush=True)
    except nbd.Error as e:
        print("errno", e.errno, flush=True)
h.shutdown()
`

// nbdDriver is a running driverScript.
type nbdDriver struct {
	t     *testing.T
	cmd   *exec.Cmd
	in    io.WriteCloser
	out   *bufio.Scanner
	errs  *strings.Builder
	label string
}

func startDriver(t *testing.T, py, uri, label string) *nbdDriver {
	t.Helper()
	d := &nbdDriver{t: t, cmd: exec.Command(py, "-c", driverScript, uri), errs: &strings.Builder{}, label: label}
	var err error
	if d.in, err = d.cmd.StdinPipe(); err != nil {
		t.Fatal(err)
	}
	out, err := d.cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	d.out = bufio.NewScanner(out)
	d.cmd.Stderr = d.errs
	if err := d.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(d.close)
	if got := d.line(); got != "ready" {
		t.Fatalf("%s: %q, want ready", label, got)
	}
	return d
}

func (d *nbdDriver) line() string {
	d.t.Helper()
	if !d.out.Scan() {
		d.t.Fatalf("%s ended: %v\n%s", d.label, d.out.Err(), d.errs.String())
	}
	return d.out.Text()
}

// do sends one command and checks its answer.
func (d *nbdDriver) do(cmd, want string) {
	d.t.Helper()
	if _, err := io.WriteString(d.in, cmd+"\n"); err != nil {
		d.t.Fatal(err)
	}
	if got := d.line(); got != want {
		d.t.Errorf("%s: %s: %q, want %q", d.label, cmd, got, want)
	}
}

// close ends the connection and waits for the client.
func (d *nbdDriver) close() {
	if d.in == nil {
		return
	}
	_ = d.in.Close()
	d.in = nil
	done := make(chan error, 1)
	go func() { done <- d.cmd.Wait() }()
	select {
	case err := <-done:
		if err != nil {
			d.t.Errorf("%s: %v\n%s", d.label, err, d.errs.String())
		}
	case <-time.After(time.Minute):
		_ = d.cmd.Process.Kill()
		d.t.Errorf("%s did not end", d.label)
	}
}

// TestFsyncgate is the tester's report, through real peers: on an ext4 whose
// device fails while a trigger file exists, write B over durable A, make the
// device fail, FLUSH: EIO. Heal the device, FLUSH again: still EIO, on that
// connection and on a second one, and a FUA write too (the kernel reports
// the error once and has marked B's pages clean, so the second fdatasync
// would succeed). Once both are gone a new connection finds the disk
// reopened: flushes work, and it reads what the device holds, A.
func TestFsyncgate(t *testing.T) {
	py := libnbdPython(t)
	mnt, trigger := failingExt4(t)
	s := &server{Process: testserver.StartT(t, quiverBin,
		testserver.Options{Pool: filepath.Join(mnt, "pool"), NBDTCP: true})}
	s.api = s.Process.API
	s.createVolume(t, "vm", disk("root", 8*miB))
	uri := s.URI("vm/root")

	c1 := startDriver(t, py, uri, "client 1")
	c1.do("write 0x41 0 1048576", "ok")
	c1.do("flush", "ok") // A is durable, its blocks allocated
	c1.do("write 0x42 0 1048576", "ok")
	if err := os.WriteFile(trigger, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	c1.do("flush", "errno EIO")
	if err := os.Remove(trigger); err != nil {
		t.Fatal(err)
	}
	c1.do("flush", "errno EIO")
	c2 := startDriver(t, py, uri, "client 2")
	c2.do("flush", "errno EIO")
	c2.do("write 0x43 2097152 4096 fua", "errno EIO")
	c1.do("write 0x43 2097152 4096 fua", "errno EIO")
	c1.close()
	c2.close()

	// The server logs a failed sync at error level, and only at error level.
	if !strings.Contains(s.Log.String(), "level=ERROR") || !strings.Contains(s.Log.String(), "fdatasync failed") {
		t.Errorf("no error logged for the failed sync:\n%s", testserver.Tail(s.Log.String(), 20))
	}
	c3 := startDriver(t, py, uri, "client 3")
	c3.do("read 0", "ok 0x41")
	c3.do("write 0x44 0 4096 fua", "ok")
	c3.do("flush", "ok")
	c3.close()
}
