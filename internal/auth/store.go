package auth

import (
	"bytes"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/quiverstorage/quiver/internal/durable"
	"github.com/quiverstorage/quiver/internal/pool"
	"github.com/quiverstorage/quiver/internal/storage"
)

// Files in the pool's root directory.
const (
	// StoreFile holds the tokens (hashed) and the tenants' quotas.
	StoreFile = "tokens.json"
	// AdminTokenFile holds the secret of the admin token made at first
	// start (0600), for a node run without --token-file.
	AdminTokenFile = "admin.token"
)

// secretPrefix starts every secret, so that a leaked one is recognisable
// (and greppable by secret scanners).
const secretPrefix = "qvt_"

// maxStore bounds tokens.json as read from the pool.
const maxStore = 4 << 20

// sharedTimeout bounds one commit to a shared store's backend.
const sharedTimeout = 10 * time.Second

// Limits on the store.
const (
	MaxTokens      = 10000
	MaxDescription = 200
)

// Token is a stored token: never its secret, only the secret's hash. A
// certificate token has no secret: it maps a client certificate, known by
// its SHA-256 fingerprint, to the token's tenant and role (NBD over mutual
// TLS; docs/security.md, "Client certificates").
type Token struct {
	ID          string `json:"id"`
	Tenant      string `json:"tenant,omitempty"`
	Role        Role   `json:"role"`
	Description string `json:"description,omitempty"`
	// SHA256 is the hash of a secret's token, CertSHA256 the fingerprint
	// (SHA-256 of the DER) of a certificate token's certificate: exactly
	// one is set.
	SHA256     string    `json:"sha256,omitempty"`
	CertSHA256 string    `json:"certSha256,omitempty"`
	CreatedAt  time.Time `json:"createdAt"`
}

// Quota bounds what one tenant holds; 0 is unlimited.
type Quota struct {
	Volumes   int64 `json:"volumes,omitempty"`
	Capacity  int64 `json:"capacity,omitempty"` // bytes, the sum of the volumes' capacities
	Snapshots int64 `json:"snapshots,omitempty"`
	IOPS      int64 `json:"iops,omitempty"` // the sum of the volumes' QoS IOPS
}

// Tenant is a tenant's stored settings.
type Tenant struct {
	Name  string `json:"name"`
	Quota Quota  `json:"quota"`
}

type storeFile struct {
	Kind    string   `json:"kind"`
	Version int      `json:"version"`
	Tokens  []Token  `json:"tokens"`
	Tenants []Tenant `json:"tenants"`
}

const storeVersion = 1

// Store is the node's tokens and tenants, backed by tokens.json in the pool.
// It is safe for concurrent use.
type Store struct {
	fsys     storage.FS
	readOnly bool

	mu      sync.Mutex
	f       storeFile
	byHash  map[string]Token         // by SHA256, secrets' tokens
	byCert  map[string]Token         // by CertSHA256, certificate tokens
	done    map[string]chan struct{} // by token ID; closed on revocation
	revoked chan struct{}            // closed for IDs that are not (or no longer) tokens
	// backend, when set (Share), holds the state instead of tokens.json;
	// version is that of the state s holds.
	backend Backend
	version int64
}

// Open loads tokens.json from fsys (the pool's root); an absent file is an
// empty store. A read-only store refuses every change. A file that breaks a
// rule is refused whole: a server must not start with a store it cannot
// trust.
func Open(fsys storage.FS, readOnly bool) (*Store, error) {
	s := &Store{fsys: fsys, readOnly: readOnly, revoked: make(chan struct{})}
	close(s.revoked)
	f := storeFile{Kind: "Tokens", Version: storeVersion, Tokens: []Token{}, Tenants: []Tenant{}}
	data, err := readFile(fsys, StoreFile)
	switch {
	case errors.Is(err, fs.ErrNotExist):
	case err != nil:
		return nil, fmt.Errorf("token store: %w", err)
	default:
		if err := decodeStrict(data, &f); err != nil {
			return nil, fmt.Errorf("token store %s: %w", StoreFile, err)
		}
		if err := f.validate(); err != nil {
			return nil, fmt.Errorf("token store %s: %w", StoreFile, err)
		}
	}
	s.set(f)
	return s, nil
}

