package testguest

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
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
	Type    string // QEMU's -machine; default pc
	Accel   string // QEMU's -accel; default tcg
	CPU     string // QEMU's -cpu; default qemu64
	Memory  string // QEMU's -m (MiB, or with a suffix: 131080K); default 128
	Cmdline string // kernel parameters after QEMUArgs' own
	// QMP is the unix socket of QEMU's QMP server (-qmp, QEMU does not
	// wait for a client: VM.DialQMP); none when empty.
	QMP string
}

// Args are QEMUArgs with m's changes.
func (m Machine) Args(k *Kernel, initrd, console string) []string {
	args := []string{
		"-machine", or(m.Type, "pc"), "-accel", or(m.Accel, "tcg"), "-cpu", or(m.CPU, "qemu64"),
		"-smp", "1", "-m", or(m.Memory, "128"),
		"-nodefaults", "-no-user-config", "-display", "none", "-no-reboot",
		"-kernel", k.VmlinuzPath(), "-initrd", initrd,
		"-append", strings.TrimSpace("console=ttyS0 loglevel=4 panic=-1 " + m.Cmdline),
		"-serial", "file:" + console,
	}
	if m.QMP != "" {
		args = append(args, "-qmp", "unix:"+m.QMP+",server=on,wait=off")
	}
	return args
}

// or is s, or def when s is empty.
func or(s, def string) string {
	if s == "" {
		return def
	}
	return s
}
