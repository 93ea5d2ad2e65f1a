package migration

import (
	"bufio"
	"debug/elf"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

// busyboxPath is where Debian's busybox-static package installs busybox.
const busyboxPath = "/bin/busybox"

// guestDisks are the guest's disks, in the order the guest writer numbers
// them (record disk 0, 1): the quiver disk names, which are also the QEMU
// device ids and the guest's device names.
var guestDisks = []string{"vda", "vdb"}

// guest is what QEMU boots: the kernel and an initramfs whose /init loads
// the virtio modules and runs the guest writer on every disk.
type guest struct {
	kernel *kernel
	initrd string
}

// buildGuest builds the initramfs in dir: busybox-static with a symlink per
// applet, the guest writer (built here for linux/amd64 without cgo), the
// kernel's virtio modules, /dev/console and /init.
func buildGuest(dir string) (*guest, error) {
	k, err := fetchKernel()
	if err != nil {
		return nil, err
	}
	busybox, applets, err := staticBusybox()
	if err != nil {
		return nil, fmt.Errorf("%w: %v (install Debian's busybox-static)", errMissing, err)
	}
	writer := filepath.Join(dir, "guestwriter")
	build := exec.Command("go", "build", "-trimpath", "-ldflags=-s -w", "-o", writer, "./guestwriter")
	build.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux", "GOARCH=amd64")
	if out, err := build.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("build the guest writer: %v\n%s", err, out)
	}
	gw, err := os.ReadFile(writer)
	if err != nil {
		return nil, err
	}

	g := &guest{kernel: k, initrd: filepath.Join(dir, "initramfs.cpio")}
	f, err := os.Create(g.initrd)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	w := newCPIOWriter(f)
	for _, d := range []string{"bin", "dev", "proc", "sys", "lib", "lib/modules"} {
		w.dir(d)
	}
	w.charDevice("dev/console", 0o600, 5, 1)
	w.file("bin/busybox", 0o755, busybox)
	for _, a := range applets {
		if a != "busybox" {
			w.symlink("bin/"+a, "busybox")
		}
	}
	w.file("bin/guestwriter", 0o755, gw)
	for _, m := range k.Modules {
		b, err := os.ReadFile(k.modulePath(m))
		if err != nil {
			return nil, err
		}
		w.file("lib/modules/"+m+".ko", 0o644, b)
	}
	w.file("init", 0o755, []byte(initScript(k.Modules)))
	if err := w.close(); err != nil {
		return nil, fmt.Errorf("write %s: %w", g.initrd, err)
	}
	return g, f.Close()
}

// initScript is the guest's /init: mount the pseudo filesystems, load the
// modules in order, run the guest writer, and idle if it ever exits so that
// the test can still inspect the VM.
func initScript(modules []string) string {
	return fmt.Sprintf(`#!/bin/sh
export PATH=/bin
mount -t devtmpfs devtmpfs /dev
mount -t proc proc /proc
mount -t sysfs sysfs /sys
for m in %s; do
	insmod /lib/modules/$m.ko || echo "init: insmod $m failed"
done
guestwriter /dev/%s
echo "init: guestwriter exited with status $?"
while :; do sleep 3600; done
`, strings.Join(modules, " "), strings.Join(guestDisks, " /dev/"))
}

// staticBusybox reads busybox-static's binary and lists its applets. A
// dynamically linked busybox (Debian's busybox package) would not run in
// an initramfs without its libraries, so it is refused.
func staticBusybox() ([]byte, []string, error) {
	f, err := elf.Open(busyboxPath)
	if err != nil {
		return nil, nil, fmt.Errorf("busybox: %w", err)
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			return nil, nil, fmt.Errorf("%s is dynamically linked", busyboxPath)
		}
	}
	out, err := exec.Command(busyboxPath, "--list").Output()
	if err != nil {
		return nil, nil, fmt.Errorf("%s --list: %w", busyboxPath, err)
	}
	applets := strings.Fields(string(out))
	for _, need := range []string{"sh", "mount", "insmod", "sleep"} {
		if !strings.Contains("\n"+string(out), "\n"+need+"\n") {
			return nil, nil, fmt.Errorf("%s has no applet %s", busyboxPath, need)
		}
	}
	b, err := os.ReadFile(busyboxPath)
	return b, applets, err
}

// cpioWriter writes a cpio archive in the "new ASCII" (newc) format, the
// one the kernel unpacks as an initramfs: per entry a 110-byte header of
// "070701" and thirteen 8-digit hex fields, the NUL-terminated name padded
// to 4 bytes, then the data padded to 4 bytes; a "TRAILER!!!" entry ends
// the archive. The first error sticks and is returned by close.
type cpioWriter struct {
	w   *bufio.Writer
	ino uint32
	err error
}

func newCPIOWriter(w io.Writer) *cpioWriter { return &cpioWriter{w: bufio.NewWriter(w)} }

const (
	cpioDir     = 0o040000
	cpioRegular = 0o100000
	cpioSymlink = 0o120000
	cpioCharDev = 0o020000
)

func (c *cpioWriter) dir(name string) { c.entry(name, cpioDir|0o755, nil, 0, 0) }

func (c *cpioWriter) file(name string, perm uint32, data []byte) {
	c.entry(name, cpioRegular|perm, data, 0, 0)
}

func (c *cpioWriter) symlink(name, target string) {
	c.entry(name, cpioSymlink|0o777, []byte(target), 0, 0)
}

func (c *cpioWriter) charDevice(name string, perm, major, minor uint32) {
	c.entry(name, cpioCharDev|perm, nil, major, minor)
}

func (c *cpioWriter) close() error {
	c.entry("TRAILER!!!", 0, nil, 0, 0)
	if c.err == nil {
		c.err = c.w.Flush()
	}
	return c.err
}

func (c *cpioWriter) entry(name string, mode uint32, data []byte, rdevMajor, rdevMinor uint32) {
	if c.err != nil {
		return
	}
	c.ino++
	nlink := uint32(1)
	if mode&0o170000 == cpioDir {
		nlink = 2
	}
	fields := []uint32{
		c.ino, mode, 0, 0, nlink, 0, // ino, mode, uid, gid, nlink, mtime
		uint32(len(data)), 0, 0, // filesize, devmajor, devminor
		rdevMajor, rdevMinor, uint32(len(name) + 1), 0, // rdevmajor, rdevminor, namesize, check
	}
	if name == "TRAILER!!!" {
		fields[0], fields[4] = 0, 1
	}
	hdr := "070701"
	for _, v := range fields {
		hdr += fmt.Sprintf("%08X", v)
	}
	c.write([]byte(hdr))
	c.write(append([]byte(name), 0))
	c.pad(len(hdr) + len(name) + 1)
	c.write(data)
	c.pad(len(data))
}

func (c *cpioWriter) write(b []byte) {
	if c.err == nil {
		_, c.err = c.w.Write(b)
	}
}

// pad writes the zeros that bring n bytes up to a multiple of 4.
func (c *cpioWriter) pad(n int) {
	c.write(make([]byte, (4-n%4)%4))
}
