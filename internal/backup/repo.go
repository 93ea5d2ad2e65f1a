// Package backup keeps whole-VM backups in a repository on an object store
// (internal/objstore): every backup of a volume is one crash-consistent point
// across its disks (a snapshot), stored as 64 KiB blocks that are
// content-addressed, deduplicated across every VM of the repository,
// compressed (zstd) and encrypted one by one before they leave the node,
// appended into packs of about 16 MiB, and a manifest that lists them. A
// backup after the first reads only the blocks that the pool's change
// tracking reports changed since its parent.
//
// Repository layout, format 2 (every object but config and keys is
// encrypted):
//
//	config                 version, id, block and pack size (JSON)
//	keys/<id>              the repository's master keys wrapped by one user key
//	packs/<p[:2]>/<p>      a pack: sealed blocks one after the other; a
//	                       sealed block is AES-256-GCM of (a flag, then the
//	                       block, zstd or raw) bound to the block's id, the
//	                       HMAC-SHA256 of its plaintext under the id key
//	index/<p>              pack p's index: block id -> offset, length
//	backups/<id>           a manifest: the volume, the snapshot, each disk's
//	                       block ids (binary, zstd, AES-256-GCM)
//	locks/<id>             a backup or a collection in progress
//
// Keys: a user key (a key file of at least 32 random bytes, never stored)
// unwraps the master keys (AES-256-GCM under HKDF-SHA256 of the user key). A
// repository may have several user keys: rotation adds the new one and
// removes the old, without touching any pack. The store never sees a
// plaintext byte of a disk or a manifest, nor a key.
//
// What is durable: a pack is usable once its index is stored, and the
// index is stored after the pack; a backup exists once its manifest is
// stored, and it is stored last, after every pack and index holding its
// new blocks. A backup that fails midway leaves no manifest (its packs are
// garbage, removed by Collect).
//
// Imports from quiver: objstore, pool.
package backup

import (
	"context"
	"crypto/aes"
	"crypto/cipher"
	"crypto/hkdf"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/klauspost/compress/zstd"

	"github.com/quiverstorage/quiver/internal/objstore"
)

// Sentinels, mapped once by each transport.
var (
	ErrWrongKey     = errors.New("no key of the repository opens with this key file")
	ErrNoRepository = errors.New("no backup repository there")
	ErrExists       = errors.New("a backup repository is already there")
	ErrNotFound     = errors.New("backup not found")
	ErrCorrupt      = errors.New("backup data damaged in the store")
	ErrLocked       = errors.New("the repository is locked by another operation")
	ErrInvalid      = errors.New("invalid argument")
)

// BlockSize is the unit of change, deduplication and of the manifest: the
// pool's change tracking reports changes in 64 KiB granules, so a change of
// a few bytes reads and re-sends one block, and clones of one image share
// every block they have not changed.
const BlockSize = 64 << 10

// PackSize is the size a pack is closed at: blocks travel to the store in
// packs, not one object each.
const PackSize = 16 << 20

const (
	repoVersion = 2
	// MinKeyLen is the shortest user key accepted.
	MinKeyLen = 32
	// maxMeta bounds a manifest (its block ids: 32 bytes per non-zero
	// block, so about 2 TiB of non-zero data in one backup) and an index.
	maxMeta = 1 << 30
)

type repoConfig struct {
	Version   int       `json:"version"`
	ID        string    `json:"id"`
	BlockSize int64     `json:"blockSize"`
	PackSize  int64     `json:"packSize"`
	CreatedAt time.Time `json:"createdAt"`
}

// RepoOptions tune how a repository is used on this node.
type RepoOptions struct {
	// CacheDir, when set, keeps a copy of the repository's pack indexes
	// under CacheDir/<repository id>, so that a backup, restore or
	// collection loads only the indexes it has not seen. The cache is
	// only an optimisation: the names it holds are checked against a
	// listing of index/ every time, and each entry is authenticated (it
	// is the encrypted object) before it is used.
	CacheDir string
}

type keyRecord struct {
	Version   int       `json:"version"`
	CreatedAt time.Time `json:"createdAt"`
	Salt      []byte    `json:"salt"`
	Wrapped   []byte    `json:"wrapped"`
}

// Repository is an open backup repository.
type Repository struct {
	store  objstore.Store
	cfg    repoConfig
	keyID  string // the user key it was opened with
	idKey  []byte
	aead   cipher.AEAD
	enc    *zstd.Encoder
	dec    *zstd.Decoder
	master []byte
	opts   RepoOptions
	idx    *index
}

// Init makes a new repository in store with one user key.
func Init(ctx context.Context, store objstore.Store, userKey []byte) (*Repository, error) {
	return InitWith(ctx, store, userKey, RepoOptions{})
}

