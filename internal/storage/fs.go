package storage

import (
	"io/fs"

	"github.com/quiverstorage/quiver/internal/fscap"
)

// Caps is what a filesystem was found to support (fscap.Probe).
type Caps = fscap.Caps

// ProbeError is FS.Probe's error when it could not tell whether the
// filesystem has some features (fscap.ProbeError): unknown, not missing.
type ProbeError = fscap.ProbeError

// Extent is one extent of a file's data: where it lies in the file and on
// the device, and its FIEMAP flags (fscap.ExtentShared: shared by a
// reflink with another file).
type Extent = fscap.Extent

// Flags of an Extent.
const (
	ExtentUnknown = fscap.ExtentUnknown // no device address yet
	ExtentShared  = fscap.ExtentShared  // shared by a reflink with another file
)

// FS is a directory tree beneath one root, the pool directory. Paths are
// relative to the root, use "/" between components, and may not be absolute,
// contain "..", or pass through a symbolic link (ErrEscape). FS is safe for
// concurrent use.
//
// Durability: creates, renames, removes and mkdirs in a directory are
// durable once SyncDir of that directory returns nil after them (for a
// rename, of both directories); file data once File.Sync returns nil.
type FS interface {
	// Path is the root's path, for messages.
	Path() string
	// OpenFile opens rel like os.OpenFile (os.O_* flags).
	OpenFile(rel string, flag int, perm fs.FileMode) (File, error)
	// OpenRegular opens rel and requires a regular file with one hard link
	// (ErrNotRegular, ErrHardLink); a FIFO does not block the open.
	OpenRegular(rel string, flag int) (File, error)
	// ReadDir lists the directory rel, sorted by name.
	ReadDir(rel string) ([]fs.DirEntry, error)
	// Lstat describes rel itself; a symbolic link is not followed.
	Lstat(rel string) (fs.FileInfo, error)
	Mkdir(rel string, perm fs.FileMode) error
	// Remove removes a file, link or empty directory.
	Remove(rel string) error
	// RemoveAll removes rel and everything beneath it; absent is no error.
	RemoveAll(rel string) error
	// Rename moves oldrel to newrel; renaming a directory onto a non-empty
	// one fails.
	Rename(oldrel, newrel string) error
	// SyncDir makes the entries created, renamed and removed in the
	// directory rel durable: a sync point.
	SyncDir(rel string) error
	// Usage returns the filesystem's size and the bytes available to
	// unprivileged users.
	Usage() (total, free int64, err error)
	// Allocated returns the bytes of storage rel occupies.
	Allocated(rel string) (int64, error)
	// Extents returns the extent map of the regular file rel, in file
	// order; ErrNotSupported where the filesystem has none (tmpfs, NFS).
	Extents(rel string) ([]Extent, error)
	// Probe finds out what the filesystem supports, trying each feature on
	// temporary files in the directory rel. Features it could not tell are
	// named by a *ProbeError in its error (fscap.Probe).
	Probe(rel string) (Caps, error)
	Close() error
}

// Advice is a hint for File.Advise.
type Advice int

const (
	AdviseWillNeed Advice = iota // read the range ahead
	AdviseDontNeed               // drop the range from the page cache
)

