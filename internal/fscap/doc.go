// Package fscap finds out what the pool's filesystem can do and copies files
// with the best method it offers.
//
// Probe tries each feature for real on small temporary files (reflink with
// FICLONE, copy_file_range, SEEK_DATA/SEEK_HOLE, the XFS extent size hint)
// instead of trusting the filesystem's name, because the same filesystem can
// be formatted with or without a feature (XFS with reflink=0, for example).
//
// Reflink and ReflinkRange share a whole file's or one range's extents with
// another file; Solid, SetExtentSizeHint, Allocated, Usage and Extents are
// the other ioctls and figures the storage layer needs. The mechanisms built
// on them (the walk over data runs, the sparse copy, the reflink-or-copy
// fallback) live once in internal/storage, the only user of this package
// besides tests and benchmarks.
//
// The package is Linux-only: it talks to the kernel through ioctls, lseek and
// statfs via golang.org/x/sys/unix. It owns no state and knows nothing of
// volumes, disks or the pool layout; it must not import other quiver packages.
//
// Imports from quiver: nothing.
package fscap
