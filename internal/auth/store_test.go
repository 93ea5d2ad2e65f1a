package auth

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/quiverstorage/quiver/internal/pool"
	"github.com/quiverstorage/quiver/internal/storage"
)

func openStore(t *testing.T, dir string) *Store {
	t.Helper()
	fsys, err := storage.OpenOS(dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { fsys.Close() })
	s, err := Open(fsys, false)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// TestStoreKeepsOnlyHashes: a created token authenticates as its tenant and
// role, survives a reopen, and its secret is nowhere in the pool's files;
// the file is 0600.
func TestStoreKeepsOnlyHashes(t *testing.T) {
	dir := t.TempDir()
	s := openStore(t, dir)
	tok, secret, err := s.Create("acme", RoleAttach, "node plugin")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(secret, secretPrefix) || len(secret) < 40 {
		t.Fatalf("secret %q: want qvt_ and 43 base64 characters", secret)
	}
	data, err := os.ReadFile(filepath.Join(dir, StoreFile))
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(data), strings.TrimPrefix(secret, secretPrefix)) {
		t.Fatal("tokens.json holds the secret")
	}
	if fi, _ := os.Stat(filepath.Join(dir, StoreFile)); fi.Mode().Perm() != 0o600 {
		t.Errorf("tokens.json mode %v, want 0600", fi.Mode().Perm())
	}
	for i, st := range []*Store{s, openStore(t, dir)} {
		p, err := st.Authenticate(secret)
		if err != nil || p != (Principal{TokenID: tok.ID, Tenant: "acme", Role: RoleAttach}) {
			t.Errorf("store %d: Authenticate = %+v, %v", i, p, err)
		}
		if _, err := st.Authenticate(secret + "x"); !errors.Is(err, ErrUnauthenticated) {
			t.Errorf("store %d: a wrong secret: %v", i, err)
		}
	}
}

// TestRevoke: a revoked token no longer authenticates, in this store and
// after a reopen, and its Done channel is closed; others are untouched.
func TestRevoke(t *testing.T) {
	dir := t.TempDir()
	s := openStore(t, dir)
	a, sa, _ := s.Create("acme", RoleTenant, "")
	b, sb, _ := s.Create("acme", RoleTenant, "")
	done := s.Done(a.ID)
	if err := s.Revoke(a.ID); err != nil {
		t.Fatal(err)
	}
	select {
	case <-done:
	default:
		t.Error("Done not closed by Revoke")
	}
	select {
	case <-s.Done(b.ID):
		t.Error("another token's Done closed")
	default:
	}
	for _, st := range []*Store{s, openStore(t, dir)} {
		if _, err := st.Authenticate(sa); !errors.Is(err, ErrUnauthenticated) {
			t.Errorf("revoked token authenticates: %v", err)
		}
		if _, err := st.Authenticate(sb); err != nil {
			t.Errorf("other token: %v", err)
		}
	}
	if err := s.Revoke(a.ID); !errors.Is(err, ErrTokenNotFound) {
		t.Errorf("second revoke: %v", err)
	}
}

// TestCreateRefusesBadScopes: roles and tenants go together as documented,
// and a refused create changes nothing.
func TestCreateRefusesBadScopes(t *testing.T) {
	dir := t.TempDir()
	s := openStore(t, dir)
	for _, c := range []struct {
		tenant string
		role   Role
	}{
		{"acme", RoleAdmin}, {"", RoleTenant}, {"", RoleAttach}, {"acme", "root"}, {"Acme", RoleTenant},
		{"a--b", RoleTenant}, {"a-very-long-tenant-name", RoleTenant}, {"../x", RoleTenant},
	} {
		if _, _, err := s.Create(c.tenant, c.role, ""); !errors.Is(err, ErrInvalid) {
			t.Errorf("Create(%q, %q): %v, want ErrInvalid", c.tenant, c.role, err)
		}
	}
	if _, _, err := s.Create("acme", RoleTenant, "bad\ndescription"); !errors.Is(err, ErrInvalid) {
		t.Errorf("description with a newline: %v", err)
	}
	if _, err := os.Stat(filepath.Join(dir, StoreFile)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("refused creates wrote tokens.json: %v", err)
	}
	for _, c := range []struct {
		tenant string
		role   Role
	}{{"", RoleAdmin}, {"acme", RoleTenant}, {"acme", RoleAttach}, {"acme", RoleMonitor}, {"", RoleMonitor}} {
		if _, _, err := s.Create(c.tenant, c.role, ""); err != nil {
			t.Errorf("Create(%q, %q): %v", c.tenant, c.role, err)
		}
	}
}

