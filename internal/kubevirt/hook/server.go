package hook

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/quiverstorage/quiver/internal/kubevirt"
	"github.com/quiverstorage/quiver/internal/kubevirt/hookapi/info"
	"github.com/quiverstorage/quiver/internal/kubevirt/hookapi/v1alpha2"
	"github.com/quiverstorage/quiver/internal/kubevirt/hookapi/v1alpha3"
)

// Name is the hook's name in its Info answer.
const Name = "quiver-disks"

// SocketDir is where virt-launcher looks for hook sockets (each sidecar's
// directory is a subdirectory there on the launcher's side).
const SocketDir = "/var/run/kubevirt-hooks"

// OnDefineDomainHookPoint is the hook point the sidecar subscribes to.
const OnDefineDomainHookPoint = "OnDefineDomain"

// Versions are the Callbacks versions served, newest first (virt-launcher
// takes the newest it knows).
var Versions = []string{"v1alpha3", "v1alpha2"}

// Config configures a Server.
type Config struct {
	// Socket is the unix socket to serve on.
	Socket  string
	Options Options
	Logger  *slog.Logger
}

// Server serves the hook's gRPC services.
type Server struct {
	cfg      Config
	grpc     *grpc.Server
	listener net.Listener
}

// NewServer builds a Server with Info and both Callbacks versions
// registered.
func NewServer(cfg Config) *Server {
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	s := &Server{cfg: cfg, grpc: grpc.NewServer()}
	info.RegisterInfoServer(s.grpc, infoServer{})
	v1alpha3.RegisterCallbacksServer(s.grpc, v1alpha3Server{s: s})
	v1alpha2.RegisterCallbacksServer(s.grpc, v1alpha2Server{s: s})
	return s
}

// Listen creates the socket (replacing a stale one); once it returns,
// clients can connect.
func (s *Server) Listen() error {
	if err := os.MkdirAll(filepath.Dir(s.cfg.Socket), 0o755); err != nil {
		return fmt.Errorf("hook socket directory: %w", err)
	}
	if err := os.Remove(s.cfg.Socket); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("stale hook socket: %w", err)
	}
	l, err := net.Listen("unix", s.cfg.Socket)
	if err != nil {
		return fmt.Errorf("hook socket: %w", err)
	}
	s.listener = l
	return nil
}

// Serve serves on the socket (calling Listen first if needed) until ctx
// ends; the socket is removed on return.
func (s *Server) Serve(ctx context.Context) error {
	if s.listener == nil {
		if err := s.Listen(); err != nil {
			return err
		}
	}
	l := s.listener
	defer os.Remove(s.cfg.Socket)
	s.cfg.Logger.Info("serving KubeVirt hook", "socket", s.cfg.Socket, "volume", s.cfg.Options.Volume)
	stop := context.AfterFunc(ctx, s.grpc.GracefulStop)
	defer stop()
	if err := s.grpc.Serve(l); err != nil {
		return fmt.Errorf("hook: %w", err)
	}
	return nil
}

// onDefineDomain is the work of OnDefineDomain in every version.
func (s *Server) onDefineDomain(domainXML, vmiJSON []byte) ([]byte, error) {
	vmi, err := kubevirt.DecodeVMI(vmiJSON)
	if err != nil {
		return nil, toStatus(err)
	}
	log := s.cfg.Logger.With("vmi", vmi.Metadata.Namespace+"/"+vmi.Metadata.Name)
	out, err := AddDisks(domainXML, vmi, s.cfg.Options)
	if err != nil {
		log.Error("OnDefineDomain refused", "err", err)
		return nil, toStatus(err)
	}
	log.Info("OnDefineDomain", "changed", len(out) != len(domainXML))
	return out, nil
}

// toStatus maps the integration's errors to gRPC codes: the one mapping at
// this boundary. virt-launcher fails the VM on any error; the message names
// the cause.
func toStatus(err error) error {
	code := codes.Internal
	switch {
	case errors.Is(err, kubevirt.ErrInvalid), errors.Is(err, kubevirt.ErrDuplicate):
		code = codes.InvalidArgument
	case errors.Is(err, kubevirt.ErrMissingDisk):
		code = codes.NotFound
	case errors.Is(err, kubevirt.ErrUnsupported):
		code = codes.FailedPrecondition
	}
	return status.Error(code, err.Error())
}

type infoServer struct {
	info.UnimplementedInfoServer
}

func (infoServer) Info(context.Context, *info.InfoParams) (*info.InfoResult, error) {
	return &info.InfoResult{
		Name:       Name,
		Versions:   Versions,
		HookPoints: []*info.HookPoint{{Name: OnDefineDomainHookPoint, Priority: 0}},
	}, nil
}

type v1alpha3Server struct {
	v1alpha3.UnimplementedCallbacksServer
	s *Server
}

func (v v1alpha3Server) OnDefineDomain(_ context.Context, p *v1alpha3.OnDefineDomainParams) (*v1alpha3.OnDefineDomainResult, error) {
	out, err := v.s.onDefineDomain(p.GetDomainXML(), p.GetVmi())
	if err != nil {
		return nil, err
	}
	return &v1alpha3.OnDefineDomainResult{DomainXML: out}, nil
}

// PreCloudInitIso is not subscribed to; should it be called, the cloud-init
// data goes back unchanged.
func (v1alpha3Server) PreCloudInitIso(_ context.Context, p *v1alpha3.PreCloudInitIsoParams) (*v1alpha3.PreCloudInitIsoResult, error) {
	return &v1alpha3.PreCloudInitIsoResult{CloudInitNoCloudSource: p.GetCloudInitNoCloudSource(), CloudInitData: p.GetCloudInitData()}, nil
}

// Shutdown has nothing to release.
func (v1alpha3Server) Shutdown(context.Context, *v1alpha3.ShutdownParams) (*v1alpha3.ShutdownResult, error) {
	return &v1alpha3.ShutdownResult{}, nil
}

type v1alpha2Server struct {
	v1alpha2.UnimplementedCallbacksServer
	s *Server
}

func (v v1alpha2Server) OnDefineDomain(_ context.Context, p *v1alpha2.OnDefineDomainParams) (*v1alpha2.OnDefineDomainResult, error) {
	out, err := v.s.onDefineDomain(p.GetDomainXML(), p.GetVmi())
	if err != nil {
		return nil, err
	}
	return &v1alpha2.OnDefineDomainResult{DomainXML: out}, nil
}

func (v1alpha2Server) PreCloudInitIso(_ context.Context, p *v1alpha2.PreCloudInitIsoParams) (*v1alpha2.PreCloudInitIsoResult, error) {
	return &v1alpha2.PreCloudInitIsoResult{CloudInitNoCloudSource: p.GetCloudInitNoCloudSource(), CloudInitData: p.GetCloudInitData()}, nil
}
