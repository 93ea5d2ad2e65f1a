package storage

import (
	"fmt"
	"io/fs"
	"syscall"

	"golang.org/x/sys/unix"
)

// ODirectory is the open flag that requires a directory (O_DIRECTORY).
const ODirectory = syscall.O_DIRECTORY

// Linker is implemented by the Sys() of a twin's fs.FileInfo.
type Linker interface{ Links() uint64 }

// Links returns the number of hard links of a FileInfo from this layer (1
// when it does not say).
func Links(fi fs.FileInfo) uint64 {
	switch s := fi.Sys().(type) {
	case *unix.Stat_t:
		return uint64(s.Nlink)
	case *syscall.Stat_t: // os.File.Stat
		return uint64(s.Nlink)
	case Linker:
		return s.Links()
	}
	return 1
}

// CheckRegular requires fi to describe a regular file with one hard link.
func CheckRegular(fi fs.FileInfo, name string) error {
	if !fi.Mode().IsRegular() {
		return &fs.PathError{Op: "open", Path: name, Err: ErrNotRegular}
	}
	if n := Links(fi); n > 1 {
		return &fs.PathError{Op: "open", Path: name, Err: fmt.Errorf("%w (%d links)", ErrHardLink, n)}
	}
	return nil
}
