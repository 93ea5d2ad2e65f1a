package auth

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"time"
)

// Backend keeps the store's state where every node of a cluster reads it
// (the cluster's etcd, docs/security.md "Tenants on a cluster") instead of
// the pool's tokens.json. The state is the same JSON document as the file:
// hashes only, never a secret.
type Backend interface {
	// Load returns the stored state and its version; nil data when none
	// is stored yet.
	Load(ctx context.Context) (data []byte, version int64, err error)
	// Commit stores data if the stored version is still version (0: none
	// stored) and returns the new version, durable when it returns; ok is
	// false, and nothing stored, when the version moved (another node
	// committed first).
	Commit(ctx context.Context, data []byte, version int64) (newVersion int64, ok bool, err error)
	// Watch calls fn with each state stored from now on, in order, until
	// ctx ends (and with the current one when it starts over).
	Watch(ctx context.Context, fn func(data []byte, version int64))
}

// maxSharedRetries bounds how often a change is made again on a newer
// state after another node committed first; between tries a loser pauses
// a random moment that grows with the tries (retryPause), so that a node
// whose commits keep losing to another's burst gets its turn.
const maxSharedRetries = 16

// retryPause is the pause before try attempt+1 of a change that lost:
// up to (attempt+1) ms, at random.
func retryPause(attempt int) time.Duration {
	return time.Duration(rand.Int64N(int64(attempt+1) * int64(time.Millisecond)))
}

// Share moves the store to b, for a cluster node: when b holds no state
// yet, this node's (its tokens.json, as loaded) is stored there first;
// otherwise b's state replaces this node's, whose tokens.json is left as
// it is and no longer read (its tokens that b lacks stop working, and their
// connections end). From then on every change is committed to b with a
// compare on its version, and every state another node commits is taken
// over as it arrives (Watch): a token made on one node works on all, and a
// revocation closes its connections on every node as soon as the node
// sees it. Watching ends with ctx.
func (s *Store) Share(ctx context.Context, b Backend, log *slog.Logger) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	for attempt := 0; ; attempt++ {
		data, version, err := b.Load(ctx)
		if err != nil {
			return fmt.Errorf("shared token store: %w", err)
		}
		if data == nil {
			local, err := json.Marshal(s.f)
			if err != nil {
				return err
			}
			v, ok, err := b.Commit(ctx, local, 0)
			if err != nil {
				return fmt.Errorf("shared token store: %w", err)
			}
			if !ok {
				if attempt < maxSharedRetries {
					continue // another node stored its state first
				}
				return fmt.Errorf("shared token store: changed meanwhile %d times", attempt+1)
			}
			s.backend, s.version = b, v
			log.Info("token store shared: this node's tokens are the cluster's", "tokens", len(s.f.Tokens))
			break
		}
		f, err := decodeState(data)
		if err != nil {
			return fmt.Errorf("shared token store: %w", err)
		}
		s.set(f)
		s.backend, s.version = b, version
		log.Info("token store shared: the cluster's tokens replace this node's tokens.json", "tokens", len(f.Tokens))
		break
	}
	go b.Watch(ctx, func(data []byte, version int64) {
		f, err := decodeState(data)
		s.mu.Lock()
		defer s.mu.Unlock()
		if version <= s.version {
			return
		}
		if err != nil {
			log.Error("shared token store: a state that breaks a rule is ignored", "err", err)
			return
		}
		s.set(f)
		s.version = version
	})
	return nil
}

func decodeState(data []byte) (storeFile, error) {
	var f storeFile
	if len(data) > maxStore {
		return f, fmt.Errorf("%d bytes, over %d: %w", len(data), maxStore, ErrInvalid)
	}
	if err := decodeStrict(data, &f); err != nil {
		return f, err
	}
	return f, f.validate()
}

// commitShared stores f in the backend; s.mu is held. stale is true when
// another node committed first: s then holds the newer state, and the
// caller makes its change again on it.
func (s *Store) commitShared(f storeFile) (stale bool, err error) {
	data, err := json.Marshal(f)
	if err != nil {
		return false, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), sharedTimeout)
	defer cancel()
	v, ok, err := s.backend.Commit(ctx, data, s.version)
	if err != nil {
		return false, fmt.Errorf("shared token store: %w", err)
	}
	if !ok {
		cur, version, err := s.backend.Load(ctx)
		if err != nil {
			return false, fmt.Errorf("shared token store: %w", err)
		}
		nf, err := decodeState(cur)
		if err != nil {
			return false, fmt.Errorf("shared token store: %w", err)
		}
		s.set(nf)
		s.version = version
		return true, nil
	}
	s.set(f)
	s.version = v
	return false, nil
}

// update makes a change of the state with fn, on a clone, and commits it;
// s.mu is held. On a shared store whose state another node changed
// meanwhile, fn runs again on the newer state.
func (s *Store) update(fn func(f *storeFile) error) error {
	for attempt := 0; ; attempt++ {
		f := s.clone()
		if err := fn(&f); err != nil {
			return err
		}
		if s.backend == nil {
			return s.commit(f)
		}
		if err := f.validate(); err != nil {
			return err
		}
		stale, err := s.commitShared(f)
		if err != nil || !stale {
			return err
		}
		if attempt >= maxSharedRetries {
			return fmt.Errorf("shared token store: changed by other nodes %d times meanwhile; try again", attempt+1)
		}
		time.Sleep(retryPause(attempt))
	}
}
