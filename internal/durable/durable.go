package durable

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"
)

// TempPrefix starts the name of every temporary file this package creates.
// A directory scan at start-up may remove any file whose name begins with it.
const TempPrefix = ".tmp-"

// IsTemp reports whether name is a temporary file left by WriteFile.
func IsTemp(name string) bool { return strings.HasPrefix(name, TempPrefix) }

// ErrUncertain says that a rename was done but the directory sync that makes
// it durable failed: the file holds the new content now, and after a crash
// it may hold the old or the new. Nothing can be retried to settle it (a
// failed fsync is final, and a later one may succeed without the lost
// change), so the caller must treat the on-disk state as unknown: stop
// building on it and reload from disk once the storage is fixed. Every other
// error from this package means the old content is in place, on disk and
// after a crash.
var ErrUncertain = errors.New("renamed, but the directory sync failed: the change may or may not survive a crash")

// syncDir fsyncs an open directory; the package's tests replace it to make
// directory syncs fail.
var syncDir = func(d *os.File) error {
	if err := d.Sync(); err != nil {
		return fmt.Errorf("sync dir %s: %w", d.Name(), err)
	}
	return nil
}

// WriteFile replaces path with data atomically: it writes a temporary file in
// the same directory, fsyncs it, renames it over path and fsyncs the
// directory. When WriteFile returns nil the new content is durable; after a
// crash at any point path holds either the old or the new content, and at
// worst a temporary file (see IsTemp) is left beside it.
//
// An error matching ErrUncertain comes only from the directory sync after
// the rename (see ErrUncertain); any other error leaves the old content, and
// no temporary file, behind.
func WriteFile(path string, data []byte, perm os.FileMode) error {
	dir, base := filepath.Split(path)
	if dir == "" {
		dir = "."
	}
	d, err := os.Open(dir)
	if err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	defer d.Close()
	return WriteFileAt(d, base, data, perm)
}

// WriteFileAt is WriteFile of name in the open directory dir: the temporary
// file is created (never through a symbolic link), renamed and synced
// relative to dir, so a link put in place of dir's path meanwhile is not
// followed.
func WriteFileAt(dir *os.File, name string, data []byte, perm os.FileMode) error {
	path := filepath.Join(dir.Name(), name)
	dfd := int(dir.Fd())
	tmp := TempPrefix + name + "-" + randomSuffix()
	fd, err := unix.Openat(dfd, tmp, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, uint32(perm.Perm()))
	if err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	f := os.NewFile(uintptr(fd), filepath.Join(dir.Name(), tmp))
	_, werr := f.Write(data)
	if werr == nil {
		werr = f.Sync()
	}
	if cerr := f.Close(); werr == nil {
		werr = cerr
	}
	if werr == nil {
		werr = unix.Renameat(dfd, tmp, dfd, name)
	}
	if werr != nil {
		_ = unix.Unlinkat(dfd, tmp, 0)
		return fmt.Errorf("write %s: %w", path, werr)
	}
	if err := syncDir(dir); err != nil {
		return fmt.Errorf("write %s: %w: %w", path, ErrUncertain, err)
	}
	return nil
}

// WriteJSON is WriteFile of v encoded as indented JSON with a final newline,
// readable by its owner only (0600): manifests name volumes and disks.
func WriteJSON(path string, v any) error { return writeJSON(path, v, 0o600) }

// WriteSecretJSON is WriteJSON for a file holding secrets: owner only (0600).
func WriteSecretJSON(path string, v any) error { return writeJSON(path, v, 0o600) }

func writeJSON(path string, v any, perm os.FileMode) error {
	data, err := encodeJSON(path, v)
	if err != nil {
		return err
	}
	return WriteFile(path, data, perm)
}

// WriteJSONAt is WriteJSON of name in the open directory dir (WriteFileAt),
// owner only (0600) like WriteJSON.
func WriteJSONAt(dir *os.File, name string, v any) error { return writeJSONAt(dir, name, v, 0o600) }

// WriteSecretJSONAt is WriteSecretJSON of name in the open directory dir.
func WriteSecretJSONAt(dir *os.File, name string, v any) error {
	return writeJSONAt(dir, name, v, 0o600)
}

func writeJSONAt(dir *os.File, name string, v any, perm os.FileMode) error {
	data, err := encodeJSON(filepath.Join(dir.Name(), name), v)
	if err != nil {
		return err
	}
	return WriteFileAt(dir, name, data, perm)
}

func encodeJSON(path string, v any) ([]byte, error) {
	data, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return nil, fmt.Errorf("encode %s: %w", path, err)
	}
	return append(data, '\n'), nil
}

// ReadJSON decodes the JSON file at path into v, refusing unknown fields.
func ReadJSON(path string, v any) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	dec := json.NewDecoder(f)
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return fmt.Errorf("decode %s: %w", path, err)
	}
	return nil
}

// SyncDir fsyncs a directory so that the entries created, renamed or removed
// in it are durable.
func SyncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return fmt.Errorf("sync dir %s: %w", dir, err)
	}
	defer d.Close()
	return syncDir(d)
}

// Rename renames oldpath to newpath and fsyncs both parent directories, so
// that when it returns nil the move is durable. Renaming a directory onto an
// existing non-empty directory fails, which callers use as an atomic
// "create if absent". When a directory sync fails the error matches
// ErrUncertain: the move is done but may not survive a crash; any other
// error means nothing moved.
func Rename(oldpath, newpath string) error {
	if err := os.Rename(oldpath, newpath); err != nil {
		return err
	}
	oldDir, newDir := filepath.Dir(oldpath), filepath.Dir(newpath)
	err := SyncDir(newDir)
	if err == nil && oldDir != newDir {
		err = SyncDir(oldDir)
	}
	if err != nil {
		return fmt.Errorf("rename %s to %s: %w: %w", oldpath, newpath, ErrUncertain, err)
	}
	return nil
}

// SyncFile opens path and fsyncs it.
func SyncFile(path string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	return f.Sync()
}

func randomSuffix() string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}