func readFile(fsys storage.FS, rel string) ([]byte, error) {
	fh, err := fsys.OpenRegular(rel, os.O_RDONLY)
	if err != nil {
		return nil, err
	}
	defer fh.Close()
	data, err := io.ReadAll(io.LimitReader(io.NewSectionReader(fh, 0, maxStore+1), maxStore+1))
	if err != nil {
		return nil, err
	}
	if len(data) > maxStore {
		return nil, fmt.Errorf("%s is over %d bytes: %w", rel, maxStore, ErrInvalid)
	}
	return data, nil
}

func decodeStrict(data []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return fmt.Errorf("malformed JSON: %v: %w", err, ErrInvalid)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return fmt.Errorf("malformed JSON: data after the top-level value: %w", ErrInvalid)
	}
	return nil
}

func (f *storeFile) validate() error {
	if f.Kind != "Tokens" || f.Version != storeVersion {
		return fmt.Errorf("kind %q version %d: want kind Tokens version %d: %w", f.Kind, f.Version, storeVersion, ErrInvalid)
	}
	if len(f.Tokens) > MaxTokens {
		return fmt.Errorf("%d tokens: at most %d: %w", len(f.Tokens), MaxTokens, ErrInvalid)
	}
	ids, hashes := map[string]bool{}, map[string]bool{}
	for i, t := range f.Tokens {
		if err := t.validate(); err != nil {
			return fmt.Errorf("tokens[%d]: %w", i, err)
		}
		h := t.SHA256 + t.CertSHA256 // one of them is empty
		if ids[t.ID] || hashes[h] {
			return fmt.Errorf("tokens[%d]: duplicate id, hash or certificate: %w", i, ErrInvalid)
		}
		ids[t.ID], hashes[h] = true, true
	}
	names := map[string]bool{}
	for i, t := range f.Tenants {
		if err := validateTenant(t.Name); err != nil {
			return fmt.Errorf("tenants[%d]: %w", i, err)
		}
		if names[t.Name] {
			return fmt.Errorf("tenants[%d]: duplicate tenant %q: %w", i, t.Name, ErrInvalid)
		}
		names[t.Name] = true
		if err := t.Quota.validate(); err != nil {
			return fmt.Errorf("tenants[%d]: %w", i, err)
		}
	}
	return nil
}

func (t Token) validate() error {
	if !validID(t.ID) {
		return fmt.Errorf("id %q: want tk- and 12 hex digits: %w", t.ID, ErrInvalid)
	}
	if err := ValidateRole(t.Role); err != nil {
		return err
	}
	if err := checkScope(t.Role, t.Tenant); err != nil {
		return err
	}
	switch {
	case (t.SHA256 == "") == (t.CertSHA256 == ""):
		return fmt.Errorf("token %s: want either sha256 (a secret's) or certSha256 (a certificate's): %w", t.ID, ErrInvalid)
	case t.SHA256 != "" && !validSHA256(strings.ToLower(t.SHA256)):
		return fmt.Errorf("sha256 of token %s: want 64 hex digits: %w", t.ID, ErrInvalid)
	case t.CertSHA256 != "" && !validSHA256(t.CertSHA256):
		return fmt.Errorf("certSha256 of token %s: want 64 lowercase hex digits: %w", t.ID, ErrInvalid)
	}
	return validateDescription(t.Description)
}

func validSHA256(h string) bool {
	b, err := hex.DecodeString(h)
	return err == nil && len(b) == sha256.Size && strings.ToLower(h) == h
}

func validID(id string) bool {
	h, ok := strings.CutPrefix(id, "tk-")
	if !ok || len(h) != 12 {
		return false
	}
	_, err := hex.DecodeString(h)
	return err == nil && strings.ToLower(h) == h
}

