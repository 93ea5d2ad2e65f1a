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

// syncDir is SyncDir; the package's tests replace it to make directory syncs
// fail.
var syncDir = SyncDir

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
	tmp := filepath.Join(dir, TempPrefix+base+"-"+randomSuffix())
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_EXCL, perm)
	if err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	_, werr := f.Write(data)
	if werr == nil {
		werr = f.Sync()
	}
	if cerr := f.Close(); werr == nil {
		werr = cerr
	}
	if werr == nil {
		werr = os.Rename(tmp, path)
	}
	if werr != nil {
		_ = os.Remove(tmp)
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
	data, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return fmt.Errorf("encode %s: %w", path, err)
	}
	return WriteFile(path, append(data, '\n'), perm)
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
	if err := d.Sync(); err != nil {
		return fmt.Errorf("sync dir %s: %w", dir, err)
	}
	return nil
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
	err := syncDir(newDir)
	if err == nil && oldDir != newDir {
		err = syncDir(oldDir)
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
