package testguest

import (
	"bufio"
	"fmt"
	"io"
)

// CPIOWriter writes a cpio archive in the "new ASCII" (newc) format, the
// one the kernel unpacks as an initramfs: per entry a 110-byte header of
// "070701" and thirteen 8-digit hex fields, the NUL-terminated name padded
// to 4 bytes, then the data padded to 4 bytes; a "TRAILER!!!" entry ends
// the archive. The first error sticks and is returned by Close.
type CPIOWriter struct {
	w   *bufio.Writer
	ino uint32
	err error
}

// NewCPIOWriter returns a writer of an archive to w.
func NewCPIOWriter(w io.Writer) *CPIOWriter { return &CPIOWriter{w: bufio.NewWriter(w)} }

const (
	cpioDir     = 0o040000
	cpioRegular = 0o100000
	cpioSymlink = 0o120000
	cpioCharDev = 0o020000
)

// Dir adds a directory (mode 0755).
func (c *CPIOWriter) Dir(name string) { c.entry(name, cpioDir|0o755, nil, 0, 0) }

// File adds a regular file.
func (c *CPIOWriter) File(name string, perm uint32, data []byte) {
	c.entry(name, cpioRegular|perm, data, 0, 0)
}

// Symlink adds a symbolic link to target.
func (c *CPIOWriter) Symlink(name, target string) {
	c.entry(name, cpioSymlink|0o777, []byte(target), 0, 0)
}

// CharDevice adds a character device node.
func (c *CPIOWriter) CharDevice(name string, perm, major, minor uint32) {
	c.entry(name, cpioCharDev|perm, nil, major, minor)
}

// Close writes the trailer and flushes; it returns the first error.
func (c *CPIOWriter) Close() error {
	c.entry("TRAILER!!!", 0, nil, 0, 0)
	if c.err == nil {
		c.err = c.w.Flush()
	}
	return c.err
}

func (c *CPIOWriter) entry(name string, mode uint32, data []byte, rdevMajor, rdevMinor uint32) {
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

func (c *CPIOWriter) write(b []byte) {
	if c.err == nil {
		_, c.err = c.w.Write(b)
	}
}

// pad writes the zeros that bring n bytes up to a multiple of 4.
func (c *CPIOWriter) pad(n int) {
	c.write(make([]byte, (4-n%4)%4))
}
