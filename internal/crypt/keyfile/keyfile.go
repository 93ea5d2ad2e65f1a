// Package keyfile is the key provider of a single node: its key-encryption
// keys (KEKs) live in one JSON file outside the pool, readable by its owner
// only (0600, a file any other user may read is refused), replaced
// atomically (temporary file, fsync, rename, fsync of the directory) on
// every change. It protects a pool (or its backups) taken away from the
// node; it does not protect against a thief of the node itself: that is the
// KMIP provider's job.
//
// Imports from quiver: crypt, durable.
package keyfile

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"sync"
	"time"

	"github.com/quiverstorage/quiver/internal/crypt"
	"github.com/quiverstorage/quiver/internal/durable"
)

// Name is the provider's name in wrapped keys.
const Name = "keyfile"

const (
	stateActive  = "active"
	stateRevoked = "revoked"
)

// file is the key file's content.
type file struct {
	Version int             `json:"version"`
	KEKs    map[string]*kek `json:"keks"`
}

type kek struct {
	Key     []byte    `json:"key"` // 32 bytes, AES-256
	State   string    `json:"state"`
	Created time.Time `json:"created"`
}

// Provider is a key file. It is safe for concurrent use within one process;
// two processes must not share a key file.
type Provider struct {
	path string
	mu   sync.Mutex
	f    file
}

var _ crypt.Provider = (*Provider)(nil)

// Open opens the key file at path, or starts an empty one there if none
// exists (written at the first CreateKEK). A key file that others than its
// owner may read or write is refused, as is anything but a regular file.
func Open(path string) (*Provider, error) {
	p := &Provider{path: path, f: file{Version: 1, KEKs: map[string]*kek{}}}
	fi, err := os.Lstat(path)
	if errors.Is(err, fs.ErrNotExist) {
		return p, nil
	}
	if err != nil {
		return nil, fmt.Errorf("key file: %w", err)
	}
	if !fi.Mode().IsRegular() {
		return nil, fmt.Errorf("key file %s: not a regular file (%s)", path, fi.Mode().Type())
	}
	if perm := fi.Mode().Perm(); perm&0o077 != 0 {
		return nil, fmt.Errorf("key file %s: mode %04o lets others than its owner read or write it; want 0600", path, perm)
	}
	if err := durable.ReadJSON(path, &p.f); err != nil {
		return nil, fmt.Errorf("key file: %w", err)
	}
	if p.f.Version != 1 {
		return nil, fmt.Errorf("key file %s: version %d, want 1", path, p.f.Version)
	}
	if p.f.KEKs == nil {
		p.f.KEKs = map[string]*kek{}
	}
	for id, k := range p.f.KEKs {
		if len(k.Key) != 32 || (k.State != stateActive && k.State != stateRevoked) {
			return nil, fmt.Errorf("key file %s: KEK %s damaged (%d bytes, state %q)", path, id, len(k.Key), k.State)
		}
	}
	return p, nil
}

// Name returns Name.
func (p *Provider) Name() string { return Name }

// CreateKEK draws a new KEK and writes the key file durably before it
// returns the KEK's id.
func (p *Provider) CreateKEK(context.Context) (string, error) {
	var idb [16]byte
	k := &kek{Key: make([]byte, 32), State: stateActive, Created: time.Now().UTC()}
	if _, err := rand.Read(idb[:]); err != nil {
		return "", err
	}
	if _, err := rand.Read(k.Key); err != nil {
		return "", err
	}
	id := hex.EncodeToString(idb[:])
	p.mu.Lock()
	defer p.mu.Unlock()
	p.f.KEKs[id] = k
	if err := p.save(); err != nil {
		delete(p.f.KEKs, id)
		return "", fmt.Errorf("create KEK: %w", err)
	}
	return id, nil
}

// Wrap wraps key under the KEK keyID with AES-256-GCM.
func (p *Provider) Wrap(_ context.Context, keyID string, key *crypt.DataKey) (crypt.WrappedKey, error) {
	k, err := p.usable(keyID)
	if err != nil {
		return crypt.WrappedKey{}, fmt.Errorf("wrap: %w", err)
	}
	w := crypt.WrappedKey{Provider: Name, KeyID: keyID, Algorithm: crypt.AlgorithmGCM}
	if err := crypt.SealGCM(k, &w, key); err != nil {
		return crypt.WrappedKey{}, fmt.Errorf("wrap: %w", err)
	}
	return w, nil
}

// Unwrap unwraps a data key that Wrap wrapped.
func (p *Provider) Unwrap(_ context.Context, w crypt.WrappedKey) (*crypt.DataKey, error) {
	if w.Provider != Name {
		return nil, fmt.Errorf("unwrap: provider %q, not %q: %w", w.Provider, Name, crypt.ErrProvider)
	}
	k, err := p.usable(w.KeyID)
	if err != nil {
		return nil, fmt.Errorf("unwrap: %w", err)
	}
	return crypt.OpenGCM(k, w)
}

// RevokeKEK marks the KEK revoked, durably.
func (p *Provider) RevokeKEK(_ context.Context, keyID string) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	k, ok := p.f.KEKs[keyID]
	if !ok {
		return fmt.Errorf("revoke KEK %s in %s: %w", keyID, p.path, crypt.ErrKEKNotFound)
	}
	old := k.State
	k.State = stateRevoked
	if err := p.save(); err != nil {
		k.State = old
		return fmt.Errorf("revoke KEK %s: %w", keyID, err)
	}
	return nil
}

// DestroyKEK removes the KEK from the key file, durably. The old content may
// remain in freed blocks of the file system holding the key file; a key file
// on a file system that can be shredded (or a KMS) is for that.
func (p *Provider) DestroyKEK(_ context.Context, keyID string) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	k, ok := p.f.KEKs[keyID]
	if !ok {
		return fmt.Errorf("destroy KEK %s in %s: %w", keyID, p.path, crypt.ErrKEKNotFound)
	}
	delete(p.f.KEKs, keyID)
	if err := p.save(); err != nil {
		p.f.KEKs[keyID] = k
		return fmt.Errorf("destroy KEK %s: %w", keyID, err)
	}
	clear(k.Key)
	return nil
}

// usable returns a copy of the KEK keyID if it is active.
func (p *Provider) usable(keyID string) ([]byte, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	k, ok := p.f.KEKs[keyID]
	switch {
	case !ok:
		return nil, fmt.Errorf("KEK %s in %s: %w", keyID, p.path, crypt.ErrKEKNotFound)
	case k.State != stateActive:
		return nil, fmt.Errorf("KEK %s in %s: %w", keyID, p.path, crypt.ErrKEKRevoked)
	}
	return append([]byte(nil), k.Key...), nil
}

// save writes the key file; the caller holds p.mu.
func (p *Provider) save() error { return durable.WriteJSONPath(p.path, &p.f) }
