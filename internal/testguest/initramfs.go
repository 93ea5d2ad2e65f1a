package testguest

import (
	"bytes"
	"debug/elf"
	"encoding/binary"
	"fmt"
	"os"
	"os/exec"
	"strings"
)

// BusyboxPath is where Debian's busybox-static package installs busybox.
const BusyboxPath = "/bin/busybox"

// Initramfs is an initramfs being written: NewInitramfs has put in the
// base (directories, /dev/console, busybox with a symlink per applet, the
// kernel's modules as /lib/modules/<name>.ko); the caller adds its files
// and /init through the embedded writer, then closes it.
type Initramfs struct {
	*CPIOWriter
	f *os.File
}

// NewInitramfs creates the archive at path with the base of a guest for
// kernel k.
func NewInitramfs(path string, k *Kernel) (*Initramfs, error) {
	busybox, applets, err := staticBusybox()
	if err != nil {
		return nil, fmt.Errorf("%w: %v (install Debian's busybox-static)", ErrMissing, err)
	}
	f, err := os.Create(path)
	if err != nil {
		return nil, err
	}
	w := NewCPIOWriter(f)
	for _, d := range []string{"bin", "dev", "proc", "sys", "lib", "lib/modules", "etc", "mnt", "tmp"} {
		w.Dir(d)
	}
	w.CharDevice("dev/console", 0o600, 5, 1)
	w.File("bin/busybox", 0o755, busybox)
	for _, a := range applets {
		if a != "busybox" {
			w.Symlink("bin/"+a, "busybox")
		}
	}
	for _, m := range k.Modules {
		b, err := os.ReadFile(k.ModulePath(m))
		if err != nil {
			f.Close()
			return nil, err
		}
		w.File("lib/modules/"+m+".ko", 0o644, stripSignature(b))
	}
	return &Initramfs{CPIOWriter: w, f: f}, nil
}

// Close ends the archive and closes its file.
func (i *Initramfs) Close() error {
	err := i.CPIOWriter.Close()
	if cerr := i.f.Close(); err == nil {
		err = cerr
	}
	return err
}

// moduleSigMagic ends a signed module: the signature, then a struct
// module_signature whose last field is the signature's length (big-endian
// 32 bits), then this string.
const moduleSigMagic = "~Module signature appended~\n"

// stripSignature returns a module without its appended signature. A
// kernel that does not enforce signatures (CONFIG_MODULE_SIG_FORCE off)
// loads it all the same, and does not hash megabytes of module under TCG
// (sha256 of xfs.ko) to check it.
func stripSignature(ko []byte) []byte {
	const sigInfo = 12 // sizeof(struct module_signature)
	body, ok := bytes.CutSuffix(ko, []byte(moduleSigMagic))
	if !ok || len(body) < sigInfo {
		return ko
	}
	n := int(binary.BigEndian.Uint32(body[len(body)-4:]))
	if n > len(body)-sigInfo {
		return ko
	}
	return body[:len(body)-sigInfo-n]
}

// InsmodLines is the part of an /init script that loads the kernel's
// modules, dependencies first, complaining on the console ("init: insmod
// NAME failed") about any that fails.
func InsmodLines(k *Kernel) string {
	return fmt.Sprintf("for m in %s; do\n\tinsmod /lib/modules/$m.ko || echo \"init: insmod $m failed\"\ndone\n",
		strings.Join(k.Modules, " "))
}

// staticBusybox reads busybox-static's binary and lists its applets. A
// dynamically linked busybox (Debian's busybox package) would not run in
// an initramfs without its libraries, so it is refused.
func staticBusybox() ([]byte, []string, error) {
	f, err := elf.Open(BusyboxPath)
	if err != nil {
		return nil, nil, fmt.Errorf("busybox: %w", err)
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			return nil, nil, fmt.Errorf("%s is dynamically linked", BusyboxPath)
		}
	}
	out, err := exec.Command(BusyboxPath, "--list").Output()
	if err != nil {
		return nil, nil, fmt.Errorf("%s --list: %w", BusyboxPath, err)
	}
	applets := strings.Fields(string(out))
	for _, need := range []string{"sh", "mount", "insmod", "sleep"} {
		if !strings.Contains("\n"+string(out), "\n"+need+"\n") {
			return nil, nil, fmt.Errorf("%s has no applet %s", BusyboxPath, need)
		}
	}
	b, err := os.ReadFile(BusyboxPath)
	return b, applets, err
}

// Prologue is the start of a guest's /init: a shell with busybox on PATH,
// /dev, /proc and /sys mounted, and k's modules loaded.
func Prologue(k *Kernel) string {
	return "#!/bin/sh\nexport PATH=/bin\nmount -t devtmpfs devtmpfs /dev\nmount -t proc proc /proc\nmount -t sysfs sysfs /sys\n" +
		InsmodLines(k)
}

// File is a file of the guest besides /init: Path relative to the root
// (e.g. "bin/guestwriter").
type File struct {
	Path string
	Mode os.FileMode
	Data []byte
}

// Build fetches the kernel of spec and writes an initramfs at path whose
// /init is Prologue followed by body, with files besides. A missing kernel
// package or busybox is an error wrapping ErrMissing.
func Build(spec KernelSpec, path, body string, files ...File) (*Kernel, error) {
	k, err := FetchKernel(spec)
	if err != nil {
		return nil, fmt.Errorf("guest kernel: %w", err)
	}
	w, err := NewInitramfs(path, k)
	if err != nil {
		return nil, err
	}
	for _, f := range files {
		w.File(f.Path, uint32(f.Mode.Perm()), f.Data)
	}
	w.File("init", 0o755, []byte(Prologue(k)+body))
	if err := w.Close(); err != nil {
		return nil, fmt.Errorf("write %s: %w", path, err)
	}
	return k, nil
}