// TestOpenRefusesAHostileStore: a tokens.json that breaks a rule stops the
// server instead of being half trusted; a link is not followed.
func TestOpenRefusesAHostileStore(t *testing.T) {
	good := `{"kind":"Tokens","version":1,"tokens":[{"id":"tk-0123456789ab","role":"admin","sha256":"` +
		strings.Repeat("ab", 32) + `","createdAt":"2026-01-01T00:00:00Z"}],"tenants":[]}`
	cases := map[string]string{
		"unknown field":     strings.Replace(good, `"role"`, `"x":1,"role"`, 1),
		"bad role":          strings.Replace(good, `"admin"`, `"root"`, 1),
		"admin with tenant": strings.Replace(good, `"role"`, `"tenant":"acme","role"`, 1),
		"bad hash":          strings.Replace(good, strings.Repeat("ab", 32), "00", 1),
		"bad id":            strings.Replace(good, "tk-0123456789ab", "../x", 1),
		"trailing data":     good + "{}",
		"wrong version":     strings.Replace(good, `"version":1`, `"version":2`, 1),
		"bad tenant":        strings.Replace(good, `"tenants":[]`, `"tenants":[{"name":"A--b","quota":{}}]`, 1),
		"negative quota":    strings.Replace(good, `"tenants":[]`, `"tenants":[{"name":"acme","quota":{"volumes":-1}}]`, 1),
		"duplicate token": strings.Replace(good, `}],"tenants"`, `},{"id":"tk-0123456789ab","role":"admin","sha256":"`+
			strings.Repeat("ab", 32)+`","createdAt":"2026-01-01T00:00:00Z"}],"tenants"`, 1),
	}
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, StoreFile), []byte(good), 0o600); err != nil {
		t.Fatal(err)
	}
	openStore(t, dir) // the control
	for name, data := range cases {
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			if err := os.WriteFile(filepath.Join(dir, StoreFile), []byte(data), 0o600); err != nil {
				t.Fatal(err)
			}
			fsys, _ := storage.OpenOS(dir)
			defer fsys.Close()
			if _, err := Open(fsys, false); err == nil {
				t.Error("opened")
			}
		})
	}
	t.Run("link", func(t *testing.T) {
		dir, outside := t.TempDir(), t.TempDir()
		if err := os.WriteFile(filepath.Join(outside, "t.json"), []byte(good), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink(filepath.Join(outside, "t.json"), filepath.Join(dir, StoreFile)); err != nil {
			t.Fatal(err)
		}
		fsys, _ := storage.OpenOS(dir)
		defer fsys.Close()
		if _, err := Open(fsys, false); err == nil {
			t.Error("followed a link")
		}
	})
}

// TestBootstrap: the first start makes one admin token, 0600, that
// authenticates as admin; later starts keep it; a read-only store makes
// none.
func TestBootstrap(t *testing.T) {
	dir := t.TempDir()
	s := openStore(t, dir)
	if _, made, err := s.Bootstrap(); err != nil || !made {
		t.Fatalf("first Bootstrap: made %v, %v", made, err)
	}
	b, err := os.ReadFile(filepath.Join(dir, AdminTokenFile))
	if err != nil {
		t.Fatal(err)
	}
	if fi, _ := os.Stat(filepath.Join(dir, AdminTokenFile)); fi.Mode().Perm() != 0o600 {
		t.Errorf("admin.token mode %v", fi.Mode().Perm())
	}
	s2 := openStore(t, dir)
	if p, err := s2.Authenticate(strings.TrimSpace(string(b))); err != nil || p.Role != RoleAdmin || p.Tenant != "" {
		t.Errorf("admin token: %+v %v", p, err)
	}
	if _, made, err := s2.Bootstrap(); err != nil || made {
		t.Errorf("second Bootstrap: made %v, %v", made, err)
	}
	fsys, _ := storage.OpenOS(t.TempDir())
	defer fsys.Close()
	ro, _ := Open(fsys, true)
	if _, made, err := ro.Bootstrap(); made || err != nil {
		t.Errorf("read-only Bootstrap: made %v, %v", made, err)
	}
	if _, _, err := ro.Create("", RoleAdmin, ""); !errors.Is(err, pool.ErrReadOnly) {
		t.Errorf("read-only Create: %v", err)
	}
}

// TestRoles: what each role may do (docs/security.md's table).
func TestRoles(t *testing.T) {
	want := map[Role][]Action{
		RoleAdmin:   {ActRead, ActWrite, ActAttach, ActNode, ActAdmin},
		RoleTenant:  {ActRead, ActWrite, ActAttach},
		RoleAttach:  {ActRead, ActAttach},
		RoleMonitor: {ActRead},
	}
	for role, acts := range want {
		p := Principal{Role: role, Tenant: "acme"}
		if role == RoleAdmin {
			p.Tenant = ""
		}
		for _, a := range []Action{ActRead, ActWrite, ActAttach, ActNode, ActAdmin} {
			allowed := false
			for _, x := range acts {
				allowed = allowed || x == a
			}
			if got := p.Allows(a); got != allowed {
				t.Errorf("%s may %s: %v, want %v", role, a, got, allowed)
			}
			if err := p.Check(a); (err == nil) != allowed || (err != nil && !errors.Is(err, ErrForbidden)) {
				t.Errorf("%s Check(%s): %v", role, a, err)
			}
		}
	}
	if !(Principal{Role: RoleMonitor}).Allows(ActNode) {
		t.Error("a node-wide monitor may not read the node")
	}
	if (Principal{}).Allows(ActRead) {
		t.Error("no role may read")
	}
}

