package enospc

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/quiverstorage/quiver/internal/testfs"
	"github.com/quiverstorage/quiver/internal/testguest"
	"github.com/quiverstorage/quiver/internal/testserver"
)

// guestKernel: one virtio-blk disk on virtio-pci (the module set of
// test/migration, so both share the cached kernel).
var guestKernel = testguest.KernelSpec{
	Modules: []string{"virtio_pci", "virtio_blk"},
	Config: map[string][]string{
		"CONFIG_VIRTIO_PCI": {"y", "m"},
		"CONFIG_VIRTIO_BLK": {"y", "m"},
	},
}

// Console lines of the guest's /init.
const (
	guestStart = "guest: writing"
	guestDone  = "guest: done writing"
	guestError = "guest: write error"
)

// buildGuest writes the initramfs into dir: testguest's base and an /init
// that writes mib MiB to /dev/vda from byte offset base on, MiB i filled
// with the byte i+1, one O_DIRECT dd per MiB, then syncs and prints
// guestDone. A failed dd prints guestError; with werror=enospc the guest
// never sees ENOSPC, so it must not.
func buildGuest(t *testing.T, dir string, base int64, mib int) (*testguest.Kernel, string) {
	t.Helper()
	for _, tool := range []string{"qemu-system-x86_64", "qemu-io"} {
		testfs.RequireTool(t, tool)
	}
	k, err := testguest.FetchKernel(guestKernel)
	if err != nil {
		if errors.Is(err, testguest.ErrMissing) {
			testfs.SkipOrFail(t, "%v", err)
		}
		t.Fatalf("guest kernel: %v", err)
	}
	initrd := filepath.Join(dir, "initramfs.cpio")
	w, err := testguest.NewInitramfs(initrd, k)
	if err != nil {
		if errors.Is(err, testguest.ErrMissing) {
			testfs.SkipOrFail(t, "%v", err)
		}
		t.Fatal(err)
	}
	w.File("init", 0o755, []byte(`#!/bin/sh
export PATH=/bin
mount -t devtmpfs devtmpfs /dev
mount -t proc proc /proc
mount -t sysfs sysfs /sys
`+testguest.InsmodLines(k)+fmt.Sprintf(`echo "%s %d MiB"
i=0
while [ $i -lt %d ]; do
	b=$(printf '\\%%03o' $((i + 1)))
	head -c 1048576 /dev/zero | tr '\000' "$b" |
		dd of=/dev/vda bs=1M seek=$((%d + i * 1048576)) count=1 iflag=fullblock oflag=direct,seek_bytes 2>/dev/null ||
		echo "%s at MiB $i"
	i=$((i + 1))
done
sync
echo "%s"
while :; do sleep 3600; done
`, guestStart, mib, mib, base, guestError, guestDone)))
	if err := w.Close(); err != nil {
		t.Fatalf("write %s: %v", initrd, err)
	}
	return k, initrd
}

// vm is qemu-system-x86_64 under TCG booting the guest with one quiver disk,
// /dev/vda, a virtio-blk-pci device on QEMU's NBD client that stops the VM
// on ENOSPC (werror=enospc) and reports read errors (rerror=report).
type vm struct {
	cmd     *exec.Cmd
	qmp     *testguest.QMP
	console string
	stderr  *testserver.LogBuffer
	exited  chan struct{}
	werr    error
}

func startVM(t *testing.T, ctx context.Context, dir string, k *testguest.Kernel, initrd, nbdSocket, export string) *vm {
	t.Helper()
	v := &vm{console: filepath.Join(dir, "console"), stderr: &testserver.LogBuffer{}, exited: make(chan struct{})}
	qmpPath := filepath.Join(dir, "qmp")
	node, err := json.Marshal(map[string]any{
		"driver":    "nbd",
		"node-name": "disk-vda",
		"server":    map[string]string{"type": "unix", "path": nbdSocket},
		"export":    export,
	})
	if err != nil {
		t.Fatal(err)
	}
	v.cmd = exec.Command("qemu-system-x86_64",
		"-machine", "pc", "-accel", "tcg", "-cpu", "qemu64", "-smp", "1", "-m", "128",
		"-nodefaults", "-no-user-config", "-display", "none", "-no-reboot",
		"-kernel", k.VmlinuzPath(), "-initrd", initrd,
		"-append", "console=ttyS0 loglevel=4 panic=-1",
		"-serial", "file:"+v.console,
		"-qmp", "unix:"+qmpPath+",server=on,wait=off",
		"-blockdev", string(node),
		"-device", "virtio-blk-pci,drive=disk-vda,id=vda,werror=enospc,rerror=report",
	)
	v.cmd.Stdout, v.cmd.Stderr = v.stderr, v.stderr
	v.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL} // dies with the test binary
	if err := v.cmd.Start(); err != nil {
		t.Fatalf("start QEMU: %v", err)
	}
	go func() {
		v.werr = v.cmd.Wait()
		close(v.exited)
	}()
	t.Cleanup(func() {
		v.stop()
		if t.Failed() {
			t.Logf("--- guest console (tail) ---\n%s\n--- QEMU stderr ---\n%s\n--- QMP events ---\n%s",
				testserver.Tail(v.consoleText(), 60), testserver.Tail(v.stderr.String(), 20), v.events())
		}
	})
	dctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if v.qmp, err = testguest.DialQMP(dctx, qmpPath); err != nil {
		t.Fatal(err)
	}
	return v
}

