package server

import (
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"time"

	"github.com/quiverstorage/quiver/internal/tlscert"
)

// TLS modes of the NBD server (Config.NBDTLS).
const (
	TLSOff     = "off"     // STARTTLS is refused
	TLSOn      = "on"      // clients may upgrade with STARTTLS
	TLSRequire = "require" // clients must upgrade before anything else
)

// TLSConfig is the TLS part of Config: the files and the NBD mode.
type TLSConfig struct {
	// CertFile and KeyFile, when set, serve the API over HTTPS (and
	// /metrics with it).
	CertFile, KeyFile string
	// NBDCertFile and NBDKeyFile, when set, let NBD clients upgrade with
	// NBD_OPT_STARTTLS. NBDClientCAFile, if set, requires NBD clients to
	// present a certificate signed by one of its CAs, and is the client CA
	// of the API too (APIClientCert).
	NBDCertFile, NBDKeyFile, NBDClientCAFile string
	// APIClientCert says whether the API over HTTPS asks for a client
	// certificate verified against NBDClientCAFile: TLSOff (never asked),
	// TLSOn (asked; a client may present none) or TLSRequire (a client
	// without one fails the handshake). Empty: on with a client CA and the
	// API's certificate, off otherwise. A verified certificate mapped to a
	// certificate token authenticates the request (docs/security.md,
	// "Client certificates").
	APIClientCert string
	// NBDMode is TLSOff, TLSOn or TLSRequire. Empty: with certificate
	// files, require on a non-loopback NBD address, on otherwise; without
	// them, off.
	NBDMode string
	// WatchInterval is how often the certificate and key files are checked
	// for a change (a rotation by cert-manager, a Kubernetes secret update,
	// a `mv`); a changed pair is reloaded as on SIGHUP. Zero: every
	// DefaultTLSWatchInterval; negative: never (SIGHUP only).
	WatchInterval time.Duration
}

// DefaultTLSWatchInterval is how often certificate files are checked for a
// change when TLSConfig.WatchInterval is zero.
const DefaultTLSWatchInterval = 5 * time.Second

// ErrTLSConfig is returned for TLS flags that do not fit together.
var ErrTLSConfig = errors.New("TLS configuration")

// tlsSetup is what Run builds from TLSConfig: the files SIGHUP reloads, and
// the configurations of each transport (nil: plain).
type tlsSetup struct {
	files  []tlscert.Reloader // certificate pairs and the client CA file
	api    *tls.Config
	nbd    *tls.Config
	nbdReq bool
}

// setupTLS loads the certificate files that cfg names. The client CA file
// is loaded once and serves both listeners, and is reloaded once.
func setupTLS(cfg TLSConfig, nbdAddr string) (*tlsSetup, error) {
	s := &tlsSetup{}
	if (cfg.CertFile == "") != (cfg.KeyFile == "") {
		return nil, fmt.Errorf("%w: --tls-cert and --tls-key go together", ErrTLSConfig)
	}
	if (cfg.NBDCertFile == "") != (cfg.NBDKeyFile == "") {
		return nil, fmt.Errorf("%w: --nbd-tls-cert and --nbd-tls-key go together", ErrTLSConfig)
	}
	mode := cfg.NBDMode
	switch mode {
	case "":
		mode = TLSOff
		if cfg.NBDCertFile != "" {
			mode = TLSOn
			if nbdAddr != "" && !IsLoopback(nbdAddr) {
				mode = TLSRequire
			}
		}
	case TLSOff:
	case TLSOn, TLSRequire:
		if cfg.NBDCertFile == "" {
			return nil, fmt.Errorf("%w: --nbd-tls %s needs --nbd-tls-cert and --nbd-tls-key", ErrTLSConfig, mode)
		}
	default:
		return nil, fmt.Errorf("%w: --nbd-tls %q: want off, on or require", ErrTLSConfig, mode)
	}
	apiClient, err := apiClientAuth(cfg)
	if err != nil {
		return nil, err
	}
	if cfg.NBDClientCAFile != "" && mode == TLSOff && apiClient == tls.NoClientCert {
		return nil, fmt.Errorf("%w: --nbd-tls-client-ca needs NBD TLS, or the API over HTTPS (--tls-cert) with --api-client-cert on or require", ErrTLSConfig)
	}
	var cas *tlscert.CAFile
	if cfg.NBDClientCAFile != "" {
		if cas, err = tlscert.LoadCAFile(cfg.NBDClientCAFile); err != nil {
			return nil, err
		}
	}
	if cfg.CertFile != "" {
		p, err := tlscert.Load(cfg.CertFile, cfg.KeyFile)
		if err != nil {
			return nil, err
		}
		apiCAs := cas
		if apiClient == tls.NoClientCert {
			apiCAs = nil
		}
		s.api = tlscert.ServerConfig(p, apiCAs, apiClient)
		s.files = append(s.files, p)
	}
	if mode != TLSOff {
		p, err := tlscert.Load(cfg.NBDCertFile, cfg.NBDKeyFile)
		if err != nil {
			return nil, err
		}
		s.files = append(s.files, p)
		s.nbd = tlscert.ServerConfig(p, cas, tls.RequireAndVerifyClientCert)
		// Full 16 KiB records from the first byte: NBD replies are not web
		// pages whose first bytes a browser renders early.
		s.nbd.DynamicRecordSizingDisabled = true
		s.nbdReq = mode == TLSRequire
	}
	if cas != nil {
		s.files = append(s.files, cas)
	}
	return s, nil
}

