package endpoint

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/quiverstorage/quiver/internal/durable"
	"github.com/quiverstorage/quiver/internal/forward"
	"github.com/quiverstorage/quiver/internal/nbd"
)

// SocketName is the NBD socket in a published volume's directory; its
// exports are the volume's disks, by name.
const SocketName = "nbd.sock"

// ManifestName is the file beside the socket that lists the volume's disks
// (Manifest), for the KubeVirt hook, which sees the directory where QEMU
// does.
const ManifestName = "quiver-endpoint.json"

// Manifest is the content of ManifestName.
type Manifest struct {
	Volume string `json:"volume"`
	Socket string `json:"socket"` // the socket's file name in the directory
	Disks  []Disk `json:"disks"`
}

// MaxVolumes bounds the volumes one endpoint serves: each is a socket, a
// server and its goroutines (a compute node runs far fewer VMs).
const MaxVolumes = 4096

// Config configures an Endpoint.
type Config struct {
	// Root holds the endpoint's state (state/<volume>.json) and the
	// volumes' directories (volumes/<volume>/).
	Root string
	// Locator finds the volumes' primaries.
	Locator *Locator
	// NBD configures the NBD server of each volume's socket.
	NBD nbd.Config
	// Forward tunes the connections to the primaries (timeouts).
	Forward forward.Options
	// PollInterval is how often a volume's primary is asked again while
	// its disks are served (default 1 s): a primary that moved without
	// its connection breaking (a partition, a drain) is left within it.
	PollInterval time.Duration
	Log          *slog.Logger
}

// Endpoint serves the volumes published on a compute node.
type Endpoint struct {
	cfg Config
	log *slog.Logger

	mu     sync.Mutex
	vols   map[string]*served
	closed bool
}

// served is one volume being served: its socket's server.
type served struct {
	vol Volume
	srv *nbd.Server
	ln  net.Listener
}

// Published says where a publication is served.
type Published struct {
	Dir    string `json:"dir"`    // the volume's directory: bind it where QEMU looks
	Socket string `json:"socket"` // the NBD socket in Dir
}

// Open starts an endpoint on root and serves again every volume published
// there before (a restart of the endpoint).
func Open(cfg Config) (*Endpoint, error) {
	if cfg.Root == "" || !filepath.IsAbs(cfg.Root) {
		return nil, fmt.Errorf("endpoint root %q: want an absolute directory", cfg.Root)
	}
	if cfg.Locator == nil {
		return nil, errors.New("endpoint: no locator (storage nodes)")
	}
	if cfg.PollInterval <= 0 {
		cfg.PollInterval = time.Second
	}
	if cfg.Forward.MaxPause <= 0 {
		// A VM waits while there is no primary: look for the promoted
		// one often (the look-ups of a volume's disks are shared).
		cfg.Forward.MaxPause = 200 * time.Millisecond
	}
	if cfg.Log == nil {
		cfg.Log = slog.Default()
	}
	for _, d := range []string{cfg.Root, filepath.Join(cfg.Root, "state"), filepath.Join(cfg.Root, "volumes")} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return nil, fmt.Errorf("endpoint root: %w", err)
		}
	}
	// The root holds tokens: root alone reaches it.
	if err := os.Chmod(cfg.Root, 0o700); err != nil {
		return nil, fmt.Errorf("endpoint root: %w", err)
	}
	e := &Endpoint{cfg: cfg, log: cfg.Log, vols: map[string]*served{}}
	if err := e.restore(); err != nil {
		e.Close()
		return nil, err
	}
	return e, nil
}

func (e *Endpoint) statePath(name string) string {
	return filepath.Join(e.cfg.Root, "state", name+".json")
}

// Dir is the directory of volume name's socket.
func (e *Endpoint) Dir(name string) string { return filepath.Join(e.cfg.Root, "volumes", name) }

// restore serves every publication recorded in the state directory.
func (e *Endpoint) restore() error {
	ents, err := os.ReadDir(filepath.Join(e.cfg.Root, "state"))
	if err != nil {
		return fmt.Errorf("endpoint state: %w", err)
	}
	for _, ent := range ents {
		name, ok := strings.CutSuffix(ent.Name(), ".json")
		if !ok || durable.IsTemp(ent.Name()) {
			continue
		}
		var v Volume
		if err := durable.ReadJSON(e.statePath(name), &v); err != nil {
			return fmt.Errorf("endpoint state of %s: %w (remove the file to forget the publication)", name, err)
		}
		if err := v.check(); err != nil || v.Name != name {
			return fmt.Errorf("endpoint state of %s: %v (remove the file to forget the publication)", name, err)
		}
		e.mu.Lock()
		err := e.serve(v)
		e.mu.Unlock()
		if err != nil {
			return err
		}
		e.log.Info("serving again", "volume", v.Name, "disks", len(v.Disks))
	}
	return nil
}

