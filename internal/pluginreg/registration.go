package pluginreg

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"sync"
	"time"

	"google.golang.org/grpc"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"
)

// DefaultDir is the kubelet's plugin registration directory on the host.
const DefaultDir = "/var/lib/kubelet/plugins_registry"

// Config says what to register.
type Config struct {
	// Dir is the kubelet's registration directory as this process sees it
	// (a hostPath mount of DefaultDir in a pod).
	Dir string
	// DriverName is the CSI driver's name (also the socket's name).
	DriverName string
	// Endpoint is the CSI socket's path as the kubelet sees it on the host,
	// for example /var/lib/kubelet/plugins/csi.quiver.io/csi.sock.
	Endpoint string
	Logger   *slog.Logger
}

// Server serves the registration service on <Dir>/<DriverName>-reg.sock.
type Server struct {
	cfg Config
	log *slog.Logger

	mu      sync.Mutex
	status  *registerapi.RegistrationStatus // the kubelet's last word, nil before it spoke
	refused chan struct{}                   // closed when the kubelet refuses the plugin
}

// New checks cfg and returns a server. It does not listen yet.
func New(cfg Config) (*Server, error) {
	if cfg.Dir == "" || !filepath.IsAbs(cfg.Dir) {
		return nil, fmt.Errorf("%w: the registration directory %q must be an absolute path", ErrInvalid, cfg.Dir)
	}
	if cfg.DriverName == "" || filepath.Base(cfg.DriverName) != cfg.DriverName || cfg.DriverName == "." || cfg.DriverName == ".." {
		return nil, fmt.Errorf("%w: driver name %q cannot name a socket", ErrInvalid, cfg.DriverName)
	}
	if cfg.Endpoint == "" || !filepath.IsAbs(cfg.Endpoint) {
		return nil, fmt.Errorf("%w: the CSI socket's path as the kubelet sees it, %q, must be an absolute path", ErrInvalid, cfg.Endpoint)
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Server{cfg: cfg, log: log, refused: make(chan struct{})}, nil
}

// SocketPath is where the registration socket lives.
func (s *Server) SocketPath() string {
	return filepath.Join(s.cfg.Dir, s.cfg.DriverName+"-reg.sock")
}

// Registered reports whether the kubelet said it registered the plugin, and
// its error if it refused.
func (s *Server) Registered() (bool, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.status == nil {
		return false, nil
	}
	if !s.status.PluginRegistered {
		return false, fmt.Errorf("%w: %s", ErrRefused, s.status.Error)
	}
	return true, nil
}

// Serve listens on SocketPath and serves until ctx ends, then removes the
// socket (which unregisters the plugin). If the kubelet refuses the plugin
// (its NodeGetInfo failed: the quiver API was not reachable yet, say), Serve
// returns ErrRefused: the kubelet asks again only for a new socket, so the
// process should exit and be restarted, as the registrar sidecar does.
func (s *Server) Serve(ctx context.Context) error {
	path := s.SocketPath()
	if err := os.MkdirAll(s.cfg.Dir, 0o750); err != nil {
		return fmt.Errorf("registration directory: %w", err)
	}
	// A socket left by an earlier run would make Listen fail; anything else
	// at that path is not ours to remove.
	if fi, err := os.Lstat(path); err == nil {
		if fi.Mode()&os.ModeSocket == 0 {
			return fmt.Errorf("%w: %s exists and is not a socket", ErrInvalid, path)
		}
		if err := os.Remove(path); err != nil {
			return fmt.Errorf("registration socket: %w", err)
		}
	}
	ln, err := net.Listen("unix", path)
	if err != nil {
		return fmt.Errorf("registration socket: %w", err)
	}
	defer os.Remove(path)
	srv := grpc.NewServer()
	registerapi.RegisterRegistrationServer(srv, &service{s: s})
	s.log.Info("serving kubelet plugin registration", "socket", path, "csi", s.cfg.Endpoint)
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	select {
	case err := <-errc:
		if errors.Is(err, grpc.ErrServerStopped) {
			return nil
		}
		return err
	case <-ctx.Done():
	case <-s.refused:
	}
	stopped := make(chan struct{})
	go func() { srv.GracefulStop(); close(stopped) }()
	select {
	case <-stopped:
	case <-time.After(5 * time.Second):
		srv.Stop()
	}
	if _, err := s.Registered(); err != nil {
		return err
	}
	return nil
}

type service struct {
	registerapi.UnimplementedRegistrationServer
	s *Server
}

// GetInfo answers the kubelet's first question: what plugin this is.
func (v *service) GetInfo(context.Context, *registerapi.InfoRequest) (*registerapi.PluginInfo, error) {
	return &registerapi.PluginInfo{
		Type:              registerapi.CSIPlugin,
		Name:              v.s.cfg.DriverName,
		Endpoint:          v.s.cfg.Endpoint,
		SupportedVersions: []string{"1.0.0"},
	}, nil
}

// NotifyRegistrationStatus records the kubelet's answer. A refusal is logged
// loudly: until it is fixed, no volume of this driver mounts on this node.
func (v *service) NotifyRegistrationStatus(_ context.Context, st *registerapi.RegistrationStatus) (*registerapi.RegistrationStatusResponse, error) {
	v.s.mu.Lock()
	v.s.status = st
	if !st.PluginRegistered {
		select {
		case <-v.s.refused:
		default:
			close(v.s.refused)
		}
	}
	v.s.mu.Unlock()
	if st.PluginRegistered {
		v.s.log.Info("registered with the kubelet", "driver", v.s.cfg.DriverName)
	} else {
		v.s.log.Error("the kubelet refused the plugin; stopping so that a restart registers it again",
			"driver", v.s.cfg.DriverName, "err", st.Error)
	}
	return &registerapi.RegistrationStatusResponse{}, nil
}