func (v *vm) events() string {
	if v.qmp == nil {
		return ""
	}
	return v.qmp.EventLog()
}

// stop asks QEMU to quit and kills it (by its PID) after 10 s.
func (v *vm) stop() {
	select {
	case <-v.exited:
		return
	default:
	}
	if v.qmp != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		_ = v.qmp.Execute(ctx, "quit", nil, nil)
		cancel()
	}
	select {
	case <-v.exited:
	case <-time.After(10 * time.Second):
		_ = v.cmd.Process.Kill()
		<-v.exited
	}
	if v.qmp != nil {
		_ = v.qmp.Close()
	}
}

// quit ends QEMU through QMP (it flushes its disks) and fails the test
// unless it exits with status 0.
func (v *vm) quit(t *testing.T, ctx context.Context) {
	t.Helper()
	if err := v.qmp.Execute(ctx, "quit", nil, nil); err != nil {
		t.Fatal(err)
	}
	select {
	case <-v.exited:
		if v.werr != nil {
			t.Fatalf("QEMU exited with %v after quit", v.werr)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("QEMU still running 20 s after quit")
	}
}

func (v *vm) consoleText() string {
	b, _ := os.ReadFile(v.console)
	return string(b)
}

// waitConsole waits until the console shows want.
func (v *vm) waitConsole(t *testing.T, ctx context.Context, want string) {
	t.Helper()
	for !strings.Contains(v.consoleText(), want) {
		select {
		case <-ctx.Done():
			t.Fatalf("the guest console never showed %q: %v", want, ctx.Err())
		case <-v.exited:
			t.Fatalf("QEMU exited before the guest console showed %q", want)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// status is query-status's run state ("running", "io-error", ...).
func (v *vm) status(t *testing.T, ctx context.Context) string {
	t.Helper()
	var st struct {
		Status string `json:"status"`
	}
	if err := v.qmp.Execute(ctx, "query-status", nil, &st); err != nil {
		t.Fatal(err)
	}
	return st.Status
}

// ioStatus is query-block's io-status of the disk ("ok", "failed",
// "nospace").
func (v *vm) ioStatus(t *testing.T, ctx context.Context) string {
	t.Helper()
	var list []struct {
		IOStatus string `json:"io-status"`
		Inserted struct {
			NodeName string `json:"node-name"`
		} `json:"inserted"`
	}
	if err := v.qmp.Execute(ctx, "query-block", nil, &list); err != nil {
		t.Fatal(err)
	}
	for _, e := range list {
		if e.Inserted.NodeName == "disk-vda" {
			return e.IOStatus
		}
	}
	t.Fatalf("query-block shows no disk-vda: %+v", list)
	return ""
}

// writeStats are query-blockstats' write counters of the disk.
type writeStats struct {
	WrOperations       int64 `json:"wr_operations"`
	WrBytes            int64 `json:"wr_bytes"`
	FailedWrOperations int64 `json:"failed_wr_operations"`
}

func (v *vm) writeStats(t *testing.T, ctx context.Context) writeStats {
	t.Helper()
	var list []struct {
		NodeName string     `json:"node-name"`
		Stats    writeStats `json:"stats"`
	}
	if err := v.qmp.Execute(ctx, "query-blockstats", nil, &list); err != nil {
		t.Fatal(err)
	}
	for _, e := range list {
		if e.NodeName == "disk-vda" {
			return e.Stats
		}
	}
	t.Fatalf("query-blockstats shows no disk-vda: %+v", list)
	return writeStats{}
}