// TestAdmit: each quota refuses what would pass it and names it; what does
// not grow passes even over a quota lowered after the fact.
func TestAdmit(t *testing.T) {
	q := Quota{Volumes: 2, Capacity: 100, Snapshots: 1, IOPS: 50}
	used := Quota{Volumes: 1, Capacity: 60, Snapshots: 1, IOPS: 40}
	for _, c := range []struct {
		add   Quota
		quota string
	}{
		{Quota{Volumes: 2}, "volumes"},
		{Quota{Capacity: 41}, "capacity"},
		{Quota{Snapshots: 1}, "snapshots"},
		{Quota{IOPS: 11}, "iops"},
		{Quota{IOPS: Unlimited}, "iops"},
	} {
		err := q.Admit("acme", used, c.add)
		if !errors.Is(err, ErrQuota) || !strings.Contains(err.Error(), "quota "+c.quota) {
			t.Errorf("Admit(%+v) = %v, want quota %s exceeded", c.add, err, c.quota)
		}
	}
	for _, add := range []Quota{{Volumes: 1, Capacity: 40, IOPS: 10}, {}, {Capacity: -10}} {
		if err := q.Admit("acme", used, add); err != nil {
			t.Errorf("Admit(%+v) = %v", add, err)
		}
	}
	if err := (Quota{}).Admit("acme", used, Quota{Volumes: 1000, IOPS: Unlimited}); err != nil {
		t.Errorf("no quota: %v", err)
	}
	if err := q.Admit("acme", Quota{IOPS: Unlimited}, Quota{IOPS: 1}); !errors.Is(err, ErrQuota) {
		t.Errorf("more IOPS over an unlimited use: %v", err)
	}
}

// TestCertificateTokens: a certificate token authenticates its certificate
// (by the DER's fingerprint) as its tenant and role, across a reopen; it has
// no secret, authenticates no bearer token, maps one certificate once, and
// its revocation closes its Done channel and refuses the certificate.
func TestCertificateTokens(t *testing.T) {
	dir := t.TempDir()
	s := openStore(t, dir)
	der, other := []byte("a DER certificate"), []byte("another certificate")
	tok, err := s.CreateForCertificate("acme", RoleAttach, "acme's node 1", der)
	if err != nil {
		t.Fatal(err)
	}
	if tok.SHA256 != "" || tok.CertSHA256 != CertFingerprint(der) {
		t.Fatalf("token %+v: want only certSha256 %s", tok, CertFingerprint(der))
	}
	for i, st := range []*Store{s, openStore(t, dir)} {
		p, err := st.AuthenticateCertificate(der)
		if err != nil || p != (Principal{TokenID: tok.ID, Tenant: "acme", Role: RoleAttach}) {
			t.Errorf("store %d: AuthenticateCertificate = %+v, %v", i, p, err)
		}
		if _, err := st.AuthenticateCertificate(other); !errors.Is(err, ErrUnauthenticated) {
			t.Errorf("store %d: an unmapped certificate: %v", i, err)
		}
		if _, err := st.Authenticate(secretPrefix); !errors.Is(err, ErrUnauthenticated) {
			t.Errorf("store %d: an empty secret: %v", i, err)
		}
	}
	if _, err := s.CreateForCertificate("other", RoleTenant, "", der); !errors.Is(err, ErrInvalid) {
		t.Errorf("the same certificate mapped twice: %v", err)
	}
	for _, bad := range []struct {
		tenant string
		role   Role
		der    []byte
	}{{"", RoleAttach, other}, {"acme", RoleAdmin, other}, {"acme", "root", other}, {"acme", RoleTenant, nil}} {
		if _, err := s.CreateForCertificate(bad.tenant, bad.role, "", bad.der); !errors.Is(err, ErrInvalid) {
			t.Errorf("CreateForCertificate(%q, %q, %d bytes): %v, want ErrInvalid", bad.tenant, bad.role, len(bad.der), err)
		}
	}
	if n := len(s.List()); n != 1 {
		t.Fatalf("%d tokens after refused creations, want 1", n)
	}
	done := s.Done(tok.ID)
	if err := s.Revoke(tok.ID); err != nil {
		t.Fatal(err)
	}
	select {
	case <-done:
	default:
		t.Error("revocation did not close Done")
	}
	for i, st := range []*Store{s, openStore(t, dir)} {
		if _, err := st.AuthenticateCertificate(der); !errors.Is(err, ErrUnauthenticated) {
			t.Errorf("store %d: a revoked certificate: %v", i, err)
		}
	}
}
