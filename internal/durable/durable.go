package durable

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strings"

	"github.com/quiverstorage/quiver/internal/storage"
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

// WriteFile replaces rel in fsys with data atomically: it writes a temporary
// file in the same directory, fsyncs it, renames it over rel and fsyncs the
// directory. Every step resolves its path beneath fsys's root, so a
// directory swapped for a symbolic link is refused, not written through.
// When WriteFile returns nil the new content is durable; after a crash at
// any point rel holds either the old or the new content, and at worst a
// temporary file (see IsTemp) is left beside it.
//
// An error matching ErrUncertain comes only from the directory sync after
// the rename (see ErrUncertain); any other error leaves the old content, and
// no temporary file, behind.
func WriteFile(fsys storage.FS, rel string, data []byte, perm fs.FileMode) error {
	dir, name := path.Split(rel)
	dir = strings.TrimSuffix(dir, "/")
	if dir == "" {
		dir = "."
	}
	full := filepath.Join(fsys.Path(), rel)
	tmp := path.Join(dir, TempPrefix+name+"-"+randomSuffix())
	f, err := fsys.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_EXCL, perm)
	if err != nil {
		return fmt.Errorf("write %s: %w", full, err)
	}
	_, werr := f.WriteAt(data, 0)
	if werr == nil {
		werr = f.Chmod(perm)
	}
	if werr == nil {
		werr = f.Sync()
	}
	if cerr := f.Close(); werr == nil {
		werr = cerr
	}
	if werr == nil {
		werr = fsys.Rename(tmp, rel)
	}
	if werr != nil {
		_ = fsys.Remove(tmp)
		return fmt.Errorf("write %s: %w", full, werr)
	}
	if err := fsys.SyncDir(dir); err != nil {
		return fmt.Errorf("write %s: %w: %w", full, ErrUncertain, err)
	}
	return nil
}

// WriteJSON is WriteFile of v encoded as indented JSON with a final newline,
// readable by its owner only (0600): manifests name volumes and disks, and
// attachments hold tokens.
func WriteJSON(fsys storage.FS, rel string, v any) error {
	data, err := encodeJSON(rel, v)
	if err != nil {
		return err
	}
	return WriteFile(fsys, rel, data, 0o600)
}

// CreateJSON creates rel exclusively (it must not exist), writes v encoded
// as WriteJSON encodes it, and returns the file open and NOT synced: nothing
// is durable when it returns. It is for a file in a staged directory, which
// no reader sees until a rename publishes the directory: there the file
// needs no temporary name, and the caller syncs the file and its directory
// before the rename, side by side with the other sync points of the staged
// object if it likes. On error nothing is left behind.
func CreateJSON(fsys storage.FS, rel string, v any) (storage.File, error) {
	data, err := encodeJSON(rel, v)
	if err != nil {
		return nil, err
	}
	full := filepath.Join(fsys.Path(), rel)
	f, err := fsys.OpenFile(rel, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return nil, fmt.Errorf("write %s: %w", full, err)
	}
	if _, err := f.WriteAt(data, 0); err != nil {
		_ = f.Close()
		_ = fsys.Remove(rel)
		return nil, fmt.Errorf("write %s: %w", full, err)
	}
	return f, nil
}

// encodeJSON is v as indented JSON with a final newline.
func encodeJSON(rel string, v any) ([]byte, error) {
	data, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return nil, fmt.Errorf("encode %s: %w", rel, err)
	}
	return append(data, '\n'), nil
}

// SyncDir fsyncs the directory rel so that the entries created, renamed or
// removed in it are durable.
func SyncDir(fsys storage.FS, rel string) error { return fsys.SyncDir(rel) }

// Rename renames oldrel to newrel and fsyncs both parent directories, so
// that when it returns nil the move is durable. Renaming a directory onto an
// existing non-empty directory fails, which callers use as an atomic
// "create if absent". When a directory sync fails the error matches
// ErrUncertain: the move is done but may not survive a crash; any other
// error means nothing moved.
func Rename(fsys storage.FS, oldrel, newrel string) error {
	if err := fsys.Rename(oldrel, newrel); err != nil {
		return err
	}
	oldDir, newDir := path.Dir(oldrel), path.Dir(newrel)
	err := fsys.SyncDir(newDir)
	if err == nil && oldDir != newDir {
		err = fsys.SyncDir(oldDir)
	}
	if err != nil {
		return fmt.Errorf("rename %s to %s: %w: %w", oldrel, newrel, ErrUncertain, err)
	}
	return nil
}

// WriteJSONPath is WriteJSON of the file at path, outside any pool: its
// directory is the root.
func WriteJSONPath(path string, v any) error {
	fsys, err := storage.OpenOS(filepath.Dir(path))
	if err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	defer fsys.Close()
	return WriteJSON(fsys, filepath.Base(path), v)
}

// SyncDirPath is SyncDir of the directory at dir, outside any pool.
func SyncDirPath(dir string) error {
	fsys, err := storage.OpenOS(dir)
	if err != nil {
		return fmt.Errorf("sync dir %s: %w", dir, err)
	}
	defer fsys.Close()
	return fsys.SyncDir(".")
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

func randomSuffix() string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}
