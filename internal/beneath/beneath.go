package beneath

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"
)

// Root is an open directory beneath which every path is resolved. It is safe
// for concurrent use. Paths given to its methods are relative to it, use
// "/" between components, and may not be absolute or contain "..".
type Root struct {
	fd   int    // O_PATH descriptor of the root directory
	path string // for messages only
}

// noOpenat2 forces the O_NOFOLLOW walk; the package's tests set it to cover
// both resolvers.
var noOpenat2 bool

// Open opens dir as a root. dir itself is resolved as given (an operator
// may point quiver at a symbolic link to the pool); nothing beneath it is.
func Open(dir string) (*Root, error) {
	fd, err := unix.Open(dir, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, &fs.PathError{Op: "open", Path: dir, Err: err}
	}
	return &Root{fd: fd, path: dir}, nil
}

// Close releases the root's descriptor.
func (r *Root) Close() error { return unix.Close(r.fd) }

// Path returns the directory the root was opened at.
func (r *Root) Path() string { return r.path }

// clean checks rel and returns it in canonical form ("." for the root).
func clean(rel string) (string, error) {
	if rel == "" || rel == "." {
		return ".", nil
	}
	if filepath.IsAbs(rel) {
		return "", fmt.Errorf("%q: %w", rel, ErrEscape)
	}
	for _, c := range strings.Split(rel, "/") {
		if c == ".." {
			return "", fmt.Errorf("%q: %w", rel, ErrEscape)
		}
	}
	return filepath.Clean(rel), nil
}

// openat opens rel beneath the root with flags (O_NOFOLLOW and O_CLOEXEC are
// added) and returns the descriptor.
func (r *Root) openat(rel string, flags int, perm uint32) (int, error) {
	rel, err := clean(rel)
	if err != nil {
		return -1, err
	}
	flags |= unix.O_CLOEXEC | unix.O_NOFOLLOW
	if rel == "." {
		flags &^= unix.O_NOFOLLOW
	}
	if !noOpenat2 {
		how := unix.OpenHow{Flags: uint64(flags), Mode: uint64(perm),
			Resolve: unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS}
		fd, err := unix.Openat2(r.fd, rel, &how)
		switch {
		case err == nil:
			return fd, nil
		case errors.Is(err, unix.ENOSYS), errors.Is(err, unix.EPERM) && flags&unix.O_CREAT == 0:
			// No openat2 (or a seccomp filter refusing it): walk instead.
		default:
			return -1, r.pathError("open", rel, err)
		}
	}
	return r.walk(rel, flags, perm)
}