// apiClientAuth returns how the API's TLS listener treats client
// certificates (TLSConfig.APIClientCert). NBD requires a certificate
// whenever there is a client CA; the API asks by default and requires one
// only when told to, since its health probes (a kubelet's, a load
// balancer's) and its bearer-token clients present none.
func apiClientAuth(cfg TLSConfig) (tls.ClientAuthType, error) {
	mode := cfg.APIClientCert
	if mode == "" {
		if cfg.CertFile == "" || cfg.NBDClientCAFile == "" {
			return tls.NoClientCert, nil
		}
		mode = TLSOn
	}
	switch mode {
	case TLSOff:
		return tls.NoClientCert, nil
	case TLSOn, TLSRequire:
	default:
		return 0, fmt.Errorf("%w: --api-client-cert %q: want off, on or require", ErrTLSConfig, mode)
	}
	if cfg.CertFile == "" || cfg.NBDClientCAFile == "" {
		return 0, fmt.Errorf("%w: --api-client-cert %s needs the API over HTTPS (--tls-cert, --tls-key) and a client CA (--nbd-tls-client-ca)",
			ErrTLSConfig, mode)
	}
	if mode == TLSRequire {
		return tls.RequireAndVerifyClientCert, nil
	}
	return tls.VerifyClientCertIfGiven, nil
}

// reload reads every certificate pair and CA file again; one that fails to
// load stays as it was.
func (s *tlsSetup) reload(log *slog.Logger) {
	for _, f := range s.files {
		if err := f.Reload(); err != nil {
			log.Error("TLS certificate files not reloaded: the previous ones stay in use", "files", f.Files(), "err", err)
			continue
		}
		log.Info("TLS certificate reloaded: new connections use it", "files", f.Files())
	}
}

// reloadChanged reloads the pairs and CA files whose files changed since
// they were last read.
func (s *tlsSetup) reloadChanged(log *slog.Logger) {
	for _, f := range s.files {
		tried, err := f.ReloadIfChanged()
		switch {
		case !tried:
		case err != nil:
			log.Error("TLS certificate files changed but do not load: the previous ones stay in use", "files", f.Files(), "err", err)
		default:
			log.Info("TLS certificate files changed and were reloaded: new connections use them", "files", f.Files())
		}
	}
}

// watch returns a channel that ticks when the certificate files should be
// checked (nil, which never ticks, without TLS or with watching off), and a
// function to stop it.
func (s *tlsSetup) watch(every time.Duration) (<-chan time.Time, func()) {
	if len(s.files) == 0 || every < 0 {
		return nil, func() {}
	}
	if every == 0 {
		every = DefaultTLSWatchInterval
	}
	t := time.NewTicker(every)
	return t.C, t.Stop
}

// serveAPI serves srv on ln, over TLS when the API has a certificate.
func (s *tlsSetup) serveAPI(srv *http.Server, ln net.Listener) error {
	if s.api == nil {
		return srv.Serve(ln)
	}
	srv.TLSConfig = s.api
	// HTTP/1.1 only, as over plain TCP: the API's limits (per-connection
	// body timeouts, connections per peer) are written for it.
	srv.TLSNextProto = map[string]func(*http.Server, *tls.Conn, http.Handler){}
	return srv.ServeTLS(ln, "", "")
}