// Publish serves v's disks on its socket and returns where. Publishing
// the same again is the same answer; another token or other disks replace
// the publication (the connections of the old one are closed: QEMU
// reconnects). The publication is durable when Publish returns.
func (e *Endpoint) Publish(ctx context.Context, v Volume) (Published, error) {
	if err := v.check(); err != nil {
		return Published{}, err
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed {
		return Published{}, errors.New("the endpoint is shutting down")
	}
	if s, ok := e.vols[v.Name]; ok {
		if s.vol.same(v) {
			return e.published(s), nil
		}
		e.log.Info("publication replaced", "volume", v.Name)
		e.stop(s)
	} else if len(e.vols) >= MaxVolumes {
		return Published{}, fmt.Errorf("volume %s: this endpoint already serves %d volumes, its most: %w", v.Name, MaxVolumes, ErrInvalid)
	}
	if err := durable.WriteJSONPath(e.statePath(v.Name), v); err != nil {
		return Published{}, fmt.Errorf("record the publication of %s: %w", v.Name, err)
	}
	if err := e.serve(v); err != nil {
		return Published{}, err
	}
	e.log.Info("published", "volume", v.Name, "export", v.Export, "disks", len(v.Disks))
	return e.published(e.vols[v.Name]), nil
}

func (e *Endpoint) published(s *served) Published {
	dir := e.Dir(s.vol.Name)
	return Published{Dir: dir, Socket: filepath.Join(dir, SocketName)}
}

// serve makes v's directory, manifest and socket and serves it. e.mu is
// held.
func (e *Endpoint) serve(v Volume) error {
	dir := e.Dir(v.Name)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("volume %s: %w", v.Name, err)
	}
	if err := os.Chmod(dir, 0o755); err != nil {
		return fmt.Errorf("volume %s: %w", v.Name, err)
	}
	m := Manifest{Volume: v.Name, Socket: SocketName, Disks: v.Disks}
	if err := durable.WriteJSONPath(filepath.Join(dir, ManifestName), m); err != nil {
		return fmt.Errorf("volume %s: manifest: %w", v.Name, err)
	}
	if err := os.Chmod(filepath.Join(dir, ManifestName), 0o644); err != nil {
		return fmt.Errorf("volume %s: manifest: %w", v.Name, err)
	}
	weak, err := placeholder(dir)
	if err != nil {
		return fmt.Errorf("volume %s: %w", v.Name, err)
	}
	if weak != nil {
		e.log.Warn("the placeholder disk.img is not immutable: a VM started without quiver's KubeVirt hook could write it", "volume", v.Name, "err", weak)
	}
	sock := filepath.Join(dir, SocketName)
	ln, err := nbd.ListenUnix(sock)
	if err != nil {
		return fmt.Errorf("volume %s: listen on %s: %w", v.Name, sock, err)
	}
	if err := os.Chmod(sock, 0o666); err != nil {
		ln.Close()
		return fmt.Errorf("volume %s: %w", v.Name, err)
	}
	ex := &exports{vol: v, opts: e.cfg.Forward, poll: e.cfg.PollInterval, log: e.log.With("volume", v.Name),
		resolve: &resolver{loc: e.cfg.Locator, volume: v.Name, fresh: min(e.cfg.PollInterval/2, 250*time.Millisecond)}}
	cfg := e.cfg.NBD
	cfg.Logger = e.log.With("volume", v.Name)
	srv := nbd.NewServer(ex, cfg)
	s := &served{vol: v, srv: srv, ln: ln}
	e.vols[v.Name] = s
	go func() {
		if err := srv.Serve(ln); err != nil && !errors.Is(err, nbd.ErrServerClosed) {
			e.log.Error("volume socket stopped", "volume", v.Name, "err", err)
		}
	}()
	return nil
}

// stop ends s's server (its connections too). e.mu is held.
func (e *Endpoint) stop(s *served) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = s.srv.Shutdown(ctx)
	delete(e.vols, s.vol.Name)
}

// Unpublish stops serving volume name and forgets it: its socket, its
// directory and its record go. A volume not published is success.
func (e *Endpoint) Unpublish(ctx context.Context, name string) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if s, ok := e.vols[name]; ok {
		e.stop(s)
	}
	if err := os.Remove(e.statePath(name)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("forget the publication of %s: %w", name, err)
	}
	if err := durable.SyncDirPath(filepath.Join(e.cfg.Root, "state")); err != nil {
		return err
	}
	dir := e.Dir(name)
	if err := RemovePlaceholder(dir); err != nil {
		return fmt.Errorf("volume %s: %w", name, err)
	}
	for _, f := range []string{SocketName, ManifestName} {
		if err := os.Remove(filepath.Join(dir, f)); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("volume %s: %w", name, err)
		}
	}
	if err := os.Remove(dir); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("volume %s: its directory %s: %w (is it still bind-mounted?)", name, dir, err)
	}
	e.log.Info("unpublished", "volume", name)
	return nil
}

// Status is one published volume as the endpoint serves it.
type Status struct {
	Volume
	Published
	Connections int `json:"connections"`
}

// List returns the publications, sorted by name, without their tokens.
func (e *Endpoint) List() []Status {
	e.mu.Lock()
	defer e.mu.Unlock()
	out := make([]Status, 0, len(e.vols))
	for _, s := range e.vols {
		v := s.vol
		v.Token = ""
		out = append(out, Status{Volume: v, Published: e.published(s), Connections: s.srv.Conns()})
	}
	slices.SortFunc(out, func(a, b Status) int { return strings.Compare(a.Name, b.Name) })
	return out
}

// Close stops serving every volume; the publications stay recorded, for
// the next endpoint to serve them again.
func (e *Endpoint) Close() {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.closed = true
	for _, s := range e.vols {
		e.stop(s)
	}
}
