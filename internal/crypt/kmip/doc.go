// Package kmip is the key provider backed by a KMIP server (OASIS KMIP 1.4
// over TLS with a client certificate). Each key-encryption key is an
// AES-256 symmetric key created, activated, revoked and destroyed in the
// server; wrapping and unwrapping are the server's Encrypt and Decrypt
// operations in AES-256-GCM, so a KEK never leaves the key manager and the
// server, not quiver, refuses a revoked or destroyed key.
//
// The TTLV encoding and the KMIP 1.4 tags and enumerations come from
// github.com/gemalto/kmip-go; this package owns the few operations quiver
// uses and the mapping of KMIP result reasons to crypt's errors.
//
// Imports from quiver: crypt.
package kmip
