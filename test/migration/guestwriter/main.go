// Command guestwriter runs inside the live-migration test's guest (see
// test/migration): it writes record i (package record) at offset
// i*record.Size of every disk named on the command line, for i = 0, 1, 2,
// ..., one disk after the other, each write with O_DIRECT|O_SYNC so that it
// has reached the storage server when pwrite returns. It prints its progress
// to the console about once a second:
//
//	guestwriter: start disks=/dev/vda,/dev/vdb slots=16384
//	guestwriter: seq 1234
//	guestwriter: I/O error: write seq 1235 to /dev/vdb: input/output error
//	guestwriter: disks full after seq 16383
//
// It stops at the first error (exit status 1) and idles once the disks are
// full. The test builds it with CGO_ENABLED=0 and puts it in the initramfs.
//
// Imports from quiver: test/migration/record.
package main

import (
	"fmt"
	"os"
	"strings"
	"syscall"
	"time"

	"github.com/quiverstorage/quiver/test/migration/record"
)

func main() {
	if len(os.Args) < 2 {
		fmt.Println("usage: guestwriter DEVICE...")
		os.Exit(2)
	}
	if err := run(os.Args[1:]); err != nil {
		fmt.Printf("guestwriter: %v\n", err)
		os.Exit(1)
	}
}

func run(paths []string) error {
	disks := make([]*os.File, len(paths))
	slots := int64(-1)
	for i, p := range paths {
		f, err := openDevice(p)
		if err != nil {
			return err
		}
		disks[i] = f
		size, err := f.Seek(0, 2)
		if err != nil {
			return fmt.Errorf("size of %s: %w", p, err)
		}
		if n := size / record.Size; slots < 0 || n < slots {
			slots = n
		}
	}
	// O_DIRECT needs a buffer aligned to the logical block size: an
	// anonymous mapping is page aligned.
	buf, err := syscall.Mmap(-1, 0, record.Size, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_PRIVATE|syscall.MAP_ANON)
	if err != nil {
		return fmt.Errorf("mmap: %w", err)
	}
	fmt.Printf("guestwriter: start disks=%s slots=%d\n", strings.Join(paths, ","), slots)
	last := time.Now()
	for seq := range slots {
		for i, f := range disks {
			record.Encode(buf, uint64(seq), uint64(i))
			if _, err := f.WriteAt(buf, seq*record.Size); err != nil {
				return fmt.Errorf("I/O error: write seq %d to %s: %w", seq, paths[i], err)
			}
		}
		if time.Since(last) >= time.Second {
			fmt.Printf("guestwriter: seq %d\n", seq)
			last = time.Now()
		}
	}
	fmt.Printf("guestwriter: disks full after seq %d\n", slots-1)
	for {
		time.Sleep(time.Hour)
	}
}

// openDevice opens a disk for direct, synchronous writes, waiting up to 10 s
// for its device node: virtio-blk probes asynchronously after insmod.
func openDevice(path string) (*os.File, error) {
	deadline := time.Now().Add(10 * time.Second)
	for {
		f, err := os.OpenFile(path, os.O_RDWR|syscall.O_DIRECT|syscall.O_SYNC, 0)
		if err == nil || !os.IsNotExist(err) || time.Now().After(deadline) {
			return f, err
		}
		time.Sleep(50 * time.Millisecond)
	}
}