// walk resolves rel one component at a time, each opened with O_NOFOLLOW
// relative to its parent, so that no symbolic link is ever followed.
func (r *Root) walk(rel string, flags int, perm uint32) (int, error) {
	comps := strings.Split(rel, "/")
	dir := r.fd
	defer func() {
		if dir != r.fd {
			unix.Close(dir)
		}
	}()
	for _, c := range comps[:len(comps)-1] {
		next, err := unix.Openat(dir, c, unix.O_PATH|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if err != nil {
			return -1, r.pathError("open", rel, err)
		}
		if dir != r.fd {
			unix.Close(dir)
		}
		dir = next
	}
	fd, err := unix.Openat(dir, comps[len(comps)-1], flags, perm)
	if err != nil {
		return -1, r.pathError("open", rel, err)
	}
	return fd, nil
}

// pathError wraps errno; the errors of a symbolic link or an escape also
// match ErrEscape.
func (r *Root) pathError(op, rel string, errno error) error {
	full := filepath.Join(r.path, rel)
	// ELOOP: a symbolic link (O_NOFOLLOW, RESOLVE_NO_SYMLINKS); EXDEV:
	// RESOLVE_BENEATH refused an escape; ENOTDIR from O_DIRECTORY|O_NOFOLLOW
	// on a link to a directory in the walk.
	if errors.Is(errno, unix.ELOOP) || errors.Is(errno, unix.EXDEV) ||
		errors.Is(errno, unix.ENOTDIR) && r.crossesLink(rel) {
		return &fs.PathError{Op: op, Path: full, Err: fmt.Errorf("%w: %w", ErrEscape, errno)}
	}
	return &fs.PathError{Op: op, Path: full, Err: errno}
}

// crossesLink reports whether a component of rel is a symbolic link
// (O_DIRECTORY|O_NOFOLLOW on a link fails with ENOTDIR, not ELOOP).
func (r *Root) crossesLink(rel string) bool {
	dir := r.fd
	defer func() {
		if dir != r.fd {
			unix.Close(dir)
		}
	}()
	for _, c := range strings.Split(rel, "/") {
		var st unix.Stat_t
		if unix.Fstatat(dir, c, &st, unix.AT_SYMLINK_NOFOLLOW) != nil {
			return false
		}
		if st.Mode&unix.S_IFMT == unix.S_IFLNK {
			return true
		}
		next, err := unix.Openat(dir, c, unix.O_PATH|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if err != nil {
			return false
		}
		if dir != r.fd {
			unix.Close(dir)
		}
		dir = next
	}
	return false
}

// OpenFile opens rel beneath the root like os.OpenFile, never following a
// symbolic link. Flags are os.O_* flags.
func (r *Root) OpenFile(rel string, flag int, perm os.FileMode) (*os.File, error) {
	fd, err := r.openat(rel, flag, uint32(perm.Perm()))
	if err != nil {
		return nil, err
	}
	return os.NewFile(uintptr(fd), filepath.Join(r.path, rel)), nil
}

// OpenRegular opens rel like OpenFile and then requires a regular file with
// exactly one hard link, so that nothing reached through it has another name
// outside the root. A FIFO or device is refused without blocking in open.
func (r *Root) OpenRegular(rel string, flag int) (*os.File, error) {
	fd, err := r.openat(rel, flag|unix.O_NONBLOCK, 0)
	if err != nil {
		return nil, err
	}
	name := filepath.Join(r.path, rel)
	if err := checkRegular(fd, name); err != nil {
		unix.Close(fd)
		return nil, err
	}
	if flag&unix.O_NONBLOCK == 0 {
		if _, err := unix.FcntlInt(uintptr(fd), unix.F_SETFL, flag); err != nil {
			unix.Close(fd)
			return nil, &fs.PathError{Op: "fcntl", Path: name, Err: err}
		}
	}
	return os.NewFile(uintptr(fd), name), nil
}

// CheckRegular requires f to be a regular file with one hard link.
func CheckRegular(f *os.File) error { return checkRegular(int(f.Fd()), f.Name()) }

func checkRegular(fd int, name string) error {
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return &fs.PathError{Op: "fstat", Path: name, Err: err}
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG {
		return &fs.PathError{Op: "open", Path: name, Err: ErrNotRegular}
	}
	if st.Nlink > 1 {
		return &fs.PathError{Op: "open", Path: name, Err: fmt.Errorf("%w (%d links)", ErrHardLink, st.Nlink)}
	}
	return nil
}

// OpenDir opens the directory rel beneath the root for reading.
func (r *Root) OpenDir(rel string) (*os.File, error) {
	return r.OpenFile(rel, unix.O_RDONLY|unix.O_DIRECTORY, 0)
}

// ReadDir lists the directory rel beneath the root, sorted by name.
func (r *Root) ReadDir(rel string) ([]fs.DirEntry, error) {
	d, err := r.OpenDir(rel)
	if err != nil {
		return nil, err
	}
	defer d.Close()
	es, err := d.ReadDir(-1)
	if err != nil {
		return nil, err
	}
	sortEntries(es)
	return es, nil
}

// Lstat describes rel itself (a symbolic link is described, not followed).
func (r *Root) Lstat(rel string) (fs.FileInfo, error) {
	parent, base, err := r.openParent(rel)
	if err != nil {
		return nil, err
	}
	defer r.closeParent(parent)
	var st unix.Stat_t
	if err := unix.Fstatat(parent, base, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return nil, r.pathError("lstat", rel, err)
	}
	return statInfo(filepath.Base(rel), &st), nil
}

// Mkdir makes the directory rel beneath the root.
func (r *Root) Mkdir(rel string, perm os.FileMode) error {
	parent, base, err := r.openParent(rel)
	if err != nil {
		return err
	}
	defer r.closeParent(parent)
	if err := unix.Mkdirat(parent, base, uint32(perm.Perm())); err != nil {
		return r.pathError("mkdir", rel, err)
	}
	return nil
}

// Remove removes the file, symbolic link or empty directory rel; a link is
// removed, never followed.
func (r *Root) Remove(rel string) error {
	parent, base, err := r.openParent(rel)
	if err != nil {
		return err
	}
	defer r.closeParent(parent)
	return r.unlink(parent, base, rel)
}

func (r *Root) unlink(parent int, base, rel string) error {
	err := unix.Unlinkat(parent, base, 0)
	if errors.Is(err, unix.EISDIR) || errors.Is(err, unix.EPERM) {
		err = unix.Unlinkat(parent, base, unix.AT_REMOVEDIR)
	}
	if err != nil {
		return r.pathError("remove", rel, err)
	}
	return nil
}

// RemoveAll removes rel and, if it is a directory, everything in it. Every
// entry is removed with unlinkat relative to its own directory's descriptor,
// so a symbolic link anywhere in the tree is removed itself and nothing it
// points to is touched. An absent rel is not an error.
func (r *Root) RemoveAll(rel string) error {
	parent, base, err := r.openParent(rel)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	defer r.closeParent(parent)
	if base == "." {
		return fmt.Errorf("remove %s: refusing to remove the root", r.path)
	}
	return r.removeAllAt(parent, base, rel)
}

func (r *Root) removeAllAt(parent int, base, rel string) error {
	err := unix.Unlinkat(parent, base, 0)
	if err == nil || errors.Is(err, unix.ENOENT) {
		return nil
	}
	if !errors.Is(err, unix.EISDIR) && !errors.Is(err, unix.EPERM) {
		return r.pathError("remove", rel, err)
	}
	fd, err := unix.Openat(parent, base, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return r.pathError("open", rel, err)
	}
	d := os.NewFile(uintptr(fd), filepath.Join(r.path, rel))
	defer d.Close()
	for {
		names, err := d.Readdirnames(256)
		for _, n := range names {
			if err := r.removeAllAt(fd, n, rel+"/"+n); err != nil {
				return err
			}
		}
		if err != nil || len(names) == 0 {
			break
		}
		// Entries were removed while reading: start over.
		if _, err := d.Seek(0, 0); err != nil {
			return err
		}
	}
	if err := unix.Unlinkat(parent, base, unix.AT_REMOVEDIR); err != nil && !errors.Is(err, unix.ENOENT) {
		return r.pathError("remove", rel, err)
	}
	return nil
}

// Rename moves oldrel to newrel, both beneath the root. Links are renamed,
// never followed.
func (r *Root) Rename(oldrel, newrel string) error {
	op, ob, err := r.openParent(oldrel)
	if err != nil {
		return err
	}
	defer r.closeParent(op)
	np, nb, err := r.openParent(newrel)
	if err != nil {
		return err
	}
	defer r.closeParent(np)
	if err := unix.Renameat(op, ob, np, nb); err != nil {
		return r.pathError("rename", oldrel, err)
	}
	return nil
}

// openParent opens the directory holding rel beneath the root and returns
// its descriptor with rel's last component.
func (r *Root) openParent(rel string) (int, string, error) {
	rel, err := clean(rel)
	if err != nil {
		return -1, "", err
	}
	dir, base := filepath.Split(rel)
	if dir == "" {
		return r.fd, base, nil
	}
	fd, err := r.openat(strings.TrimSuffix(dir, "/"), unix.O_PATH|unix.O_DIRECTORY, 0)
	if err != nil {
		return -1, "", err
	}
	return fd, base, nil
}

func (r *Root) closeParent(fd int) {
	if fd != r.fd {
		unix.Close(fd)
	}
}
