// Package fscap finds out what the pool's filesystem can do and copies files
// with the best method it offers.
//
// Probe tries each feature for real on small temporary files (reflink with
// FICLONE, copy_file_range, SEEK_DATA/SEEK_HOLE, the XFS extent size hint)
// instead of trusting the filesystem's name, because the same filesystem can
// be formatted with or without a feature (XFS with reflink=0, for example).
//
// Clone and CopySparse make a disk file from another one: a reflink when the
// filesystem shares extents, otherwise a copy of the data runs only, so holes
// in a sparse disk stay holes. ReflinkRange clones one range of a file into
// another: a copy made while its source changed is brought up to date by
// re-cloning only the ranges that changed. DataBytes, Allocated, Usage and
// Extents report the numbers that progress totals, capacity checks and tests
// need.
//
// The package is Linux-only: it talks to the kernel through ioctls, lseek and
// statfs via golang.org/x/sys/unix. It owns no state and knows nothing of
// volumes, disks or the pool layout; it must not import other quiver packages.
//
// Imports from quiver: nothing.
package fscap
