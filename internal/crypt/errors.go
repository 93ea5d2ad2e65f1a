package crypt

import "errors"

var (
	// ErrUnaligned: a buffer or an offset handed to the block cipher is not
	// a multiple of BlockSize.
	ErrUnaligned = errors.New("not aligned to the 4096-byte encryption block")
	// ErrKEKNotFound: the provider has no key-encryption key of that id
	// (never created, or destroyed).
	ErrKEKNotFound = errors.New("key-encryption key not found")
	// ErrKEKRevoked: the key-encryption key exists but may no longer be used
	// (revoked, deactivated, compromised or destroyed).
	ErrKEKRevoked = errors.New("key-encryption key revoked")
	// ErrUnreachable: the key manager cannot be reached.
	ErrUnreachable = errors.New("key manager unreachable")
	// ErrUnwrap: a wrapped data key fails authentication: wrong KEK, or the
	// wrapped bytes or their metadata were altered.
	ErrUnwrap = errors.New("wrapped data key does not authenticate")
	// ErrProvider: a wrapped key names a provider that is not configured.
	ErrProvider = errors.New("key provider not configured")
)