func validateTenant(t string) error {
	if err := pool.ValidateTenant("tenant", t); err != nil {
		return fmt.Errorf("%v: %w", err, ErrInvalid)
	}
	return nil
}

func validateDescription(d string) error {
	if len(d) > MaxDescription {
		return fmt.Errorf("description: at most %d bytes: %w", MaxDescription, ErrInvalid)
	}
	for _, r := range d {
		if r < 0x20 || r == 0x7f {
			return fmt.Errorf("description: no control characters: %w", ErrInvalid)
		}
	}
	return nil
}

// checkScope checks that a role and a tenant go together: admin has none,
// tenant and attach have one, monitor either.
func checkScope(r Role, tenant string) error {
	switch {
	case r == RoleAdmin && tenant != "":
		return fmt.Errorf("an admin token has no tenant: %w", ErrInvalid)
	case (r == RoleTenant || r == RoleAttach) && tenant == "":
		return fmt.Errorf("a %s token needs a tenant: %w", r, ErrInvalid)
	case tenant != "":
		return validateTenant(tenant)
	}
	return nil
}

func (q Quota) validate() error {
	for _, f := range []struct {
		name string
		v    int64
	}{{"volumes", q.Volumes}, {"capacity", q.Capacity}, {"snapshots", q.Snapshots}, {"iops", q.IOPS}} {
		if f.v < 0 {
			return fmt.Errorf("quota %s %d: must be 0 (unlimited) or more: %w", f.name, f.v, ErrInvalid)
		}
	}
	return nil
}

// set makes f the store's state; s.mu is held or s is new.
func (s *Store) set(f storeFile) {
	s.f = f
	s.byHash = make(map[string]Token, len(f.Tokens))
	s.byCert = map[string]Token{}
	if s.done == nil {
		s.done = map[string]chan struct{}{}
	}
	live := map[string]bool{}
	for _, t := range f.Tokens {
		if t.CertSHA256 != "" {
			s.byCert[t.CertSHA256] = t
		} else {
			s.byHash[t.SHA256] = t
		}
		live[t.ID] = true
		if s.done[t.ID] == nil {
			s.done[t.ID] = make(chan struct{})
		}
	}
	for id, ch := range s.done {
		if !live[id] {
			close(ch)
			delete(s.done, id)
		}
	}
}

// commit writes f durably, then makes it the store's state: when it returns
// nil the change survives a crash. On error nothing changed.
func (s *Store) commit(f storeFile) error {
	if s.readOnly {
		return fmt.Errorf("token store: %w", pool.ErrReadOnly)
	}
	if err := f.validate(); err != nil {
		return err
	}
	if err := durable.WriteJSON(s.fsys, StoreFile, f); err != nil {
		return fmt.Errorf("token store: %w", err)
	}
	s.set(f)
	return nil
}

func (s *Store) clone() storeFile {
	f := s.f
	f.Tokens = slices.Clone(s.f.Tokens)
	f.Tenants = slices.Clone(s.f.Tenants)
	return f
}

func hashSecret(secret string) string {
	sum := sha256.Sum256([]byte(secret))
	return hex.EncodeToString(sum[:])
}

func newSecret() string {
	var b [32]byte
	_, _ = rand.Read(b[:])
	return secretPrefix + base64.RawURLEncoding.EncodeToString(b[:])
}

func newID() string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return "tk-" + hex.EncodeToString(b[:])
}

// Create makes a token for tenant with role and returns it with its secret,
// which is not stored and cannot be shown again. The token is durable when
// Create returns.
func (s *Store) Create(tenant string, role Role, description string) (Token, string, error) {
	if err := ValidateRole(role); err != nil {
		return Token{}, "", err
	}
	if err := checkScope(role, tenant); err != nil {
		return Token{}, "", err
	}
	if err := validateDescription(description); err != nil {
		return Token{}, "", err
	}
	secret := newSecret()
	t, err := s.add(Token{Tenant: tenant, Role: role, Description: description, SHA256: hashSecret(secret)})
	if err != nil {
		return Token{}, "", err
	}
	return t, secret, nil
}

