package pool

import (
	"context"
	"fmt"

	"github.com/quiverstorage/quiver/internal/crypt"
)

// Backups of an encrypted volume hold its ciphertext as the image files
// do, never its plaintext, and carry its data key wrapped under a KEK of
// their own: the volume's backup KEK (BackupKey). The volume's KEK may be
// rotated (a shallow rekey destroys the old one) without making its backups
// unreadable; a deep rekey rewraps the new data key under the same backup
// KEK, so backups made after carry the new key and those made before the
// old one; crypto-shredding destroys the backup KEK with the others, and
// then no backup of the volume can be restored anywhere. A restore makes an
// encrypted volume that shares the backup's data key under a KEK of its own
// (VolumeSpec.KeyFrom), and writes the ciphertext as it is (OpenDiskRaw).

// BackupKey returns the volume's data key wrapped under its backup KEK,
// making that KEK on first use, and the data key's id (KeyUID); nil for a
// volume in the clear.
func (v *Volume) BackupKey(ctx context.Context) (*crypt.WrappedKey, string, error) {
	if !v.encrypted() { // nothing to lock for (a volume never becomes encrypted while it serves)
		return nil, "", nil
	}
	unlock, err := v.lockOps("backup key")
	if err != nil {
		return nil, "", err
	}
	defer unlock()
	m := v.manifest()
	if m.Key == nil {
		return nil, "", nil
	}
	if m.BackupKey != nil {
		return m.BackupKey, m.KeyUID, nil
	}
	pr, ok := v.pool.keyring[m.Key.Provider]
	if !ok {
		return nil, "", fmt.Errorf("backup key of %q: key provider %q is not configured: %w: %w", v.name, m.Key.Provider, ErrKeyUnavailable, crypt.ErrProvider)
	}
	kctx, cancel := context.WithTimeout(ctx, keyTimeout)
	defer cancel()
	kek, err := pr.CreateKEK(kctx)
	if err != nil {
		return nil, "", fmt.Errorf("backup key of %q: %w: %w", v.name, ErrKeyUnavailable, err)
	}
	w, err := crypt.Rewrap(kctx, pr, *m.Key, pr, kek)
	if err != nil {
		v.pool.dropVolumeKey(&crypt.WrappedKey{Provider: pr.Name(), KeyID: kek})
		return nil, "", fmt.Errorf("backup key of %q: %w: %w", v.name, ErrKeyUnavailable, err)
	}
	m.BackupKey = &w
	if err := v.commit(m); err != nil {
		v.pool.dropVolumeKey(&w)
		return nil, "", err
	}
	return &w, m.KeyUID, nil
}

// rewrapUnder wraps the data key w wraps under the KEK of under (same
// provider).
func (v *Volume) rewrapUnder(w, under crypt.WrappedKey) (crypt.WrappedKey, error) {
	from, ok := v.pool.keyring[w.Provider]
	to, ok2 := v.pool.keyring[under.Provider]
	if !ok || !ok2 {
		return crypt.WrappedKey{}, fmt.Errorf("key provider %q or %q is not configured: %w: %w", w.Provider, under.Provider, ErrKeyUnavailable, crypt.ErrProvider)
	}
	ctx, cancel := context.WithTimeout(context.Background(), keyTimeout)
	defer cancel()
	nw, err := crypt.Rewrap(ctx, from, w, to, under.KeyID)
	if err != nil {
		return crypt.WrappedKey{}, fmt.Errorf("%w: %w", ErrKeyUnavailable, err)
	}
	return nw, nil
}

// OpenSnapshotDiskRaw opens a disk of a snapshot for reading what its image
// holds: an encrypted volume's ciphertext (for a backup that carries it).
func (v *Volume) OpenSnapshotDiskRaw(snapshot, disk string) (Disk, error) {
	d, err := v.OpenSnapshotDisk(snapshot, disk)
	if err != nil {
		return nil, err
	}
	if sd, ok := d.(*snapshotDisk); ok {
		sd.df.enc = nil
	}
	return d, nil
}

