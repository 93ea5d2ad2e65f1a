package crypt

import (
	"context"
	"crypto/aes"
	"crypto/cipher"
	"crypto/rand"
	"errors"
	"fmt"
)

// AlgorithmGCM is the wrapping of a data key by AES-256-GCM under a KEK: the
// wrapped bytes are a 12-byte nonce, the encrypted key and the 16-byte tag.
// The additional data binds the wrapped bytes to their provider, KEK id and
// algorithm (AAD), so a manifest edited to name another KEK fails to unwrap.
const AlgorithmGCM = "AES-256-GCM"

// WrappedKey is a data key wrapped under a key-encryption key: what a
// volume manifest holds, the only form of a data key that is ever stored.
// Each holder (a VM, each of its clones) has its own WrappedKey, possibly
// under its own KEK, of a data key they may share.
type WrappedKey struct {
	// Provider names the key provider that holds the KEK ("keyfile",
	// "kmip"), as configured on the node.
	Provider string `json:"provider"`
	// KeyID is the KEK's id in that provider.
	KeyID string `json:"keyId"`
	// Algorithm is how the data key is wrapped (AlgorithmGCM).
	Algorithm string `json:"algorithm"`
	// Wrapped are the wrapped bytes (base64 in JSON).
	Wrapped []byte `json:"wrapped"`
}

// AAD is the additional authenticated data of a wrapping: its metadata.
func (w WrappedKey) AAD() []byte {
	return []byte("quiver data key\x00" + w.Provider + "\x00" + w.KeyID + "\x00" + w.Algorithm)
}

// Provider is a key manager: it holds key-encryption keys (KEKs) and wraps
// and unwraps data keys under them. A KEK never leaves a provider through
// this interface. Implementations are safe for concurrent use.
type Provider interface {
	// Name is the provider's name as WrappedKey.Provider records it.
	Name() string
	// CreateKEK makes a new KEK, usable at once, and returns its id.
	CreateKEK(ctx context.Context) (string, error)
	// Wrap wraps a data key under the KEK keyID.
	Wrap(ctx context.Context, keyID string, key *DataKey) (WrappedKey, error)
	// Unwrap unwraps a data key. It fails with ErrKEKRevoked for a revoked
	// KEK, ErrKEKNotFound for one destroyed, ErrUnwrap for bytes that do not
	// authenticate, ErrUnreachable when the key manager cannot be reached.
	Unwrap(ctx context.Context, w WrappedKey) (*DataKey, error)
	// RevokeKEK makes a KEK unusable for wrap and unwrap; DestroyKEK
	// revokes it if needed and then destroys it. Every data key wrapped
	// only under it is then lost for good (crypto-shredding).
	RevokeKEK(ctx context.Context, keyID string) error
	DestroyKEK(ctx context.Context, keyID string) error
}

// NewVMKey draws a new data key for a VM, creates a KEK of its own in p and
// wraps the data key under it.
func NewVMKey(ctx context.Context, p Provider) (*DataKey, WrappedKey, error) {
	dk, err := NewDataKey()
	if err != nil {
		return nil, WrappedKey{}, err
	}
	kek, err := p.CreateKEK(ctx)
	if err != nil {
		return nil, WrappedKey{}, fmt.Errorf("new VM key: %w", err)
	}
	w, err := p.Wrap(ctx, kek, dk)
	if err != nil {
		return nil, WrappedKey{}, fmt.Errorf("new VM key: %w", errors.Join(err, dropKEK(ctx, p, kek)))
	}
	return dk, w, nil
}

// Rewrap unwraps w with from and wraps the same data key under the KEK
// toKeyID of to: a shallow rekey (a new KEK, the data key and every block
// unchanged), or a move to another provider.
func Rewrap(ctx context.Context, from Provider, w WrappedKey, to Provider, toKeyID string) (WrappedKey, error) {
	dk, err := from.Unwrap(ctx, w)
	if err != nil {
		return WrappedKey{}, fmt.Errorf("rewrap: %w", err)
	}
	defer dk.Wipe()
	nw, err := to.Wrap(ctx, toKeyID, dk)
	if err != nil {
		return WrappedKey{}, fmt.Errorf("rewrap: %w", err)
	}
	return nw, nil
}

