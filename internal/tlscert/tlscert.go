package tlscert

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
)

// ErrNoCertificates is returned for a CA file with no PEM certificate in it.
var ErrNoCertificates = errors.New("no PEM certificate found")

// Pair is a certificate and its key, read from two files. Reload reads them
// again; connections that start afterwards get the new pair, connections
// already established keep the one they were set up with.
type Pair struct {
	certFile, keyFile string
	cur               atomic.Pointer[tls.Certificate]

	mu   sync.Mutex
	seen [2]fileStamp // of certFile and keyFile at the last load attempt
}

// fileStamp tells one version of a file from another: a rename over it (a
// Kubernetes secret's symlink swap, cert-manager, `mv new.pem cert.pem`)
// changes the inode, a rewrite in place the size or modification time.
type fileStamp struct {
	dev, ino   uint64
	size       int64
	mtimeNanos int64
}

func stampOf(file string) (fileStamp, error) {
	var st syscall.Stat_t
	if err := syscall.Stat(file, &st); err != nil {
		return fileStamp{}, err
	}
	return fileStamp{dev: uint64(st.Dev), ino: st.Ino, size: st.Size, mtimeNanos: st.Mtim.Nano()}, nil
}

// Load reads the pair from certFile (PEM, the leaf first, then any
// intermediates) and keyFile (PEM).
func Load(certFile, keyFile string) (*Pair, error) {
	if certFile == "" || keyFile == "" {
		return nil, errors.New("a TLS certificate needs both a certificate file and a key file")
	}
	p := &Pair{certFile: certFile, keyFile: keyFile}
	if err := p.Reload(); err != nil {
		return nil, err
	}
	return p, nil
}

// Reload reads the files again. On failure the pair in use stays in use
// (a half-written file during a rotation does not take the server down)
// and the error says why.
func (p *Pair) Reload() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.seen = p.stamps()
	return p.load()
}

// ReloadIfChanged reloads the pair if either file changed since the last
// load attempt, and says whether it tried. A pair that fails to load is
// tried again only once its files change again (the second half of a
// rotation that wrote the certificate first and the key after), so a broken
// rotation is reported once, not on every check.
func (p *Pair) ReloadIfChanged() (tried bool, err error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	now := p.stamps()
	if now == p.seen {
		return false, nil
	}
	p.seen = now
	return true, p.load()
}

// stamps returns the files' stamps; a file that cannot be read has the zero
// stamp (so its return counts as a change).
func (p *Pair) stamps() [2]fileStamp {
	var out [2]fileStamp
	for i, f := range []string{p.certFile, p.keyFile} {
		out[i], _ = stampOf(f)
	}
	return out
}

func (p *Pair) load() error {
	c, err := tls.LoadX509KeyPair(p.certFile, p.keyFile)
	if err != nil {
		return fmt.Errorf("load TLS key pair %s, %s: %w", p.certFile, p.keyFile, err)
	}
	p.cur.Store(&c)
	return nil
}

// Files returns the certificate and key file names.
func (p *Pair) Files() (cert, key string) { return p.certFile, p.keyFile }

// GetCertificate returns the current pair (tls.Config.GetCertificate).
func (p *Pair) GetCertificate(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	return p.cur.Load(), nil
}

// ServerConfig returns a server tls.Config that presents p's current pair.
// With clientCAFile, clients must present a certificate signed by one of
// its CAs (mutual TLS).
func ServerConfig(p *Pair, clientCAFile string) (*tls.Config, error) {
	cfg := &tls.Config{MinVersion: tls.VersionTLS12, GetCertificate: p.GetCertificate}
	if clientCAFile != "" {
		cas, err := CAPool(clientCAFile)
		if err != nil {
			return nil, err
		}
		cfg.ClientCAs = cas
		cfg.ClientAuth = tls.RequireAndVerifyClientCert
	}
	return cfg, nil
}

// CAPool reads the PEM certificates of file into a pool.
func CAPool(file string) (*x509.CertPool, error) {
	b, err := os.ReadFile(file)
	if err != nil {
		return nil, fmt.Errorf("read CA file: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(b) {
		return nil, fmt.Errorf("CA file %s: %w", file, ErrNoCertificates)
	}
	return pool, nil
}

// ClientConfig returns a client tls.Config that trusts the CAs of caFile
// (the system's roots when caFile is empty).
func ClientConfig(caFile string) (*tls.Config, error) {
	cfg := &tls.Config{MinVersion: tls.VersionTLS12}
	if caFile != "" {
		cas, err := CAPool(caFile)
		if err != nil {
			return nil, err
		}
		cfg.RootCAs = cas
	}
	return cfg, nil
}
