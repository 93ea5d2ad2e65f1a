package testguest

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
)

// GoProgram builds the Go package pkg (an import path of this module, e.g.
// github.com/quiverstorage/quiver/test/migration/guestwriter) into dir as
// a static linux/amd64 binary (CGO_ENABLED=0, stripped), for a guest's
// initramfs, and returns it as a File at bin/<name>. A missing go tool is
// an error wrapping ErrMissing.
func GoProgram(pkg, dir, name string) (File, error) {
	if _, err := exec.LookPath("go"); err != nil {
		return File{}, fmt.Errorf("%w: go: %v", ErrMissing, err)
	}
	out := filepath.Join(dir, name)
	build := exec.Command("go", "build", "-trimpath", "-ldflags=-s -w", "-o", out, pkg)
	build.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux", "GOARCH=amd64")
	if b, err := build.CombinedOutput(); err != nil {
		return File{}, fmt.Errorf("build %s for the guest: %v\n%s", pkg, err, b)
	}
	b, err := os.ReadFile(out)
	if err != nil {
		return File{}, err
	}
	return File{Path: "bin/" + name, Mode: 0o755, Data: b}, nil
}

// QEMUArgs are the arguments every test guest boots with: QEMU's pc
// machine under TCG (nested KVM is not there on CI's machines), one
// qemu64 CPU, 128 MiB, no default devices, k's kernel with initrd, the
// serial console in the file console, and no reboot (a panic ends QEMU).
// The caller adds its disks (-blockdev, -device) and anything else.
func QEMUArgs(k *Kernel, initrd, console string) []string {
	return Machine{}.Args(k, initrd, console)
}

// Machine changes what QEMUArgs boots; a zero field keeps its default.
type Machine struct {
	CPU       string // QEMU's -cpu; default qemu64
	MemoryMiB int    // QEMU's -m; default 128
	Cmdline   string // kernel parameters after QEMUArgs' own
}

// Args are QEMUArgs with m's changes.
func (m Machine) Args(k *Kernel, initrd, console string) []string {
	cpu, mem, cmdline := "qemu64", 128, "console=ttyS0 loglevel=4 panic=-1"
	if m.CPU != "" {
		cpu = m.CPU
	}
	if m.MemoryMiB != 0 {
		mem = m.MemoryMiB
	}
	if m.Cmdline != "" {
		cmdline += " " + m.Cmdline
	}
	return []string{
		"-machine", "pc", "-accel", "tcg", "-cpu", cpu, "-smp", "1", "-m", strconv.Itoa(mem),
		"-nodefaults", "-no-user-config", "-display", "none", "-no-reboot",
		"-kernel", k.VmlinuzPath(), "-initrd", initrd,
		"-append", cmdline,
		"-serial", "file:" + console,
	}
}
