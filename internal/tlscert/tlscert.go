package tlscert

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
	"slices"
	"sync"
	"sync/atomic"

	"golang.org/x/sys/unix"
)

// ErrNoCertificates is returned for a CA file with no PEM certificate in it.
var ErrNoCertificates = errors.New("no PEM certificate found")

// Reloader is a set of files read together, read again by Reload or when
// they change (ReloadIfChanged): a certificate pair (Pair) or a CA file
// (CAFile).
type Reloader interface {
	Reload() error
	ReloadIfChanged() (tried bool, err error)
	// Files names the files, for log lines.
	Files() []string
}

var (
	_ Reloader = (*Pair)(nil)
	_ Reloader = (*CAFile)(nil)
)

// watched is the reload logic shared by Pair and CAFile: the files' stamps
// at the last load attempt, and load, which reads the files and, on
// success, makes what it read the one in use.
type watched struct {
	files []string
	load  func() error

	mu   sync.Mutex
	seen []fileStamp // of files at the last load attempt
}

// Reload reads the files again. On failure what is in use stays in use (a
// half-written file during a rotation does not take the server down) and
// the error says why.
func (w *watched) Reload() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.seen = w.stamps()
	return w.load()
}

// ReloadIfChanged reloads if any file changed since the last load attempt,
// and says whether it tried. Files that fail to load are tried again only
// once they change again (the second half of a rotation that wrote the
// certificate first and the key after), so a broken rotation is reported
// once, not on every check.
func (w *watched) ReloadIfChanged() (tried bool, err error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	now := w.stamps()
	if slices.Equal(now, w.seen) {
		return false, nil
	}
	w.seen = now
	return true, w.load()
}

// stamps returns the files' stamps; a file that cannot be read has the zero
// stamp (so its return counts as a change).
func (w *watched) stamps() []fileStamp {
	out := make([]fileStamp, len(w.files))
	for i, f := range w.files {
		out[i], _ = stampOf(f)
	}
	return out
}

// Files implements Reloader.
func (w *watched) Files() []string { return w.files }

// Pair is a certificate and its key, read from two files. Reload reads them
// again; connections that start afterwards get the new pair, connections
// already established keep the one they were set up with.
type Pair struct {
	watched
	cur atomic.Pointer[tls.Certificate]
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
	var st unix.Stat_t
	if err := unix.Stat(file, &st); err != nil {
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
	p := &Pair{}
	p.files = []string{certFile, keyFile}
	p.load = func() error {
		c, err := tls.LoadX509KeyPair(certFile, keyFile)
		if err != nil {
			return fmt.Errorf("load TLS key pair %s, %s: %w", certFile, keyFile, err)
		}
		p.cur.Store(&c)
		return nil
	}
	if err := p.Reload(); err != nil {
		return nil, err
	}
	return p, nil
}

// GetCertificate returns the current pair (tls.Config.GetCertificate).
func (p *Pair) GetCertificate(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	return p.cur.Load(), nil
}

// ServerConfig returns a server tls.Config that presents p's current pair.
// With clientCAs, the server asks clients for a certificate and verifies
// one against its current CAs (mutual TLS): clientAuth says whether a
// client must present one (tls.RequireAndVerifyClientCert, as NBD does) or
// may (tls.VerifyClientCertIfGiven, as the API does, whose probes and
// token clients present none); either way a certificate that does not
// verify (another CA, expired) fails the handshake. Each handshake uses the
// CAs of the last successful load, so a reloaded CA file applies to new
// connections only. Session tickets are then off, so that no connection
// resumes a session whose client certificate the current CAs no longer
// accept. Without clientCAs clientAuth is ignored and no certificate is
// asked for.
func ServerConfig(p *Pair, clientCAs *CAFile, clientAuth tls.ClientAuthType) *tls.Config {
	cfg := &tls.Config{MinVersion: tls.VersionTLS12, GetCertificate: p.GetCertificate}
	if clientCAs == nil {
		return cfg
	}
	cfg.ClientAuth = clientAuth
	cfg.SessionTicketsDisabled = true
	cfg.ClientCAs = clientCAs.Pool()
	var (
		mu     sync.Mutex
		pool   *x509.CertPool
		forCAs *tls.Config
	)
	cfg.GetConfigForClient = func(*tls.ClientHelloInfo) (*tls.Config, error) {
		cur := clientCAs.Pool()
		mu.Lock()
		defer mu.Unlock()
		if cur != pool {
			forCAs = cfg.Clone()
			forCAs.GetConfigForClient, forCAs.ClientCAs = nil, cur
			pool = cur
		}
		return forCAs, nil
	}
	return cfg
}

// CAFile is a file of PEM CA certificates, read again by Reload or when it
// changes.
type CAFile struct {
	watched
	cur atomic.Pointer[x509.CertPool]
}

// LoadCAFile reads the CAs of file.
func LoadCAFile(file string) (*CAFile, error) {
	c := &CAFile{}
	c.files = []string{file}
	c.load = func() error {
		pool, err := CAPool(file)
		if err != nil {
			return err
		}
		c.cur.Store(pool)
		return nil
	}
	if err := c.Reload(); err != nil {
		return nil, err
	}
	return c, nil
}

// Pool returns the CAs of the last successful load.
func (c *CAFile) Pool() *x509.CertPool { return c.cur.Load() }

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
// (the system's roots when caFile is empty) and, with certFile and keyFile,
// presents that client certificate to servers that ask for one (mutual
// TLS; docs/security.md, "Client certificates"). The pair is read now, and
// read again before a handshake when its files changed (a renewal by
// cert-manager), so a long-running client picks up a new certificate with
// its next connection; a pair that no longer loads leaves the last good one
// in use.
func ClientConfig(caFile, certFile, keyFile string) (*tls.Config, error) {
	cfg := &tls.Config{MinVersion: tls.VersionTLS12}
	if caFile != "" {
		cas, err := CAPool(caFile)
		if err != nil {
			return nil, err
		}
		cfg.RootCAs = cas
	}
	if certFile == "" && keyFile == "" {
		return cfg, nil
	}
	p, err := Load(certFile, keyFile)
	if err != nil {
		return nil, err
	}
	// GetClientCertificate, not Certificates: the certificate is sent
	// whatever CAs the server names, so a server that does not trust it
	// says so (a handshake alert) instead of seeing no certificate.
	cfg.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
		_, _ = p.ReloadIfChanged()
		return p.cur.Load(), nil
	}
	return cfg, nil
}
