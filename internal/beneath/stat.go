package beneath

import (
	"io/fs"
	"slices"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// fileInfo is an fs.FileInfo from a Stat_t; Sys returns the *unix.Stat_t.
type fileInfo struct {
	name string
	st   unix.Stat_t
}

func statInfo(name string, st *unix.Stat_t) fs.FileInfo { return &fileInfo{name: name, st: *st} }

func (i *fileInfo) Name() string       { return i.name }
func (i *fileInfo) Size() int64        { return i.st.Size }
func (i *fileInfo) ModTime() time.Time { return time.Unix(i.st.Mtim.Unix()) }
func (i *fileInfo) IsDir() bool        { return i.Mode().IsDir() }
func (i *fileInfo) Sys() any           { return &i.st }

func (i *fileInfo) Mode() fs.FileMode {
	m := fs.FileMode(i.st.Mode & 0o777)
	switch i.st.Mode & unix.S_IFMT {
	case unix.S_IFDIR:
		m |= fs.ModeDir
	case unix.S_IFLNK:
		m |= fs.ModeSymlink
	case unix.S_IFIFO:
		m |= fs.ModeNamedPipe
	case unix.S_IFSOCK:
		m |= fs.ModeSocket
	case unix.S_IFCHR:
		m |= fs.ModeDevice | fs.ModeCharDevice
	case unix.S_IFBLK:
		m |= fs.ModeDevice
	}
	return m
}

// Links returns the number of hard links of a FileInfo from Lstat (1 for
// any other).
func Links(fi fs.FileInfo) uint64 {
	if st, ok := fi.Sys().(*unix.Stat_t); ok {
		return uint64(st.Nlink)
	}
	return 1
}

func sortEntries(es []fs.DirEntry) {
	slices.SortFunc(es, func(a, b fs.DirEntry) int { return strings.Compare(a.Name(), b.Name()) })
}
