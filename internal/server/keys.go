package server

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"path/filepath"
	"strings"
	"time"

	"github.com/quiverstorage/quiver/internal/crypt"
	"github.com/quiverstorage/quiver/internal/crypt/keyfile"
	"github.com/quiverstorage/quiver/internal/crypt/kmip"
)

// KMIPConfig is the KMIP key provider (crypt/kmip) of encrypted volumes:
// the server's address, the CA its certificate must chain to, and the
// client certificate and key quiver presents. The zero value: none.
type KMIPConfig struct {
	Addr     string // host:port of the KMIP server; empty: no KMIP provider
	CAFile   string // PEM CA of the server's certificate
	CertFile string // PEM client certificate
	KeyFile  string // PEM key of CertFile
	Timeout  time.Duration
}

// keyring builds the key providers of encrypted volumes from the flags: the
// key file of --key-file and the KMIP server of --kmip-server, either, both
// or none (nil: encrypted volumes are refused); and names the provider of
// new volumes' keys (Config.NewKeys: required when both are configured).
// The key file must live outside the pool: one that a copy of the pool
// carries along would give its data away with it. The KMIP server is not
// contacted here: a node whose KMS is down starts and serves every volume
// but the encrypted ones whose keys it cannot unwrap.
func keyring(cfg Config) (crypt.Keyring, string, error) {
	var ps []crypt.Provider
	if cfg.KeyFile != "" {
		kf, err := openKeyFile(cfg)
		if err != nil {
			return nil, "", err
		}
		ps = append(ps, kf)
	}
	km, err := kmipProvider(cfg.KMIP)
	if err != nil {
		return nil, "", err
	}
	if km != nil {
		ps = append(ps, km)
	}
	newKeys, err := newKeysProvider(cfg.NewKeys, ps)
	if err != nil {
		return nil, "", err
	}
	if len(ps) == 0 {
		return nil, "", nil
	}
	k, err := crypt.NewKeyring(ps...)
	return k, newKeys, err
}

func openKeyFile(cfg Config) (crypt.Provider, error) {
	inside, err := within(cfg.KeyFile, cfg.PoolDir)
	if err != nil {
		return nil, fmt.Errorf("--key-file: %w", err)
	}
	if inside {
		return nil, fmt.Errorf("--key-file %s: inside the pool directory %s; keep the keys apart from the data they protect", cfg.KeyFile, cfg.PoolDir)
	}
	kf, err := keyfile.Open(cfg.KeyFile)
	if err != nil {
		return nil, fmt.Errorf("--key-file: %w", err)
	}
	return kf, nil
}

// logCipher says which of the cipher's paths its self-test chose, and loudly
// when it refused one the CPU offers (a faulty CPU or emulator: the node is
// slower but writes nothing wrong) or every one (no encrypted volume opens
// here).
func logCipher(log *slog.Logger) {
	name, refused, err := crypt.Implementation()
	switch {
	case err != nil:
		log.Error("encrypted volumes cannot be opened on this node", "err", err)
	case len(refused) > 0:
		log.Warn("the cipher's self-test refused a faster path of this CPU", "path", name, "refused", refused)
	default:
		log.Info("encryption at rest: XTS-AES-256", "path", name)
	}
}

// kmipProvider makes the KMIP provider of c, nil when c has no address.
// Every file must be readable and make sense now: a wrong path is a
// configuration to fix before the node starts, not an outage to find at
// the first open of an encrypted volume.
func kmipProvider(c KMIPConfig) (crypt.Provider, error) {
	if c.Addr == "" {
		if c.CAFile != "" || c.CertFile != "" || c.KeyFile != "" {
			return nil, errors.New("--kmip-ca, --kmip-cert and --kmip-key need --kmip-server")
		}
		return nil, nil
	}
	if _, port, err := net.SplitHostPort(c.Addr); err != nil || port == "" {
		return nil, fmt.Errorf("--kmip-server %q: want host:port (KMIP's port is 5696)", c.Addr)
	}
	if (c.CertFile == "") != (c.KeyFile == "") {
		return nil, errors.New("--kmip-cert and --kmip-key go together")
	}
	if c.CAFile == "" || c.CertFile == "" {
		return nil, errors.New("--kmip-server needs --kmip-ca (the CA of the server's certificate) and --kmip-cert and --kmip-key (the client certificate quiver presents)")
	}
	if c.Timeout < 0 {
		return nil, fmt.Errorf("--kmip-timeout %s: must not be negative", c.Timeout)
	}
	tc, err := kmip.TLSConfig(c.CAFile, c.CertFile, c.KeyFile)
	if err != nil {
		return nil, fmt.Errorf("--kmip-server %s: %w", c.Addr, err)
	}
	return kmip.New(kmip.Config{Addr: c.Addr, TLS: tc, Timeout: c.Timeout})
}

// newKeysProvider checks the name of the provider of new volumes' keys
// against the providers configured: "" is allowed only with fewer than two.
func newKeysProvider(name string, ps []crypt.Provider) (string, error) {
	var names []string
	for _, p := range ps {
		if p.Name() == name {
			return name, nil
		}
		names = append(names, p.Name())
	}
	switch {
	case name != "" && len(ps) == 0:
		return "", fmt.Errorf("--new-volume-keys %s: no key provider configured (--key-file, --kmip-server)", name)
	case name != "":
		return "", fmt.Errorf("--new-volume-keys %s: not a configured key provider (configured: %s)", name, strings.Join(names, ", "))
	case len(ps) > 1:
		return "", fmt.Errorf("both --key-file and --kmip-server: name the provider of new encrypted volumes' keys with --new-volume-keys (%s)", strings.Join(names, " or "))
	}
	return "", nil
}

// within reports whether path is dir or lies beneath it, symbolic links of
// either resolved as far as they exist.
func within(path, dir string) (bool, error) {
	p, err := resolve(path)
	if err != nil {
		return false, err
	}
	d, err := resolve(dir)
	if err != nil {
		return false, err
	}
	rel, err := filepath.Rel(d, p)
	if err != nil {
		return false, err
	}
	return rel == "." || rel != ".." && !strings.HasPrefix(rel, ".."+string(filepath.Separator)), nil
}

// resolve makes path absolute and resolves the symbolic links of its
// longest existing ancestor.
func resolve(path string) (string, error) {
	abs, err := filepath.Abs(path)
	if err != nil {
		return "", err
	}
	rest := ""
	for cur := abs; ; {
		if r, err := filepath.EvalSymlinks(cur); err == nil {
			return filepath.Join(r, rest), nil
		}
		parent := filepath.Dir(cur)
		if parent == cur {
			return abs, nil
		}
		rest = filepath.Join(filepath.Base(cur), rest)
		cur = parent
	}
}