// CloneKey gives a clone its own wrapped copy of its source's data key,
// under a new KEK of the clone's own: the clone reads the source's shared
// blocks, and shredding one of them (destroying its KEK) leaves the other
// readable.
func CloneKey(ctx context.Context, p Provider, source WrappedKey) (WrappedKey, error) {
	kek, err := p.CreateKEK(ctx)
	if err != nil {
		return WrappedKey{}, fmt.Errorf("clone key: %w", err)
	}
	w, err := Rewrap(ctx, p, source, p, kek)
	if err != nil {
		return WrappedKey{}, fmt.Errorf("clone key: %w", errors.Join(err, dropKEK(ctx, p, kek)))
	}
	return w, nil
}

// dropKEK destroys a KEK that was just created for a key that could not be
// wrapped under it, so a failure leaves no unused KEK behind; its error, if
// any, joins the one that caused it.
func dropKEK(ctx context.Context, p Provider, kek string) error {
	if err := p.DestroyKEK(ctx, kek); err != nil {
		return fmt.Errorf("and the unused KEK %s stays: %w", kek, err)
	}
	return nil
}

// SealGCM wraps a data key under a 32-byte KEK with AES-256-GCM, for the
// providers that wrap locally. It fills w.Wrapped; w's other fields must be
// set (they are the additional data).
func SealGCM(kek []byte, w *WrappedKey, key *DataKey) error {
	aead, err := newGCM(kek)
	if err != nil {
		return err
	}
	nonce := make([]byte, aead.NonceSize(), aead.NonceSize()+DataKeySize+aead.Overhead())
	if _, err := rand.Read(nonce); err != nil {
		return fmt.Errorf("wrap: %w", err)
	}
	w.Wrapped = aead.Seal(nonce, nonce, key.Bytes(), w.AAD())
	return nil
}

// OpenGCM unwraps what SealGCM wrapped.
func OpenGCM(kek []byte, w WrappedKey) (*DataKey, error) {
	if w.Algorithm != AlgorithmGCM {
		return nil, fmt.Errorf("algorithm %q, want %q: %w", w.Algorithm, AlgorithmGCM, ErrUnwrap)
	}
	aead, err := newGCM(kek)
	if err != nil {
		return nil, err
	}
	if len(w.Wrapped) < aead.NonceSize()+aead.Overhead() {
		return nil, fmt.Errorf("wrapped key of %d bytes: %w", len(w.Wrapped), ErrUnwrap)
	}
	ns := aead.NonceSize()
	plain, err := aead.Open(nil, w.Wrapped[:ns], w.Wrapped[ns:], w.AAD())
	if err != nil {
		return nil, fmt.Errorf("KEK %s of %s: %w", w.KeyID, w.Provider, ErrUnwrap)
	}
	defer clear(plain)
	return DataKeyFrom(plain)
}

func newGCM(kek []byte) (cipher.AEAD, error) {
	if len(kek) != 32 {
		return nil, fmt.Errorf("KEK of %d bytes, want 32", len(kek))
	}
	b, err := aes.NewCipher(kek)
	if err != nil {
		return nil, err
	}
	return cipher.NewGCM(b)
}

// Keyring is the providers a node has configured, by name: it unwraps a
// wrapped key with the provider the key names.
type Keyring map[string]Provider

// NewKeyring makes a keyring of providers, refusing two of one name.
func NewKeyring(ps ...Provider) (Keyring, error) {
	k := Keyring{}
	for _, p := range ps {
		if _, dup := k[p.Name()]; dup {
			return nil, fmt.Errorf("two key providers named %q", p.Name())
		}
		k[p.Name()] = p
	}
	return k, nil
}

// Unwrap unwraps w with the provider it names; ErrProvider if there is none.
func (k Keyring) Unwrap(ctx context.Context, w WrappedKey) (*DataKey, error) {
	p, ok := k[w.Provider]
	if !ok {
		return nil, fmt.Errorf("unwrap under KEK %s: provider %q: %w", w.KeyID, w.Provider, ErrProvider)
	}
	return p.Unwrap(ctx, w)
}
