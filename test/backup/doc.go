// Package backup runs the backup path a storage admin takes: a real
// `quiver server` with --backup-config pointing at an S3 server, disks
// written by qemu-io over NBD, and the `quiver backup` commands.
//
// Imports from quiver: internal/api, internal/testfs, internal/testserver, internal/tests3.
package backup