// InitWith is Init with options.
func InitWith(ctx context.Context, store objstore.Store, userKey []byte, opts RepoOptions) (*Repository, error) {
	if len(userKey) < MinKeyLen {
		return nil, fmt.Errorf("key: %d bytes, at least %d random bytes are needed (quiver backup key generate): %w",
			len(userKey), MinKeyLen, ErrInvalid)
	}
	if _, err := store.Get(ctx, "config", 1<<16); err == nil {
		return nil, fmt.Errorf("%s: %w", store, ErrExists)
	} else if !errors.Is(err, objstore.ErrNotFound) {
		return nil, err
	}
	cfg := repoConfig{Version: repoVersion, ID: randomID(8), BlockSize: BlockSize, PackSize: PackSize, CreatedAt: time.Now().UTC()}
	master := make([]byte, 64)
	if _, err := rand.Read(master); err != nil {
		return nil, err
	}
	r, err := newRepository(store, cfg, master, opts)
	if err != nil {
		return nil, err
	}
	if r.keyID, err = r.putKey(ctx, userKey); err != nil {
		return nil, err
	}
	data, _ := json.MarshalIndent(cfg, "", "  ")
	if err := store.Put(ctx, "config", data); err != nil {
		return nil, err
	}
	return r, nil
}

// Open opens the repository in store with a user key.
func Open(ctx context.Context, store objstore.Store, userKey []byte) (*Repository, error) {
	return OpenWith(ctx, store, userKey, RepoOptions{})
}

// OpenWith is Open with options.
func OpenWith(ctx context.Context, store objstore.Store, userKey []byte, opts RepoOptions) (*Repository, error) {
	data, err := store.Get(ctx, "config", 1<<16)
	if errors.Is(err, objstore.ErrNotFound) {
		return nil, fmt.Errorf("%s: %w (quiver backup init makes one)", store, ErrNoRepository)
	}
	if err != nil {
		return nil, err
	}
	var cfg repoConfig
	if err := json.Unmarshal(data, &cfg); err != nil {
		return nil, fmt.Errorf("%s: config is not a quiver repository: %w", store, ErrCorrupt)
	}
	if cfg.Version < repoVersion {
		return nil, fmt.Errorf("%s: a repository of format %d, made by an older quiver; this one reads format %d only "+
			"(1 MiB chunks, one object each, gave way to 64 KiB blocks in packs): make a new repository under another "+
			"prefix or bucket: %w", store, cfg.Version, repoVersion, ErrNoRepository)
	}
	if cfg.Version != repoVersion || cfg.BlockSize != BlockSize || cfg.PackSize < BlockSize || cfg.PackSize > 1<<30 {
		return nil, fmt.Errorf("%s: config is not a quiver repository of format %d: %w", store, repoVersion, ErrCorrupt)
	}
	var ids []string
	if err := store.List(ctx, "keys/", func(k string, _ int64) error { ids = append(ids, k); return nil }); err != nil {
		return nil, err
	}
	for _, k := range ids {
		data, err := store.Get(ctx, k, 1<<16)
		if err != nil {
			return nil, err
		}
		var rec keyRecord
		if json.Unmarshal(data, &rec) != nil {
			continue
		}
		master, err := unwrap(userKey, rec)
		if err != nil {
			continue
		}
		r, err := newRepository(store, cfg, master, opts)
		if err != nil {
			return nil, err
		}
		r.keyID = strings.TrimPrefix(k, "keys/")
		return r, nil
	}
	return nil, fmt.Errorf("%s: %w", store, ErrWrongKey)
}

func newRepository(store objstore.Store, cfg repoConfig, master []byte, opts RepoOptions) (*Repository, error) {
	block, err := aes.NewCipher(master[:32])
	if err != nil {
		return nil, err
	}
	aead, err := cipher.NewGCM(block)
	if err != nil {
		return nil, err
	}
	// EncodeAll runs concurrently, one encoder per call up to GOMAXPROCS.
	enc, err := zstd.NewWriter(nil, zstd.WithEncoderLevel(zstd.SpeedFastest))
	if err != nil {
		return nil, err
	}
	dec, err := zstd.NewReader(nil, zstd.WithDecoderConcurrency(0), zstd.WithDecoderMaxMemory(256<<20))
	if err != nil {
		return nil, err
	}
	return &Repository{store: store, cfg: cfg, idKey: master[32:], aead: aead, enc: enc, dec: dec, master: master, opts: opts,
		idx: newIndex()}, nil
}

// kek derives the key that wraps the master keys from a user key.
func kek(userKey, salt []byte) ([]byte, error) {
	return hkdf.Key(sha256.New, userKey, salt, "quiver backup repository key v1", 32)
}

