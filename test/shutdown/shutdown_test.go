package shutdown

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/quiverstorage/quiver/internal/testfs"
	"github.com/quiverstorage/quiver/internal/testguest"
	"github.com/quiverstorage/quiver/internal/testserver"
)

const probePkg = "github.com/quiverstorage/quiver/test/shutdown/probe"

// probeArgs are probe's arguments, after -dir and -crash.
func probeArgs(t *testing.T, seconds int) []string {
	if s := os.Getenv("QUIVER_SHUTDOWN_SECONDS"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 {
			t.Fatalf("QUIVER_SHUTDOWN_SECONDS=%q: want a number of seconds", s)
		}
		seconds = n
	}
	seed := uint64(time.Now().UnixNano())
	if s := os.Getenv("QUIVER_SHUTDOWN_SEED"); s != "" {
		n, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			t.Fatalf("QUIVER_SHUTDOWN_SEED=%q: %v", s, err)
		}
		seed = n
	}
	return []string{"-seconds", strconv.Itoa(seconds), "-seed", strconv.FormatUint(seed, 10)}
}

// verdict finds probe's last line in out and fails t unless it passed.
func verdict(t *testing.T, out string) {
	t.Helper()
	i := strings.LastIndex(out, "probe: PASS")
	if i < 0 {
		t.Fatalf("probe did not pass:\n%s", testserver.Tail(out, 260))
	}
	t.Log(strings.SplitN(out[i:], "\n", 2)[0])
}

func TestHostKernel(t *testing.T) {
	mnt := testfs.MountXFS(t, 1<<30)
	dir := t.TempDir()
	if _, err := testguest.GoProgram(probePkg, dir, "probe"); err != nil {
		t.Fatal(err)
	}
	exe := filepath.Join(dir, "probe") // where GoProgram built it
	pool := filepath.Join(mnt, "pool")
	if err := os.Mkdir(pool, 0o755); err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	cmd := exec.Command(exe, append([]string{"-dir", pool, "-crash", mnt, "-window", "500ms"}, probeArgs(t, 40)...)...)
	cmd.Stdout, cmd.Stderr = &out, &out
	_ = cmd.Run()
	verdict(t, out.String())
}

const probeEnd = "shutdown: probe exited"

func TestGuestKernel(t *testing.T) {
	for _, tool := range []string{"qemu-system-x86_64", "mkfs.xfs"} {
		testfs.RequireTool(t, tool)
	}
	dir := t.TempDir()
	bin, err := testguest.GoProgram(probePkg, dir, "probe")
	if err != nil {
		t.Fatal(err)
	}
	args := probeArgs(t, 60)
	secs, _ := strconv.Atoi(args[1])
	// As test/powercut's guest: dirty pages go back within 0.1 s.
	// The kernel's three lines per shutdown would slow the serial console.
	body := fmt.Sprintf(`echo 1 >/proc/sys/kernel/printk
echo 10 >/proc/sys/vm/dirty_expire_centisecs
echo 10 >/proc/sys/vm/dirty_writeback_centisecs
mkdir -p /mnt/pool
mount -t xfs /dev/vda /mnt/pool || echo "shutdown: mount failed"
mkdir /mnt/pool/pool
echo "shutdown: kernel $(uname -r)"
probe -dir /mnt/pool/pool -crash /mnt/pool -window 2s %s
echo "%s with status $?"
while :; do sleep 3600; done
`, strings.Join(args, " "), probeEnd)
	initrd := filepath.Join(dir, "initramfs.cpio")
	k, err := testguest.Build(testguest.VirtioXFS, initrd, body, bin)
	if err != nil {
		if errors.Is(err, testguest.ErrMissing) {
			testfs.SkipOrFail(t, "%v", err)
		}
		t.Fatal(err)
	}
	disk := filepath.Join(dir, "pool.img")
	f, err := os.Create(disk)
	if err == nil {
		err = f.Truncate(1 << 30)
		_ = f.Close()
	}
	if err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("mkfs.xfs", "-q", "-m", "reflink=1", disk).CombinedOutput(); err != nil {
		t.Fatalf("mkfs.xfs: %v\n%s", err, out)
	}
	console := filepath.Join(dir, "console")
	machine := testguest.Machine{CPU: "max", Memory: "256", Cmdline: "quiet mitigations=off no_timer_check"}
	cmd := exec.Command("qemu-system-x86_64", append(machine.Args(k, initrd, console),
		"-drive", "file="+disk+",if=none,id=pool,format=raw,cache=unsafe",
		"-device", "virtio-blk-pci,drive=pool")...)
	stderr := &testserver.LogBuffer{}
	cmd.Stdout, cmd.Stderr = stderr, stderr
	vm, err := testguest.StartVM(cmd, console)
	if err != nil {
		t.Fatal(err)
	}
	defer vm.Kill()
	// TCG runs the probe 10 to 30 times slower than the host; the probe
	// stops on its own clock, so the wait is its run plus the boot.
	ctx := testguest.Context(t, time.Duration(secs)*time.Second+3*time.Minute)
	if err := vm.WaitConsole(ctx, probeEnd); err != nil {
		t.Fatalf("%v\n--- console ---\n%s\n--- QEMU ---\n%s", err, testserver.Tail(vm.ConsoleText(), 260), stderr.String())
	}
	out := vm.ConsoleText()
	if i := strings.Index(out, "shutdown: kernel "); i >= 0 {
		t.Log(strings.SplitN(out[i:], "\n", 2)[0])
	}
	if !strings.Contains(out, "probe: PASS") {
		vm.Kill()
		keep(t, disk)
	}
	verdict(t, out)
}

// keep copies the guest's pool disk into the directory QUIVER_SHUTDOWN_KEEP
// names, if set, for xfs_db, xfs_bmap and xfs_repair -n.
func keep(t *testing.T, disk string) {
	dir := os.Getenv("QUIVER_SHUTDOWN_KEEP")
	if dir == "" {
		return
	}
	dst := filepath.Join(dir, fmt.Sprintf("%s-%d.img", strings.ReplaceAll(t.Name(), "/", "-"), time.Now().Unix()))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Logf("keeping the pool disk: %v", err)
		return
	}
	if out, err := exec.Command("cp", "--sparse=always", disk, dst).CombinedOutput(); err != nil {
		t.Logf("keeping the pool disk: %v: %s", err, out)
		return
	}
	t.Logf("the pool disk after the failure is kept in %s", dst)
}
