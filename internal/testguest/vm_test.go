package testguest

import (
	"context"
	"errors"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// A shell stands in for QEMU: it writes the console file as a guest's
// serial console would.
func TestVMWaitConsole(t *testing.T) {
	console := filepath.Join(t.TempDir(), "console")
	v, err := StartVM(exec.Command("sh", "-c", `echo "guest: up" >"$0"; sleep 60`, console), console)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(v.Kill)
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	if err := v.WaitConsole(ctx, "guest: up"); err != nil {
		t.Fatal(err)
	}
	short, cancel2 := context.WithTimeout(ctx, 300*time.Millisecond)
	defer cancel2()
	if err := v.WaitConsole(short, "never"); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("WaitConsole for a line never printed: %v, want the deadline", err)
	}
	if !v.Running() {
		t.Fatal("the VM is not running before Kill")
	}
	v.Kill()
	if v.Running() {
		t.Fatal("the VM runs after Kill")
	}
	v.Kill() // again: a no-op
}

func TestVMWaitConsoleExited(t *testing.T) {
	console := filepath.Join(t.TempDir(), "console")
	v, err := StartVM(exec.Command("sh", "-c", `echo "guest: panic" >"$0"; exit 3`, console), console)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(v.Kill)
	err = v.WaitConsole(t.Context(), "guest: done")
	if err == nil || !strings.Contains(err.Error(), "QEMU exited (exit status 3)") {
		t.Fatalf("WaitConsole after QEMU exited: %v", err)
	}
	<-v.Exited()
	if v.Err() == nil {
		t.Fatal("Err is nil after exit status 3")
	}
	if got := v.ConsoleText(); got != "guest: panic\n" {
		t.Fatalf("console %q", got)
	}
	// Printed just before the end counts.
	if err := v.WaitConsole(t.Context(), "guest: panic"); err != nil {
		t.Fatal(err)
	}
}

func TestMachineArgs(t *testing.T) {
	k := &Kernel{Dir: "/k", Vmlinuz: "vmlinuz"}
	base := []string{
		"-machine", "pc", "-accel", "tcg", "-cpu", "qemu64", "-smp", "1", "-m", "128",
		"-nodefaults", "-no-user-config", "-display", "none", "-no-reboot",
		"-kernel", "/k/vmlinuz", "-initrd", "/i",
		"-append", "console=ttyS0 loglevel=4 panic=-1",
		"-serial", "file:/c",
	}
	if got := QEMUArgs(k, "/i", "/c"); !slices.Equal(got, base) {
		t.Errorf("QEMUArgs = %q\nwant %q", got, base)
	}
	want := slices.Clone(base)
	want[1], want[3], want[5], want[9], want[20] = "q35", "tcg,thread=single", "max", "131080K", "console=ttyS0 loglevel=4 panic=-1 quiet"
	want = append(want, "-qmp", "unix:/q,server=on,wait=off")
	m := Machine{Type: "q35", Accel: "tcg,thread=single", CPU: "max", Memory: "131080K", Cmdline: "quiet", QMP: "/q"}
	if got := m.Args(k, "/i", "/c"); !slices.Equal(got, want) {
		t.Errorf("Machine.Args = %q\nwant %q", got, want)
	}
}
