// Package backup keeps whole-VM backups in a repository on an object store
// (internal/objstore): every backup of a volume is one crash-consistent point
// across its disks (a snapshot), stored as fixed-size chunks that are
// content-addressed, deduplicated across every VM of the repository,
// compressed (zstd) and encrypted before they leave the node, and a manifest
// that lists them. A backup after the first reads only the chunks that the
// pool's change tracking reports changed since its parent.
//
// Repository layout (every object but config and keys is encrypted):
//
//	config               version, id, chunk size (JSON)
//	keys/<id>            the repository's master keys wrapped by one user key
//	chunks/<id[:2]>/<id> a chunk: zstd, then AES-256-GCM; id = HMAC-SHA256 of
//	                     its plaintext under the repository's id key
//	backups/<id>         a manifest: the volume, the snapshot, each disk's
//	                     chunk list (JSON, zstd, AES-256-GCM)
//	locks/<id>           a backup or a collection in progress
//
// Keys: a user key (a key file of at least 32 random bytes, never stored)
// unwraps the master keys (AES-256-GCM under HKDF-SHA256 of the user key). A
// repository may have several user keys: rotation adds the new one and
// removes the old, without touching any chunk. The store never sees a
// plaintext byte of a disk or a manifest, nor a key.
//
// What is durable: a backup exists once its manifest is stored, and it is
// stored last, after every chunk it names; a backup that fails midway
// leaves no manifest (its new chunks are garbage, removed by Collect).
//
// Imports from quiver: objstore, pool.
package backup

import (
	"bytes"
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

// DefaultChunkSize is the unit of change, deduplication and transfer: a
// change of a few bytes re-sends one chunk, and clones of one image share
// every chunk they have not changed.
const DefaultChunkSize = 1 << 20

const (
	repoVersion = 1
	// MinKeyLen is the shortest user key accepted.
	MinKeyLen = 32
	maxMeta   = 64 << 20 // a manifest: 8 TiB of disks at 1 MiB chunks
)

type repoConfig struct {
	Version   int       `json:"version"`
	ID        string    `json:"id"`
	ChunkSize int64     `json:"chunkSize"`
	CreatedAt time.Time `json:"createdAt"`
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
}

// Init makes a new repository in store with one user key.
func Init(ctx context.Context, store objstore.Store, userKey []byte) (*Repository, error) {
	if len(userKey) < MinKeyLen {
		return nil, fmt.Errorf("key: %d bytes, at least %d random bytes are needed (quiver backup key generate): %w",
			len(userKey), MinKeyLen, ErrInvalid)
	}
	if _, err := store.Get(ctx, "config", 1<<16); err == nil {
		return nil, fmt.Errorf("%s: %w", store, ErrExists)
	} else if !errors.Is(err, objstore.ErrNotFound) {
		return nil, err
	}
	cfg := repoConfig{Version: repoVersion, ID: randomID(8), ChunkSize: DefaultChunkSize, CreatedAt: time.Now().UTC()}
	master := make([]byte, 64)
	if _, err := rand.Read(master); err != nil {
		return nil, err
	}
	r, err := newRepository(store, cfg, master)
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
	data, err := store.Get(ctx, "config", 1<<16)
	if errors.Is(err, objstore.ErrNotFound) {
		return nil, fmt.Errorf("%s: %w (quiver backup init makes one)", store, ErrNoRepository)
	}
	if err != nil {
		return nil, err
	}
	var cfg repoConfig
	if err := json.Unmarshal(data, &cfg); err != nil || cfg.Version != repoVersion || cfg.ChunkSize <= 0 || cfg.ChunkSize > 64<<20 {
		return nil, fmt.Errorf("%s: config is not a quiver repository of version %d: %w", store, repoVersion, ErrCorrupt)
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
		r, err := newRepository(store, cfg, master)
		if err != nil {
			return nil, err
		}
		r.keyID = strings.TrimPrefix(k, "keys/")
		return r, nil
	}
	return nil, fmt.Errorf("%s: %w", store, ErrWrongKey)
}

func newRepository(store objstore.Store, cfg repoConfig, master []byte) (*Repository, error) {
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
	return &Repository{store: store, cfg: cfg, idKey: master[32:], aead: aead, enc: enc, dec: dec, master: master}, nil
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

// ChunkSize is the repository's chunk size.
func (r *Repository) ChunkSize() int64 { return r.cfg.ChunkSize }

// chunkID is the content address of a chunk's plaintext.
func (r *Repository) chunkID(p []byte) string {
	m := hmac.New(sha256.New, r.idKey)
	m.Write(p)
	return hex.EncodeToString(m.Sum(nil))
}

func chunkKey(id string) string { return "chunks/" + id[:2] + "/" + id }

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

// readChunk returns a chunk's plaintext, checked against its address.
func (r *Repository) readChunk(ctx context.Context, id string) ([]byte, error) {
	data, err := r.store.Get(ctx, chunkKey(id), r.cfg.ChunkSize+1<<16)
	if errors.Is(err, objstore.ErrNotFound) {
		return nil, fmt.Errorf("chunk %s: missing from the store: %w", id, ErrCorrupt)
	}
	if err != nil {
		return nil, err
	}
	p, err := r.open(data, "chunk:"+id, int(r.cfg.ChunkSize))
	if err != nil {
		return nil, err
	}
	if !bytes.Equal([]byte(r.chunkID(p)), []byte(id)) {
		return nil, fmt.Errorf("chunk %s: content does not match its address: %w", id, ErrCorrupt)
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
