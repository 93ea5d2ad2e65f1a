// Package pool is quiver's storage core: a pool directory holding one
// directory per volume (one volume per VM), each with its manifest, its disk
// images and its snapshots. It owns naming rules, the on-disk layout, crash
// recovery, whole-VM snapshots, clones and rollback, and the per-volume I/O
// gate through which every disk handle reads and writes.
//
// Layout of a pool (see docs/design/0001-pool-layout.md):
//
//	<pool>/pool.json                         identity, written once
//	<pool>/pool.lock                         flock of the one process with the pool open
//	<pool>/caps.json                         the capabilities the filesystem has shown (caps.go)
//	<pool>/staging/                          work in progress; wiped at start
//	<pool>/volumes/<vol>/volume.json         the volume manifest
//	<pool>/volumes/<vol>/disks/<disk>.img    sparse raw disk images
//	<pool>/volumes/<vol>/snapshots/<snap>/   snapshot.json + <disk>.img
//	<pool>/volumes/<vol>/rollback.json       redo record of a rollback
//
// Every object becomes visible by one rename out of staging/ (the commit
// point), so a crash leaves it either absent or complete. A failed sync of
// a disk is final for the disk (docs/durability.md).
//
// Every filesystem call goes through the storage layer (internal/storage,
// Options.FS), nothing else: a twin of it (internal/faultio,
// internal/storage/crashfs) sees and can fail every write and sync.
//
// Nothing read from the pool is trusted: every file is reached beneath the
// pool root (no symbolic link followed, no hard-linked image), every
// manifest name passes the API's rules, and a volume that fails a check is
// quarantined (listed as broken, not served, not touched). open.go holds the
// pool's lock, refuses what is not a pool, and detects read-only pools.
//
// pool imports crypt (the cipher and data keys of encrypted volumes,
// encrypt.go), storage (every filesystem call, confined to the pool
// directory), durable (atomic metadata writes) and qos (the per-volume limiters it keeps across disk handles). It must not
// import any transport package (api, nbd, csi) nor the
// job runner: long operations report through the Progress interface.
//
// Imports from quiver: crypt, durable, qos, quantity, storage.
package pool
