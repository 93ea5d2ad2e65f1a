package enospc

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/quiverstorage/quiver/internal/testfs"
	"github.com/quiverstorage/quiver/internal/testguest"
	"github.com/quiverstorage/quiver/internal/testserver"
)

// Console lines of the guest's /init.
const (
	guestStart = "guest: writing"
	guestDone  = "guest: done writing"
	guestError = "guest: write error"
)

// buildGuest writes the initramfs into dir (testguest.Build, the VirtioBlk
// kernel) with an /init that writes mib MiB to /dev/vda from byte offset
// base on, MiB i filled with the byte i+1, one O_DIRECT dd per MiB, then
// syncs and prints guestDone. A failed dd prints guestError; with werror=enospc the guest
// never sees ENOSPC, so it must not.
func buildGuest(t *testing.T, dir string, base int64, mib int) (*testguest.Kernel, string) {
	t.Helper()
	for _, tool := range []string{"qemu-system-x86_64", "qemu-io"} {
		testfs.RequireTool(t, tool)
	}
	initrd := filepath.Join(dir, "initramfs.cpio")
	k, err := testguest.Build(testguest.VirtioBlk, initrd, fmt.Sprintf(`echo "%s %d MiB"
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
`, guestStart, mib, mib, base, guestError, guestDone))
	if errors.Is(err, testguest.ErrMissing) {
		testfs.SkipOrFail(t, "%v", err)
	} else if err != nil {
		t.Fatal(err)
	}
	return k, initrd
}

// vm is qemu-system-x86_64 under TCG booting the guest with one quiver disk,
// /dev/vda, a virtio-blk-pci device on QEMU's NBD client that stops the VM
// on ENOSPC (werror=enospc) and reports read errors (rerror=report).
type vm struct {
	*testguest.VM
	stderr *testserver.LogBuffer
}

func startVM(t *testing.T, ctx context.Context, dir string, k *testguest.Kernel, initrd, nbdSocket, export string) *vm {
	t.Helper()
	console, qmp := filepath.Join(dir, "console"), filepath.Join(dir, "qmp")
	node, err := json.Marshal(map[string]any{
		"driver":    "nbd",
		"node-name": "disk-vda",
		"server":    map[string]string{"type": "unix", "path": nbdSocket},
		"export":    export,
	})
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("qemu-system-x86_64", append(testguest.Machine{QMP: qmp}.Args(k, initrd, console),
		"-blockdev", string(node),
		"-device", "virtio-blk-pci,drive=disk-vda,id=vda,werror=enospc,rerror=report",
	)...)
	v := &vm{stderr: &testserver.LogBuffer{}}
	cmd.Stdout, cmd.Stderr = v.stderr, v.stderr
	if v.VM, err = testguest.StartVM(cmd, console); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		v.Shutdown()
		if t.Failed() {
			t.Logf("--- guest console (tail) ---\n%s\n--- QEMU stderr ---\n%s\n--- QMP events ---\n%s",
				testserver.Tail(v.ConsoleText(), 60), testserver.Tail(v.stderr.String(), 20), v.events())
		}
	})
	if err := v.DialQMP(ctx, qmp); err != nil {
		t.Fatal(err)
	}
	return v
}

func (v *vm) events() string {
	if v.QMP == nil {
		return ""
	}
	return v.QMP.EventLog()
}

// waitConsole waits until the console shows want.
func (v *vm) waitConsole(t *testing.T, ctx context.Context, want string) {
	t.Helper()
	if err := v.WaitConsole(ctx, want); err != nil {
		t.Fatal(err)
	}
}

// status is query-status's run state ("running", "io-error", ...).
func (v *vm) status(t *testing.T, ctx context.Context) string {
	t.Helper()
	st, err := v.QMP.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return st
}

// ioStatus is query-block's io-status of the disk ("ok", "failed",
// "nospace").
func (v *vm) ioStatus(t *testing.T, ctx context.Context) string {
	t.Helper()
	all, err := v.QMP.IOStatus(ctx)
	if err != nil {
		t.Fatal(err)
	}
	st, ok := all["disk-vda"]
	if !ok {
		t.Fatalf("query-block shows no disk-vda: %v", all)
	}
	return st
}

// writeStats are query-blockstats' counters of the disk.
func (v *vm) writeStats(t *testing.T, ctx context.Context) testguest.BlockStats {
	t.Helper()
	all, err := v.QMP.BlockStats(ctx)
	if err != nil {
		t.Fatal(err)
	}
	s, ok := all["disk-vda"]
	if !ok {
		t.Fatalf("query-blockstats shows no disk-vda: %+v", all)
	}
	return s
}
