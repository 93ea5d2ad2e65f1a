package pool

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"

	"github.com/quiverstorage/quiver/internal/crypt"
)

// Crypto-shredding (docs/encryption.md). An encrypted volume's data key is
// stored only wrapped under KEKs: its own (in its manifest, shared by its
// snapshots), the new key's of a deep rekey in progress, and those of the
// clones that share the data key (KeyUID), each under a KEK of its own.
// Destroying every one of those KEKs in the key manager makes every copy
// of the volume's ciphertext unreadable wherever it is: the pool's files,
// blocks freed by the filesystem, a disk taken away. So a shred destroys
// the KEKs first and deletes the volumes after; a clone that shares the
// data key keeps it readable, so it must be named to be shredded too.

// shred destroys the KEKs of v and of the clones named in also (which must
// be exactly the volumes that share v's data key), then deletes them all
// with their snapshots. A KEK that cannot be destroyed stops it: the
// volumes whose KEKs were destroyed are deleted, the others are left, and
// the error says which.
func (p *Pool) shred(ctx context.Context, v *Volume, also []string) error {
	unlock, err := v.lockOps("delete")
	if err != nil {
		return err
	}
	defer unlock()
	m := v.manifest()
	if m.Key == nil {
		return fmt.Errorf("shred volume %q: it is not encrypted, so its data cannot be shredded by destroying keys; delete it without --shred: %w",
			v.name, ErrInvalid)
	}
	sharers := p.keySharers(v, m.KeyUID)
	for _, n := range also {
		if !slices.ContainsFunc(sharers, func(o *Volume) bool { return o.name == n }) {
			return fmt.Errorf("shred volume %q: %q does not share its data key: %w", v.name, n, ErrInvalid)
		}
	}
	var missing []string
	for _, o := range sharers {
		if !slices.Contains(also, o.name) {
			missing = append(missing, o.name)
		}
	}
	if len(missing) > 0 {
		return fmt.Errorf("shred volume %q: %s share its data key (clones), so its data would stay readable through them; name them to shred them too: quiver volume delete %s --shred --force %s: %w",
			v.name, strings.Join(missing, ", "), v.name, strings.Join(missing, ","), ErrKeyShared)
	}
	vols := []*Volume{v}
	for _, o := range sharers {
		ounlock, err := o.lockOps("delete")
		if err != nil {
			return err
		}
		defer ounlock()
		vols = append(vols, o)
	}
	// Under the locks no clone of these volumes is being made; one made
	// before them shows now.
	if again := p.keySharers(v, m.KeyUID); len(again) != len(sharers) {
		return fmt.Errorf("shred volume %q: the volumes sharing its data key changed meanwhile; run it again: %w", v.name, ErrBusy)
	}
	for i, o := range vols {
		if err := p.destroyKEKs(ctx, o); err != nil {
			for _, d := range vols[:i] {
				if derr := p.deleteLocked(d, DeleteOptions{Recursive: true}); derr != nil {
					err = errors.Join(err, derr)
				}
			}
			return fmt.Errorf("shred volume %q: %w", v.name, err)
		}
	}
	var errs []error
	for _, o := range vols {
		if err := p.deleteLocked(o, DeleteOptions{Recursive: true}); err != nil {
			errs = append(errs, fmt.Errorf("its keys are destroyed, but deleting volume %q failed (delete it again): %w", o.name, err))
		}
	}
	return errors.Join(errs...)
}

// keySharers returns the volumes other than v that share its data key
// (the same KeyUID), sorted by name. A volume made before KeyUID was
// recorded shares with none that the pool can tell.
func (p *Pool) keySharers(v *Volume, uid string) []*Volume {
	if uid == "" {
		return nil
	}
	p.mu.Lock()
	vols := make([]*Volume, 0, len(p.volumes))
	for _, o := range p.volumes {
		vols = append(vols, o)
	}
	p.mu.Unlock()
	var out []*Volume
	for _, o := range vols {
		if o != v && o.broken == nil && o.manifest().KeyUID == uid {
			out = append(out, o)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].name < out[j].name })
	return out
}

// destroyKEKs destroys the KEKs of a volume's wrapped keys (its own, and
// its deep rekey's new key's), and forgets the key in memory.
func (p *Pool) destroyKEKs(ctx context.Context, v *Volume) error {
	m := v.manifest()
	keys := []*crypt.WrappedKey{m.Key}
	if m.Rekey != nil {
		keys = append(keys, &m.Rekey.NewKey)
	}
	if m.BackupKey != nil { // the backups' copy of the data key goes too
		keys = append(keys, m.BackupKey)
	}
	for _, w := range keys {
		pr, ok := p.keyring[w.Provider]
		if !ok {
			return fmt.Errorf("volume %q: key provider %q of its KEK %s is not configured, so the KEK cannot be destroyed: %w: %w",
				v.name, w.Provider, w.KeyID, ErrKeyUnavailable, crypt.ErrProvider)
		}
		kctx, cancel := context.WithTimeout(ctx, keyTimeout)
		err := pr.DestroyKEK(kctx, w.KeyID)
		cancel()
		if err != nil && !errors.Is(err, crypt.ErrKEKNotFound) {
			return fmt.Errorf("volume %q: destroy KEK %s in %q: %w: %w", v.name, w.KeyID, w.Provider, ErrKeyUnavailable, err)
		}
	}
	v.keyMu.Lock()
	v.cipher, v.next = nil, nil // the open files' ciphers end with the delete
	v.keyMu.Unlock()
	return nil
}