// File is an open file of an FS.
type File interface {
	// Name is the file's path, for messages.
	Name() string
	Stat() (fs.FileInfo, error)
	ReadAt(p []byte, off int64) (int, error)
	// WriteAt is pwrite(2); a short write returns an error.
	WriteAt(p []byte, off int64) (int, error)
	// TryReadAt and TryWriteAt are preadv2 and pwritev2 with RWF_NOWAIT:
	// they fail with ErrWouldBlock instead of waiting, and with
	// ErrNotSupported where the filesystem refuses the flag. They allocate
	// nothing.
	TryReadAt(p []byte, off int64) (int, error)
	TryWriteAt(p []byte, off int64) (int, error)
	Truncate(size int64) error
	// Sync is fdatasync(2), a sync point: when it returns nil, every
	// write to the file that returned before it began is durable.
	Sync() error
	// Punch deallocates [off, off+length); it then reads as zeros. The
	// size stays.
	Punch(off, length int64) error
	// ZeroRange makes [off, off+length) read as zeros, keeping its
	// allocation; ErrNotSupported where the filesystem cannot.
	ZeroRange(off, length int64) error
	// SeekData returns the start of the first data at or after off
	// (ErrNoData if none); SeekHole the start of the first hole at or
	// after off (the end of file counts as one).
	SeekData(off int64) (int64, error)
	SeekHole(off int64) (int64, error)
	// Clone makes the file share all of src's content (FICLONE), taking
	// its size; CloneRange the range [off, off+length) (FICLONERANGE, 0:
	// to src's end). ErrNotSupported where extents cannot be shared.
	Clone(src File) error
	CloneRange(src File, off, length int64) error
	// CopyRange copies up to length bytes at off from src to the same
	// offset (copy_file_range) and returns how many it copied;
	// ErrNotSupported where the kernel refuses.
	CopyRange(src File, off, length int64) (int64, error)
	// Solid reports whether [off, off+length) is backed by a few extents
	// the file owns outright (fscap.Solid).
	Solid(off, length int64) (bool, error)
	// Sharing reports whether [off, off+length) holds written data and
	// whether any of it is shared with another file (fscap.Sharing), as
	// the filesystem stands in memory; ErrNotSupported without an extent
	// map.
	Sharing(off, length int64) (data, shared bool, err error)
	// SameBlocks reports whether every byte of [off, off+length) is written
	// data at the same device address as the same byte of other
	// (fscap.SameBlocks), as the filesystem stands in memory: the two files
	// share exactly these blocks. ErrNotSupported without an extent map,
	// or when other is not a file of the same kind.
	SameBlocks(other File, off, length int64) (bool, error)
	// Differences returns the ranges of [0, size) where the file and other
	// may hold different bytes (fscap.Differences): all but the holes of
	// both and the blocks they share. ErrNotSupported as SameBlocks.
	Differences(other File, size int64) ([][2]int64, error)
	// SharedBlocks returns the ranges of [0, size) where the file and
	// other map the very same written blocks (fscap.SharedBlocks).
	SharedBlocks(other File, size int64) ([][2]int64, error)
	// SetExtentSizeHint sets XFS's extent size hint (fscap).
	SetExtentSizeHint(bytes uint32) error
	// SetCowExtentSize sets XFS's copy-on-write extent size hint (fscap).
	SetCowExtentSize(bytes uint32) error
	// CowExtentSize returns the copy-on-write extent size XFS uses for
	// the file, 0 for its default (fscap).
	CowExtentSize() (uint32, error)
	Advise(off, length int64, advice Advice) error
	Chmod(mode fs.FileMode) error
	// Lock takes an exclusive lock of the file without waiting (flock);
	// ErrLocked when another open file holds it. Closing drops it.
	Lock() error
	Close() error
}

// IO is one read or write of a batch (Batcher).
type IO struct {
	Write bool
	P     []byte
	Off   int64
	// N and Err are the outcome, as TryReadAt's or TryWriteAt's. An IO
	// whose Err is set when the batch is tried is skipped.
	N   int
	Err error
}

// Batcher is implemented by files that try many reads and writes at once.
type Batcher interface {
	// TryBatch does every IO of ios whose Err is nil as TryReadAt or
	// TryWriteAt would (RWF_NOWAIT: ErrWouldBlock instead of waiting,
	// possibly a short transfer), in no particular order, and stores each
	// outcome in it. Where io_uring serves (IOUring) one system call
	// submits and completes up to 64 of them; otherwise each is its own
	// call. It allocates nothing unless an IO fails with an error of the
	// storage.
	TryBatch(ios []IO)
}

// Unwrapper is implemented by a File that wraps another (a twin's); Clone,
// CloneRange and CopyRange of the OS reach the OS file through it.
type Unwrapper interface{ Unwrap() File }

// Unwrap returns the innermost file under f.
func Unwrap(f File) File {
	for {
		u, ok := f.(Unwrapper)
		if !ok {
			return f
		}
		f = u.Unwrap()
	}
}
