// Package crypt is quiver's encryption at rest: the block cipher of an
// encrypted VM's disks (XTS-AES-256 per 4 KiB block, the block number as the
// tweak), the VM's data key, its wrapped form that a volume manifest holds,
// and the interface of the key providers (a key manager) that wrap and
// unwrap data keys under key-encryption keys (KEKs). The providers
// themselves live in subpackages (keyfile, kmip). docs/encryption.md draws
// the key hierarchy.
//
// It must not import the pool: the pool calls it.
//
// Imports from quiver: nothing.
package crypt
