package server

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/quiverstorage/quiver/internal/tlscert/certtest"
)

// TestKeyFileWithinPool: a key file is inside the pool when its path, with
// symbolic links resolved as far as they exist, lies beneath the pool
// directory's; a sibling whose name starts like the pool's is not.
func TestKeyFileWithinPool(t *testing.T) {
	root := t.TempDir()
	pool := filepath.Join(root, "pool")
	if err := os.MkdirAll(filepath.Join(pool, "sub"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(filepath.Join(pool, "sub"), filepath.Join(root, "link")); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		path string
		want bool
	}{
		{filepath.Join(pool, "keys.json"), true},
		{filepath.Join(pool, "..keys.json"), true}, // a name that starts with two dots
		{filepath.Join(pool, "sub", "new", "keys.json"), true},
		{pool, true},
		{filepath.Join(root, "link", "keys.json"), true},
		{filepath.Join(root, "pool2", "keys.json"), false},
		{filepath.Join(root, "keys.json"), false},
		{filepath.Join(pool, "..", "keys.json"), false},
	} {
		got, err := within(c.path, pool)
		if err != nil || got != c.want {
			t.Errorf("within(%s, pool) = %v, %v; want %v", c.path, got, err, c.want)
		}
	}
	if _, _, err := keyring(Config{PoolDir: pool, KeyFile: filepath.Join(root, "link", "k.json")}); err == nil {
		t.Error("a key file reached through a link into the pool was accepted")
	}
	if k, _, err := keyring(Config{PoolDir: pool, KeyFile: filepath.Join(root, "keys.json")}); err != nil || len(k) != 1 {
		t.Errorf("a key file outside the pool: %v, %v", k, err)
	}
}

// TestKMIPFlags: the KMIP provider's flags make a provider when they are
// whole and readable, alone or beside the key file, and each bad
// combination is refused at start with a message naming the flags.
func TestKMIPFlags(t *testing.T) {
	dir := t.TempDir()
	ca := certtest.NewCA(t, "KMS CA")
	cert, key := ca.Client(t, "node").Write(t, dir)
	caFile := filepath.Join(dir, "ca.pem")
	certtest.WriteFile(t, caFile, ca.PEM)
	notPEM := filepath.Join(dir, "not.pem")
	certtest.WriteFile(t, notPEM, []byte("not a certificate"))
	keys := filepath.Join(dir, "keys.json")
	pool := filepath.Join(dir, "pool")
	good := KMIPConfig{Addr: "127.0.0.1:5696", CAFile: caFile, CertFile: cert, KeyFile: key, Timeout: time.Second}
	with := func(f func(*KMIPConfig)) KMIPConfig { c := good; f(&c); return c }

	for _, c := range []struct {
		name    string
		cfg     Config
		want    string // in the error; "" for none
		names   []string
		newKeys string
	}{
		{"kmip alone", Config{KMIP: good}, "", []string{"kmip"}, ""},
		{"kmip, default timeout", Config{KMIP: with(func(c *KMIPConfig) { c.Timeout = 0 })}, "", []string{"kmip"}, ""},
		{"both, kmip for new volumes", Config{KeyFile: keys, KMIP: good, NewKeys: "kmip"}, "", []string{"keyfile", "kmip"}, "kmip"},
		{"both, key file for new volumes", Config{KeyFile: keys, KMIP: good, NewKeys: "keyfile"}, "", []string{"keyfile", "kmip"}, "keyfile"},
		{"key file named", Config{KeyFile: keys, NewKeys: "keyfile"}, "", []string{"keyfile"}, "keyfile"},
		{"none", Config{}, "", nil, ""},
		{"both, none named", Config{KeyFile: keys, KMIP: good}, "--new-volume-keys (keyfile or kmip)", nil, ""},
		{"named, not configured", Config{KeyFile: keys, NewKeys: "kmip"}, "--new-volume-keys kmip: not a configured key provider (configured: keyfile)", nil, ""},
		{"named, none configured", Config{NewKeys: "kmip"}, "no key provider configured", nil, ""},
		{"files without server", Config{KMIP: with(func(c *KMIPConfig) { c.Addr = "" })}, "need --kmip-server", nil, ""},
		{"no port", Config{KMIP: with(func(c *KMIPConfig) { c.Addr = "kms.example" })}, `--kmip-server "kms.example": want host:port`, nil, ""},
		{"cert without key", Config{KMIP: with(func(c *KMIPConfig) { c.KeyFile = "" })}, "--kmip-cert and --kmip-key go together", nil, ""},
		{"key without cert", Config{KMIP: with(func(c *KMIPConfig) { c.CertFile = "" })}, "--kmip-cert and --kmip-key go together", nil, ""},
		{"no CA", Config{KMIP: with(func(c *KMIPConfig) { c.CAFile = "" })}, "--kmip-server needs --kmip-ca", nil, ""},
		{"no client certificate", Config{KMIP: with(func(c *KMIPConfig) { c.CertFile, c.KeyFile = "", "" })}, "--kmip-server needs --kmip-ca", nil, ""},
		{"unreadable CA", Config{KMIP: with(func(c *KMIPConfig) { c.CAFile = filepath.Join(dir, "absent.pem") })}, "absent.pem: no such file", nil, ""},
		{"CA not PEM", Config{KMIP: with(func(c *KMIPConfig) { c.CAFile = notPEM })}, "not.pem: no PEM certificate", nil, ""},
		{"key of another certificate", Config{KMIP: with(func(c *KMIPConfig) { c.KeyFile = writeOtherKey(t, ca) })}, "client certificate", nil, ""},
		{"negative timeout", Config{KMIP: with(func(c *KMIPConfig) { c.Timeout = -time.Second })}, "--kmip-timeout -1s", nil, ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			c.cfg.PoolDir = pool
			k, newKeys, err := keyring(c.cfg)
			if c.want != "" {
				if err == nil || !strings.Contains(err.Error(), c.want) {
					t.Fatalf("error %v, want one saying %q", err, c.want)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			var names []string
			for n := range k {
				names = append(names, n)
			}
			slices.Sort(names)
			if !slices.Equal(names, c.names) || newKeys != c.newKeys {
				t.Fatalf("providers %v, new keys %q; want %v, %q", names, newKeys, c.names, c.newKeys)
			}
		})
	}
}

// writeOtherKey writes the key of another client certificate of ca.
func writeOtherKey(t *testing.T, ca *certtest.CA) string {
	dir := t.TempDir()
	_, key := ca.Client(t, "other").Write(t, dir)
	return key
}
