package pool

import (
	"errors"
	"fmt"

	"github.com/quiverstorage/quiver/internal/storage"
)

// Sentinels. Callers test them with errors.Is; each transport maps them once.
var (
	ErrInvalid            = errors.New("invalid argument")
	ErrVolumeNotFound     = errors.New("volume not found")
	ErrDiskNotFound       = errors.New("disk not found")
	ErrSnapshotNotFound   = errors.New("snapshot not found")
	ErrAttachmentNotFound = errors.New("attachment not found")
	ErrExists             = errors.New("already exists")
	ErrBusy               = errors.New("busy with another operation")
	ErrCapacity           = errors.New("capacity exceeded")
	// ErrNoSpace, ErrIO, ErrReadOnly and ErrNotSupported are the storage
	// layer's classes (internal/storage): a full filesystem, a failing
	// device, a read-only pool or filesystem, a missing feature.
	ErrNoSpace      = storage.ErrNoSpace
	ErrIO           = storage.ErrIO
	ErrReadOnly     = storage.ErrReadOnly
	ErrOutOfRange   = errors.New("offset or length beyond the end of the disk")
	ErrClosed       = errors.New("disk handle closed")
	ErrNotSupported = storage.ErrNotSupported
	// ErrDiskRemoved ends the handles of a disk that was removed (alone or
	// with its volume): a disk created later under the same name is another
	// disk, which they never reach.
	ErrDiskRemoved = errors.New("disk removed while open")
	// ErrSyncFailed is the failure of an fdatasync of a disk, and of every
	// later flush and FUA write of that disk until it is reopened: writes
	// not yet flushed when it failed may be lost (disk.go, sync).
	ErrSyncFailed = errors.New("sync failed: data not flushed before may be lost")
	// ErrVolumeFailed refuses changes to a volume whose metadata is in an
	// unknown state on disk: a directory sync failed after a rename
	// (durable.ErrUncertain). Restarting the server reloads it from disk.
	ErrVolumeFailed = errors.New("volume metadata in an unknown state after a failed sync; restart the server to reload it")
	// ErrBroken refuses an operation on a volume quarantined at start-up
	// because its files are damaged or hostile; the message says why.
	ErrBroken = errors.New("volume is broken (quarantined)")
	// ErrHostile is a file in the pool that would lead outside it or share
	// its data with a file outside it (a symbolic link, a hard link).
	ErrHostile = errors.New("file in the pool leads outside it")
	// ErrHasSnapshots refuses to delete a volume that has snapshots unless
	// the caller says they go too (DeleteOptions.Recursive), as zfs destroy
	// without -r does.
	ErrHasSnapshots = errors.New("volume has snapshots")
	// ErrLocked refuses to open a pool another process has open.
	ErrLocked = errors.New("pool is locked by another process")
	// ErrNotPool refuses a directory that does not hold a pool and must not
	// silently become a new, empty one.
	ErrNotPool = errors.New("not a quiver pool")
	// ErrNoKeyProvider refuses to create an encrypted volume on a node
	// with no key provider configured (Options.Keyring).
	ErrNoKeyProvider = errors.New("no key provider configured for encrypted volumes")
	// ErrKeyUnavailable refuses to open an encrypted volume whose data key
	// cannot be unwrapped; the error also matches the provider's cause
	// (crypt.ErrUnreachable, ErrKEKRevoked, ErrKEKNotFound, ErrProvider).
	ErrKeyUnavailable = errors.New("data key of the encrypted volume unavailable")
	// ErrEncrypted refuses what would hand an encrypted volume's
	// ciphertext out as its disks (direct access to the image files).
	ErrEncrypted = errors.New("volume is encrypted")
	// ErrKeyShared refuses to shred a volume whose data key other volumes
	// (its clones) share, unless they are named to be shredded too.
	ErrKeyShared = errors.New("data key shared with other volumes")
	// ErrNotMounted refuses a pool directory expected to be a mount point
	// that is not one.
	ErrNotMounted = errors.New("pool filesystem not mounted")
)

// FieldError says which field of a request broke which rule. It matches
// ErrInvalid with errors.Is.
type FieldError struct {
	Field string // e.g. "disks[1].name"
	Value string // the offending value, quoted in the message
	Rule  string // e.g. "must be a DNS label"
}

func (e *FieldError) Error() string {
	if e.Value == "" {
		return fmt.Sprintf("%s: %s", e.Field, e.Rule)
	}
	return fmt.Sprintf("%s %q: %s", e.Field, e.Value, e.Rule)
}

// Is makes errors.Is(err, ErrInvalid) true for a FieldError.
func (e *FieldError) Is(target error) bool { return target == ErrInvalid }

func invalid(field, value, rule string) error {
	return &FieldError{Field: field, Value: value, Rule: rule}
}
