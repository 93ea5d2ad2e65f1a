package crypt

import (
	"crypto/rand"
	"crypto/subtle"
	"fmt"
)

// DataKeySize is the size of a data key: two AES-256 keys, XTS's.
const DataKeySize = 64

// DataKey is a VM's data key in the clear. It lives in memory only: on disk
// and in manifests it is always a WrappedKey.
type DataKey struct {
	b [DataKeySize]byte
}

// NewDataKey draws a data key from the system's random source.
func NewDataKey() (*DataKey, error) {
	k := &DataKey{}
	if _, err := rand.Read(k.b[:]); err != nil {
		return nil, fmt.Errorf("data key: %w", err)
	}
	return k, nil
}

// DataKeyFrom makes a data key of 64 bytes (as a provider unwraps them).
func DataKeyFrom(b []byte) (*DataKey, error) {
	if len(b) != DataKeySize {
		return nil, fmt.Errorf("data key of %d bytes, want %d: %w", len(b), DataKeySize, ErrUnwrap)
	}
	k := &DataKey{}
	copy(k.b[:], b)
	return k, nil
}

// Bytes returns the key's bytes (for a provider to wrap); the caller must
// not keep them.
func (k *DataKey) Bytes() []byte { return k.b[:] }

// Wipe overwrites the key in memory with zeros.
func (k *DataKey) Wipe() { clear(k.b[:]) }

// Equal says whether two data keys are the same key (for tests and checks
// of a rewrap).
func (k *DataKey) Equal(o *DataKey) bool { return subtle.ConstantTimeCompare(k.b[:], o.b[:]) == 1 }