// OpenDiskRaw opens a disk of an encrypted volume for the server's own
// writes of ciphertext as it is (a restore of a backup that holds the
// volume's ciphertext under its data key): whole 4 KiB blocks only, under
// their block locks; reads return the ciphertext too. Refused during a
// deep rekey.
func (v *Volume) OpenDiskRaw(name string) (Disk, error) {
	if !v.encrypted() {
		return nil, fmt.Errorf("raw access to disk %q of volume %q: it is not encrypted: %w", name, v.name, ErrInvalid)
	}
	if v.manifest().Rekey != nil {
		return nil, fmt.Errorf("raw access to disk %q of volume %q: %w", name, v.name, v.checkNotRekeying("raw access"))
	}
	d, err := v.openDisk(name, nil)
	if err != nil {
		return nil, err
	}
	return &rawDisk{liveDisk: d.(*liveDisk)}, nil
}

// rawDisk is a liveDisk whose reads and writes bypass the cipher.
type rawDisk struct{ *liveDisk }

func (d *rawDisk) ReadAt(p []byte, off int64) error {
	d.v.gate.RLock()
	defer d.v.gate.RUnlock()
	df, err := d.file()
	if err != nil {
		return err
	}
	return readAt(df, p, off)
}

func (d *rawDisk) WriteAt(p []byte, off int64, fua bool) error {
	if off&blockMask != 0 || len(p)&blockMask != 0 {
		return fmt.Errorf("raw write of [%d, +%d): not whole 4 KiB blocks: %w", off, len(p), ErrInvalid)
	}
	df, err := d.lockWrite(off, int64(len(p)))
	if err != nil {
		return err
	}
	defer d.v.gate.RUnlock()
	if df.enc.rk.Load() != nil {
		return fmt.Errorf("raw write to volume %q: a deep rekey is in progress: %w", d.v.name, ErrBusy)
	}
	d.v.markDirty(df.name, off, int64(len(p)))
	if err := d.v.markChanged(df, off, int64(len(p))); err != nil {
		return err
	}
	l := df.enc.lockStripes(off/crypt.BlockSize, (off+int64(len(p)))/crypt.BlockSize, true)
	err = df.write(p, off)
	l.unlock()
	if err != nil {
		return err
	}
	return d.syncIf(df, fua)
}

// Capabilities: none of the fast paths, which would decrypt or encrypt.
func (d *rawDisk) Capabilities() Capabilities { return Capabilities{} }

// AdoptKey makes a volume that holds nothing yet (no disk, no snapshot, in
// the clear) an encrypted volume whose data key is the one w wraps, kept
// under w's own KEK: a DR target of an encrypted volume, which receives
// the source's ciphertext and the source's data key under the source's
// backup KEK (a key manager both sites reach). Shredding the source, which
// destroys that KEK, leaves the target's copy unreadable too. The key is
// unwrapped first, so a KEK this node's key manager does not hold is
// refused before anything changes; a volume already under the same data
// key (keyUID) is left as it is.
func (v *Volume) AdoptKey(w crypt.WrappedKey, keyUID string) error {
	if err := validateWrapped("key", &w); err != nil {
		return err
	}
	if keyUID == "" || len(keyUID) > 64 {
		return invalid("keyUID", keyUID, "must be 1 to 64 bytes")
	}
	unlock, err := v.lockOps("adopt key")
	if err != nil {
		return err
	}
	defer unlock()
	m := v.manifest()
	switch {
	case m.Key != nil && m.KeyUID == keyUID:
		return nil
	case m.Key != nil:
		return fmt.Errorf("volume %q is encrypted under another data key (the source was deep-rekeyed, or it is another volume's copy): %w",
			v.name, ErrInvalid)
	case len(m.Disks) > 0 || len(v.Snapshots()) > 0:
		return fmt.Errorf("volume %q holds data in the clear: it cannot take an encrypted volume's ciphertext: %w", v.name, ErrInvalid)
	}
	if _, err := v.unwrap(w, "data key"); err != nil {
		return err
	}
	m.Key, m.KeyUID = &w, keyUID
	return v.commit(m)
}
