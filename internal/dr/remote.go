package dr

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"slices"
	"time"

	"github.com/quiverstorage/quiver/internal/api"
	"github.com/quiverstorage/quiver/internal/client"
	"github.com/quiverstorage/quiver/internal/pool"
)

// SiteConfig is one site this server ships to, in the DR configuration
// file (--dr-config): its API and the files holding the token of an admin
// there (read at start, never logged or returned) and the CAs its TLS
// certificate is checked against.
type SiteConfig struct {
	Name      string `json:"name"`
	URL       string `json:"url"` // https://host:port (http only to a loopback address)
	TokenFile string `json:"tokenFile"`
	CAFile    string `json:"caFile,omitempty"`
}

// Config is the DR configuration file.
type Config struct {
	Sites []SiteConfig `json:"sites"`
}

// LoadConfig reads and checks a DR configuration file.
func LoadConfig(path string) (Config, error) {
	var cfg Config
	b, err := os.ReadFile(path)
	if err != nil {
		return cfg, fmt.Errorf("DR configuration: %w", err)
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&cfg); err != nil {
		return cfg, fmt.Errorf("DR configuration %s: %w", path, err)
	}
	var names []string
	for i, s := range cfg.Sites {
		if err := pool.ValidateName(fmt.Sprintf("sites[%d].name", i), s.Name); err != nil {
			return cfg, fmt.Errorf("DR configuration %s: %w", path, err)
		}
		if slices.Contains(names, s.Name) {
			return cfg, fmt.Errorf("DR configuration %s: site %s twice: %w", path, s.Name, pool.ErrInvalid)
		}
		names = append(names, s.Name)
		u, err := url.Parse(s.URL)
		if err != nil || (u.Scheme != "https" && u.Scheme != "http") || u.Host == "" {
			return cfg, fmt.Errorf("DR configuration %s: site %s: url %q: want https://host:port: %w", path, s.Name, s.URL, pool.ErrInvalid)
		}
		if u.Scheme == "http" && !loopbackHost(u.Hostname()) {
			return cfg, fmt.Errorf("DR configuration %s: site %s: plain http only to a loopback address; use https: %w",
				path, s.Name, pool.ErrInvalid)
		}
		if s.TokenFile == "" {
			return cfg, fmt.Errorf("DR configuration %s: site %s: tokenFile is required: %w", path, s.Name, pool.ErrInvalid)
		}
	}
	return cfg, nil
}

// siteRequestTimeout bounds each request to a site (a data write carries
// at most 1 MiB; a commit flushes the target's disks): a site that stops
// answering fails the cycle, which the scheduler tries again, instead of
// holding it until TCP gives up.
const siteRequestTimeout = 2 * time.Minute

// Sites are the sites this server ships to.
type Sites struct {
	order []string
	sites map[string]*site
}

type site struct {
	cfg SiteConfig
	c   *client.Client
}

// ErrNoSite: no site of that name is configured.
var ErrNoSite = errors.New("no such DR site")

// NewSites reads every site's token and CAs and makes its client.
func NewSites(cfg Config) (*Sites, error) {
	s := &Sites{sites: map[string]*site{}}
	for _, sc := range cfg.Sites {
		tok, err := os.ReadFile(sc.TokenFile)
		if err != nil {
			return nil, fmt.Errorf("DR site %s: token: %w", sc.Name, err)
		}
		opts := []client.Option{client.WithToken(string(bytes.TrimSpace(tok))),
			client.WithHTTPClient(&http.Client{Timeout: siteRequestTimeout})}
		if sc.CAFile != "" {
			pem, err := os.ReadFile(sc.CAFile)
			if err != nil {
				return nil, fmt.Errorf("DR site %s: CA: %w", sc.Name, err)
			}
			roots := x509.NewCertPool()
			if !roots.AppendCertsFromPEM(pem) {
				return nil, fmt.Errorf("DR site %s: CA file %s holds no certificate: %w", sc.Name, sc.CAFile, pool.ErrInvalid)
			}
			opts = append(opts, client.WithTLSConfig(&tls.Config{RootCAs: roots, MinVersion: tls.VersionTLS12}))
		}
		c, err := client.New(sc.URL, opts...)
		if err != nil {
			return nil, fmt.Errorf("DR site %s: %w", sc.Name, err)
		}
		s.sites[sc.Name] = &site{cfg: sc, c: c}
		s.order = append(s.order, sc.Name)
	}
	return s, nil
}

// List returns the sites' configurations, in the file's order.
func (s *Sites) List() []SiteConfig {
	var out []SiteConfig
	for _, n := range s.order {
		out = append(out, s.sites[n].cfg)
	}
	return out
}

// Target returns relationship rel's target on site name.
func (s *Sites) Target(name, rel string) (Target, error) {
	st := s.sites[name]
	if st == nil {
		return nil, fmt.Errorf("DR site %q: %w (configured: %v)", name, ErrNoSite, s.order)
	}
	if err := ValidateRelationship(rel); err != nil {
		return nil, err
	}
	return remote{c: st.c, rel: rel}, nil
}

// remote is a target on another site, through its API.
type remote struct {
	c   *client.Client
	rel string
}

func (r remote) Points(ctx context.Context) ([]Point, error) {
	t, err := r.c.DRTarget(ctx, r.rel)
	if err != nil {
		return nil, err
	}
	out := make([]Point, 0, len(t.Points))
	for _, p := range t.Points {
		out = append(out, Point{Seq: p.Seq, Snapshot: p.Snapshot})
	}
	return out, nil
}

func (r remote) Begin(ctx context.Context, s Start) error {
	spec := api.DRBegin{Point: api.DRPoint{Seq: s.Point.Seq, Snapshot: s.Point.Snapshot}, Replace: s.Replace}
	if k := s.Key; k != nil {
		spec.Key = &api.DRKey{Provider: k.Provider, KeyID: k.KeyID, Algorithm: k.Algorithm, Wrapped: k.Wrapped, KeyUID: s.KeyUID}
	}
	if s.Base != nil {
		spec.Base = &api.DRPoint{Seq: s.Base.Seq, Snapshot: s.Base.Snapshot}
	}
	for _, d := range s.Disks {
		spec.Disks = append(spec.Disks, api.DiskSpec{Name: d.Name, Size: d.Size, Shared: d.Shared})
	}
	return r.c.DRBegin(ctx, r.rel, spec)
}

func (r remote) Write(ctx context.Context, disk string, off int64, data []byte) error {
	return r.c.DRWrite(ctx, r.rel, disk, off, data)
}

func (r remote) Zero(ctx context.Context, disk string, off, length int64) error {
	return r.c.DRZero(ctx, r.rel, disk, off, length)
}

func (r remote) Commit(ctx context.Context, p Point) error {
	return r.c.DRCommit(ctx, r.rel, api.DRPoint{Seq: p.Seq, Snapshot: p.Snapshot})
}

func loopbackHost(h string) bool {
	if h == "localhost" {
		return true
	}
	ip := net.ParseIP(h)
	return ip != nil && ip.IsLoopback()
}