// add stores t with a new ID and the time: durably when it returns.
func (s *Store) add(t Token) (Token, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	t.ID, t.CreatedAt = newID(), time.Now().UTC().Truncate(time.Second)
	err := s.update(func(f *storeFile) error {
		if len(f.Tokens) >= MaxTokens {
			return fmt.Errorf("%d tokens: at most %d: %w", len(f.Tokens), MaxTokens, ErrInvalid)
		}
		if t.CertSHA256 != "" {
			if i := slices.IndexFunc(f.Tokens, func(x Token) bool { return x.CertSHA256 == t.CertSHA256 }); i >= 0 {
				return fmt.Errorf("certificate %s: already token %s: %w", t.CertSHA256, f.Tokens[i].ID, ErrInvalid)
			}
		}
		f.Tokens = append(f.Tokens, t)
		return nil
	})
	if err != nil {
		return Token{}, err
	}
	return t, nil
}

// CertFingerprint is the SHA-256 of a certificate's DER encoding, in
// lowercase hex: what a certificate token stores.
func CertFingerprint(der []byte) string {
	sum := sha256.Sum256(der)
	return hex.EncodeToString(sum[:])
}

// CreateForCertificate makes a certificate token: the client certificate
// whose DER encoding is der then acts for tenant with role, as a token of
// that tenant and role would (over NBD with mutual TLS: the certificate
// must also be signed by a CA of --nbd-tls-client-ca). Only the
// certificate's fingerprint is stored; one certificate maps to one token.
// The token is durable when it returns.
func (s *Store) CreateForCertificate(tenant string, role Role, description string, der []byte) (Token, error) {
	if err := ValidateRole(role); err != nil {
		return Token{}, err
	}
	if err := checkScope(role, tenant); err != nil {
		return Token{}, err
	}
	if err := validateDescription(description); err != nil {
		return Token{}, err
	}
	if len(der) == 0 {
		return Token{}, fmt.Errorf("certificate: empty: %w", ErrInvalid)
	}
	return s.add(Token{Tenant: tenant, Role: role, Description: description, CertSHA256: CertFingerprint(der)})
}

// List returns every token, by creation time.
func (s *Store) List() []Token {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := slices.Clone(s.f.Tokens)
	sort.SliceStable(out, func(i, j int) bool { return out[i].CreatedAt.Before(out[j].CreatedAt) })
	return out
}

// Get returns the token with id.
func (s *Store) Get(id string) (Token, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, t := range s.f.Tokens {
		if t.ID == id {
			return t, nil
		}
	}
	return Token{}, fmt.Errorf("token %q: %w", id, ErrTokenNotFound)
}

// Revoke removes the token with id: when Revoke returns the removal is
// durable, its next request is refused, and its Done channel is closed (the
// servers then end its connections).
func (s *Store) Revoke(id string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.update(func(f *storeFile) error {
		i := slices.IndexFunc(f.Tokens, func(t Token) bool { return t.ID == id })
		if i < 0 {
			return fmt.Errorf("token %q: %w", id, ErrTokenNotFound)
		}
		f.Tokens = slices.Delete(f.Tokens, i, i+1)
		return nil
	})
}

// Authenticate returns the principal a secret acts for.
func (s *Store) Authenticate(secret string) (Principal, error) {
	if !strings.HasPrefix(secret, secretPrefix) {
		return Principal{}, ErrUnauthenticated
	}
	h := hashSecret(secret)
	s.mu.Lock()
	t, ok := s.byHash[h]
	s.mu.Unlock()
	if !ok {
		return Principal{}, ErrUnauthenticated
	}
	return Principal{TokenID: t.ID, Tenant: t.Tenant, Role: t.Role}, nil
}

// IsAdmin reports whether secret is the secret of an admin token.
func (s *Store) IsAdmin(secret string) bool {
	p, err := s.Authenticate(secret)
	return err == nil && p.Role == RoleAdmin
}

