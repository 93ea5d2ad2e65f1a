// Package storage is the one layer through which quiver's pool touches its
// filesystem: opening and creating files beneath the pool root, reading,
// writing (with and without RWF_NOWAIT), syncing, punching holes, walking
// data runs, cloning and copying files, renaming, removing and syncing
// directories, and reading the filesystem's usage.
//
// Callers see two small interfaces, FS (a directory tree rooted at the pool)
// and File (an open file), and sentinel errors (ErrNoSpace, ErrIO,
// ErrReadOnly, ErrNotSupported, ErrWouldBlock, ErrLocked, ErrEscape, ...)
// that wrap the kernel's errno, so errors.Is(err, unix.ENOSPC) still holds.
// OpenOS is the operating system's FS; paths are resolved beneath its root
// with the rules of package beneath (openat2 with RESOLVE_BENEATH and
// RESOLVE_NO_SYMLINKS, or an O_NOFOLLOW walk), and the ioctls come from
// package fscap. Twins of the same interfaces stand in for it in tests:
// internal/faultio injects faults, internal/storage/crashfs cuts power.
//
// Every sync point (File.Sync, FS.SyncDir) is labelled with its call site
// (SyncLabel): tests count and name them, and the mutation check
// (scripts/mutate-syncs, docs/durability.md) turns one label's syncs into
// no-ops to show that some test notices.
//
// Batcher (os.go, uring.go) tries many RWF_NOWAIT reads and writes of a
// file at once: through a small io_uring of the file's own, built on the
// raw io_uring_setup and io_uring_enter system calls, where the kernel
// offers it (IOUring, decided once per process), else with one system call
// each. Its errors are classified as those of TryReadAt and TryWriteAt.
//
// The generic mechanisms built on the interfaces live here once: the walk
// over data runs (DataRuns), the sparse copy (CopySparse) and the
// reflink-or-copy fallback (CloneOrCopy).
//
// Imports from quiver: beneath, fscap.
package storage
