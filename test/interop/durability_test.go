package interop

import (
	"bufio"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/quiverstorage/quiver/internal/client"
	"github.com/quiverstorage/quiver/internal/testfs"
	"github.com/quiverstorage/quiver/internal/testserver"
)

// TestNoSpaceReachesQemuIO: on a pool that fills up, a WRITE fails with
// NBD's ENOSPC and qemu-io reports "No space left on device"; the server
// stays up, and once space is freed writes work again and read back.
func TestNoSpaceReachesQemuIO(t *testing.T) {
	requireTools(t, "qemu-io")
	mnt := testfs.MountExt4(t, 64*miB)
	s := &server{Process: testserver.StartT(t, quiverBin,
		testserver.Options{Pool: filepath.Join(mnt, "pool"), NBDTCP: true})}
	s.api = s.Process.API
	s.createVolume(t, "vm", disk("root", 32*miB))
	uri := s.URI("vm/root")

	// Leave about 1 MiB free; the 8 MiB write cannot fit.
	var st unix.Statfs_t
	if err := unix.Statfs(mnt, &st); err != nil {
		t.Fatal(err)
	}
	filler := filepath.Join(mnt, "filler")
	f, err := os.Create(filler)
	if err != nil {
		t.Fatal(err)
	}
	if err := unix.Fallocate(int(f.Fd()), 0, 0, int64(st.Bavail)*st.Bsize-miB); err != nil {
		t.Fatal(err)
	}
	_ = f.Close()

	out, _ := exe(t.Context(), "qemu-io", qemuIOArgs(uri, false, []string{"write -P 0x55 0 8M", "flush"})...)
	if !strings.Contains(out, "No space left on device") {
		t.Fatalf("qemu-io write on a full pool: want \"No space left on device\", got:\n%s", out)
	}
	if err := os.Remove(filler); err != nil {
		t.Fatal(err)
	}
	qemuIO(t, uri, false, "write -P 0x66 0 8M", "flush")
	qemuIO(t, uri, true, "read -P 0x66 0 8M")
	if _, err := s.api.GetVolume(t.Context(), "vm"); err != nil {
		t.Fatalf("the API after the pool filled up: %v", err)
	}
}

// holdScript keeps one libnbd connection to argv[1]: it writes 0x11 to the
// first 64 KiB and flushes, says "written", waits for a line on stdin, then
// tries each request and prints "<name> ok" or "<name> errno <n>".
const holdScript = `
import nbd, sys
h = nbd.NBD()
h.connect_uri(sys.argv[1])
h.pwrite(b'\x11' * 65536, 0)
h.flush()
print("written", flush=True)
sys.stdin.readline()
ops = [
    ("write", lambda: h.pwrite(b'\x22' * 65536, 0)),
    ("fua-write", lambda: h.pwrite(b'\x22' * 65536, 65536, nbd.CMD_FLAG_FUA)),
    ("zero", lambda: h.zero(65536, 131072)),
    ("read", lambda: h.pread(4096, 0)),
    ("flush", lambda: h.flush()),
]
for name, op in ops:
    try:
        op()
        print(name, "ok", flush=True)
    except nbd.Error as e:
        print(name, "errno", e.errno, flush=True)
h.shutdown()
`

// libnbdPython returns a python3 that can import libnbd's bindings.
func libnbdPython(t *testing.T) string {
	t.Helper()
	for _, py := range []string{"python3", "/usr/bin/python3"} {
		if exec.Command(py, "-c", "import nbd").Run() == nil {
			return py
		}
	}
	testfs.SkipOrFail(t, "no python3 with libnbd's bindings (python3-libnbd)")
	return ""
}

// TestRemovedDiskKeepsItsClient: a client connected to vm/scratch while the
// disk is removed and a disk of the same name is added gets EIO for every
// request, and none of its writes reaches the new disk.
func TestRemovedDiskKeepsItsClient(t *testing.T) {
	requireTools(t, "qemu-io")
	py := libnbdPython(t)
	s := startServer(t)
	s.createVolume(t, "vm", disk("root", 4*miB), disk("scratch", 4*miB))
	uri := s.URI("vm/scratch")

	cmd := exec.CommandContext(t.Context(), py, "-c", holdScript, uri)
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	lines := bufio.NewScanner(stdout)
	next := func() string {
		if !lines.Scan() {
			t.Fatalf("client ended early: %v\n%s", lines.Err(), stderr.String())
		}
		return lines.Text()
	}
	if got := next(); got != "written" {
		t.Fatalf("client: %q, want \"written\"\n%s", got, stderr.String())
	}
	if _, err := s.api.RemoveDisk(t.Context(), "vm", "scratch", client.Force()); err != nil { // its writer is connected
		t.Fatal(err)
	}
	if _, err := s.api.AddDisk(t.Context(), "vm", disk("scratch", 4*miB)); err != nil {
		t.Fatal(err)
	}
	if _, err := io.WriteString(stdin, "go\n"); err != nil {
		t.Fatal(err)
	}
	for _, op := range []string{"write", "fua-write", "zero", "read", "flush"} {
		if got, want := next(), op+" errno EIO"; got != want {
			t.Errorf("client's %s on the removed disk: %q, want %q", op, got, want)
		}
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("client: %v\n%s", err, stderr.String())
		}
	case <-time.After(time.Minute):
		t.Fatal("client did not finish")
	}
	// The new disk holds none of the old client's writes, and takes new ones.
	qemuIO(t, uri, true, "read -P 0 0 4M")
	qemuIO(t, uri, false, "write -P 0x33 0 64k", "flush")
}