// AuthenticateCertificate returns the principal a client certificate (its
// DER encoding, verified by the TLS handshake) acts for: that of its
// certificate token. ErrUnauthenticated when it has none.
func (s *Store) AuthenticateCertificate(der []byte) (Principal, error) {
	h := CertFingerprint(der)
	s.mu.Lock()
	t, ok := s.byCert[h]
	s.mu.Unlock()
	if !ok {
		return Principal{}, ErrUnauthenticated
	}
	return Principal{TokenID: t.ID, Tenant: t.Tenant, Role: t.Role}, nil
}

// IsSecret reports whether s has the shape of a token secret (not whether it
// is valid): NBD tells API tokens from attachment tokens by it.
func IsSecret(s string) bool { return strings.HasPrefix(s, secretPrefix) }

// Done returns a channel closed when the token with id is revoked (already
// closed for an ID that is not a token).
func (s *Store) Done(id string) <-chan struct{} {
	s.mu.Lock()
	defer s.mu.Unlock()
	if ch, ok := s.done[id]; ok {
		return ch
	}
	return s.revoked
}

// HasTenants reports whether any token or quota names a tenant.
func (s *Store) HasTenants() bool { return len(s.Tenants()) > 0 }

// Tenants returns every tenant that has a quota or a token, by name.
func (s *Store) Tenants() []Tenant {
	s.mu.Lock()
	defer s.mu.Unlock()
	seen := map[string]Tenant{}
	for _, t := range s.f.Tenants {
		seen[t.Name] = t
	}
	for _, t := range s.f.Tokens {
		if _, ok := seen[t.Tenant]; !ok && t.Tenant != "" {
			seen[t.Tenant] = Tenant{Name: t.Tenant}
		}
	}
	out := make([]Tenant, 0, len(seen))
	for _, t := range seen {
		out = append(out, t)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// Quota returns tenant's quota (zero: unlimited).
func (s *Store) Quota(tenant string) Quota {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, t := range s.f.Tenants {
		if t.Name == tenant {
			return t.Quota
		}
	}
	return Quota{}
}

// SetQuota sets tenant's quota, durably when it returns. A quota below
// what the tenant holds already refuses further growth and takes nothing
// away.
func (s *Store) SetQuota(tenant string, q Quota) (Tenant, error) {
	if err := validateTenant(tenant); err != nil {
		return Tenant{}, err
	}
	if err := q.validate(); err != nil {
		return Tenant{}, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	t := Tenant{Name: tenant, Quota: q}
	return t, s.update(func(f *storeFile) error {
		if i := slices.IndexFunc(f.Tenants, func(x Tenant) bool { return x.Name == tenant }); i >= 0 {
			f.Tenants[i] = t
		} else {
			f.Tenants = append(f.Tenants, t)
		}
		return nil
	})
}

// Bootstrap makes sure a node without --token-file has an admin token: when
// the store holds none, it makes one and writes its secret to
// AdminTokenFile (0600) in the pool, first the file, then the store, each
// durably; a crash between the two leaves a file whose token is not in the
// store, and the next start replaces both. It returns the file's path
// relative to the pool and whether it made a token.
func (s *Store) Bootstrap() (string, bool, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.readOnly || slices.ContainsFunc(s.f.Tokens, func(t Token) bool { return t.Role == RoleAdmin }) {
		return AdminTokenFile, false, nil
	}
	secret := newSecret()
	if err := durable.WriteFile(s.fsys, AdminTokenFile, []byte(secret+"\n"), 0o600); err != nil {
		return "", false, fmt.Errorf("admin token: %w", err)
	}
	t := Token{ID: newID(), Role: RoleAdmin, Description: "made at first start (" + AdminTokenFile + ")",
		SHA256: hashSecret(secret), CreatedAt: time.Now().UTC().Truncate(time.Second)}
	f := s.clone()
	f.Tokens = append(f.Tokens, t)
	if err := s.commit(f); err != nil {
		return "", false, err
	}
	return AdminTokenFile, true, nil
}
