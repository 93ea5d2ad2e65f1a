// Package beneath opens, lists and removes files beneath one directory (a
// root) without ever leaving it: no path may climb out with "..", be
// absolute, or pass through a symbolic link, wherever in the path the link
// is. The pool uses it for every file it finds in the pool, because whoever
// can write the pool's directory (an NFS client, a restored backup, a tenant
// with a filesystem PVC) must not make quiver, running as root, act on files
// outside it.
//
// Opens use openat2(2) with RESOLVE_BENEATH|RESOLVE_NO_SYMLINKS where the
// kernel has it (Linux 5.6), and otherwise walk the path one component at a
// time with O_NOFOLLOW relative to the parent's descriptor. Removals use
// unlinkat(2) relative to a descriptor opened beneath the root, so a symbolic
// link is removed, never followed.
//
// It is the seed of the storage layer that will own every raw filesystem
// call; it imports only the standard library and golang.org/x/sys/unix.
//
// Imports from quiver: nothing.
package beneath