func (r *Repository) putKey(ctx context.Context, userKey []byte) (string, error) {
	salt := make([]byte, 32)
	if _, err := rand.Read(salt); err != nil {
		return "", err
	}
	k, err := kek(userKey, salt)
	if err != nil {
		return "", err
	}
	aead, err := gcm(k)
	if err != nil {
		return "", err
	}
	nonce := make([]byte, aead.NonceSize())
	if _, err := rand.Read(nonce); err != nil {
		return "", err
	}
	rec := keyRecord{Version: 1, CreatedAt: time.Now().UTC(), Salt: salt,
		Wrapped: aead.Seal(nonce, nonce, r.master, []byte("quiver-master"))}
	data, _ := json.MarshalIndent(rec, "", "  ")
	id := randomID(6)
	if err := r.store.Put(ctx, "keys/"+id, data); err != nil {
		return "", err
	}
	return id, nil
}

func unwrap(userKey []byte, rec keyRecord) ([]byte, error) {
	k, err := kek(userKey, rec.Salt)
	if err != nil {
		return nil, err
	}
	aead, err := gcm(k)
	if err != nil {
		return nil, err
	}
	if len(rec.Wrapped) < aead.NonceSize() {
		return nil, ErrWrongKey
	}
	master, err := aead.Open(nil, rec.Wrapped[:aead.NonceSize()], rec.Wrapped[aead.NonceSize():], []byte("quiver-master"))
	if err != nil || len(master) != 64 {
		return nil, ErrWrongKey
	}
	return master, nil
}

func gcm(key []byte) (cipher.AEAD, error) {
	block, err := aes.NewCipher(key)
	if err != nil {
		return nil, err
	}
	return cipher.NewGCM(block)
}

// AddKey lets another user key open the repository (the first step of a
// rotation) and returns its id.
func (r *Repository) AddKey(ctx context.Context, userKey []byte) (string, error) {
	if len(userKey) < MinKeyLen {
		return "", fmt.Errorf("key: %d bytes, at least %d random bytes are needed: %w", len(userKey), MinKeyLen, ErrInvalid)
	}
	return r.putKey(ctx, userKey)
}

// Keys lists the ids of the user keys that open the repository.
func (r *Repository) Keys(ctx context.Context) ([]string, error) {
	var ids []string
	err := r.store.List(ctx, "keys/", func(k string, _ int64) error {
		ids = append(ids, strings.TrimPrefix(k, "keys/"))
		return nil
	})
	return ids, err
}

// KeyID is the id of the user key the repository was opened with.
func (r *Repository) KeyID() string { return r.keyID }

// RemoveKey removes a user key (the last step of a rotation). The last key
// is never removed: the repository would be lost.
func (r *Repository) RemoveKey(ctx context.Context, id string) error {
	ids, err := r.Keys(ctx)
	if err != nil {
		return err
	}
	found := false
	for _, k := range ids {
		found = found || k == id
	}
	if !found {
		return fmt.Errorf("key %q: %w", id, ErrNotFound)
	}
	if len(ids) == 1 {
		return fmt.Errorf("key %q is the repository's only key: add another first: %w", id, ErrInvalid)
	}
	return r.store.Delete(ctx, "keys/"+id)
}

// String names the repository's store.
func (r *Repository) String() string { return r.store.String() }

// ID is the repository's id (in its config).
func (r *Repository) ID() string { return r.cfg.ID }

// blockID is the content address of a block's plaintext.
func (r *Repository) blockID(p []byte) BlockID {
	m := hmac.New(sha256.New, r.idKey)
	m.Write(p)
	var id BlockID
	m.Sum(id[:0])
	return id
}

// seal compresses and encrypts p, bound to what (the object's name).
func (r *Repository) seal(p []byte, what string) ([]byte, error) {
	z := r.enc.EncodeAll(p, make([]byte, 0, len(p)/2))
	nonce := make([]byte, r.aead.NonceSize(), r.aead.NonceSize()+len(z)+r.aead.Overhead())
	if _, err := rand.Read(nonce); err != nil {
		return nil, err
	}
	return r.aead.Seal(nonce, nonce, z, []byte(what)), nil
}

// open decrypts and decompresses what seal made for what.
func (r *Repository) open(data []byte, what string, limit int) ([]byte, error) {
	n := r.aead.NonceSize()
	if len(data) < n+r.aead.Overhead() {
		return nil, fmt.Errorf("%s: too short: %w", what, ErrCorrupt)
	}
	z, err := r.aead.Open(nil, data[:n], data[n:], []byte(what))
	if err != nil {
		return nil, fmt.Errorf("%s: authentication failed: %w", what, ErrCorrupt)
	}
	p, err := r.dec.DecodeAll(z, make([]byte, 0, limit))
	if err != nil || len(p) > limit {
		return nil, fmt.Errorf("%s: does not decompress: %w", what, ErrCorrupt)
	}
	return p, nil
}

func randomID(n int) string {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		panic(err)
	}
	return hex.EncodeToString(b)
}
