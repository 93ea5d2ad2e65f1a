package csi

import (
	"context"
	"errors"
	"fmt"
	"k8s.io/apimachinery/pkg/util/validation"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	"google.golang.org/grpc/status"

	"github.com/quiverstorage/quiver/internal/api"
	"github.com/quiverstorage/quiver/internal/client"
	addonsid "github.com/quiverstorage/quiver/internal/csiaddons/identity"
	"github.com/quiverstorage/quiver/internal/csiaddons/replication"
	"github.com/quiverstorage/quiver/internal/tlscert"
)

// DefaultDriverName is the CSI driver name (CSIDriver object, StorageClass
// provisioner).
const DefaultDriverName = "csi.quiver.io"

// TopologyPoolKey is the topology segment every node and volume carries: the
// ID of the quiver pool the node's plugin talks to. A volume is accessible
// from every node that reaches its pool.
const TopologyPoolKey = "topology.quiver.io/pool"

// SecretToken is the key of the quiver API bearer token in a request's
// secrets (a StorageClass's provisioner, snapshotter or attacher secret). It
// overrides the plugin's --token-file for that request.
const SecretToken = "quiverToken"

// Mode says which CSI services a plugin process runs.
type Mode string

// Modes of Config.Mode.
const (
	ModeController Mode = "controller"
	ModeNode       Mode = "node"
	ModeAll        Mode = "all"
)

func (m Mode) controller() bool { return m == ModeController || m == ModeAll }
func (m Mode) node() bool       { return m == ModeNode || m == ModeAll }

// Config is everything the plugin needs, parsed from flags by the CLI.
type Config struct {
	DriverName string // default DefaultDriverName
	Version    string // reported by GetPluginInfo
	Mode       Mode
	// Endpoint is the CSI socket: unix:///path/to/csi.sock.
	Endpoint string
	// Server is the quiver API URL (see client.New); Token its bearer
	// token ("" for none).
	Server string
	Token  string
	// CAFile, if set, holds the PEM CAs that an https:// Server's
	// certificate must chain to (the system's roots otherwise).
	CAFile string
	// CertFile and KeyFile, if set, are a PEM client certificate and key
	// presented to an https:// Server: a certificate mapped to a token
	// (quiver token create --cert) stands for that token, so a plugin in a
	// tenant cluster may hold a certificate instead of a token. It is
	// read again when its files change (a renewal). A request's secret
	// token is sent with it and must then be of the same role and tenant.
	CertFile, KeyFile string
	// NodeID names this node (node and all modes): the Kubernetes node
	// name in a cluster.
	NodeID string
	// NBD is the quiver NBD server as this node reaches it, for Block mode:
	// host:port, or unix:///path/to/nbd.sock.
	NBD string
	// StateDir keeps the node's publication records and the nbdfuse mount
	// points (node and all modes). It must survive plugin restarts.
	StateDir string
	// DeviceAgent, if set, is the unix socket of a device agent
	// (blockdev.Agent, `quiver device-agent`) that holds the Block-mode
	// devices, so that they outlive this plugin; empty: the plugin holds
	// them itself, and they end with its container.
	DeviceAgent string
	// QuiverEndpoint, if set, is the control socket of the compute node's
	// endpoint (`quiver endpoint`): every volume staged on the node is
	// published there and its disks reach QEMU through the endpoint's
	// socket, which follows the volume's primary (Filesystem mode binds the
	// socket's directory, Block mode's device is nbdfuse on the socket,
	// held by the endpoint). Required for Filesystem mode of a volume on a
	// cluster: binding one copy's files would bypass replication and
	// fencing.
	QuiverEndpoint string
	// PoolDir is where this node sees the pool directory, when not at the
	// path the server reports (a container mount, an NFS mount point);
	// empty means the same path.
	PoolDir string
	Logger  *slog.Logger
	// HTTPClient is used for the API (tests); nil means a client with a
	// 60 s timeout.
	HTTPClient *http.Client
}

// Driver is one plugin process: its services, its API client and the
// per-volume locks that turn concurrent operations into Aborted.
type Driver struct {
	cfg   Config
	log   *slog.Logger
	api   *client.Client
	locks *keyLocks
	// knownNode tells the controller whether a node ID exists (see
	// nodeRegistry).
	knownNode nodeRegistry
	node      *nodeService

	poolMu sync.Mutex
	pool   *api.PoolInfo // cached: the pool's ID and path never change
}

// New checks cfg and builds a Driver.
func New(cfg Config) (*Driver, error) {
	if cfg.DriverName == "" {
		cfg.DriverName = DefaultDriverName
	}
	if cfg.Version == "" {
		cfg.Version = "dev"
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.HTTPClient == nil {
		cfg.HTTPClient = &http.Client{Timeout: 60 * time.Second}
	}
	switch cfg.Mode {
	case ModeController, ModeNode, ModeAll:
	default:
		return nil, fmt.Errorf("mode %q: want controller, node or all", cfg.Mode)
	}
	if cfg.Mode.node() && cfg.NodeID == "" {
		return nil, errors.New("node ID is required in node and all modes (--node-id, usually the Kubernetes node name)")
	}
	if cfg.Mode.node() && cfg.StateDir == "" {
		return nil, errors.New("state directory is required in node and all modes (--state-dir)")
	}
	c, err := newClient(cfg, cfg.Token)
	if err != nil {
		return nil, err
	}
	d := &Driver{cfg: cfg, log: cfg.Logger, api: c, locks: newKeyLocks()}
	if cfg.Mode == ModeAll {
		d.knownNode = localNode(cfg.NodeID)
	} else {
		d.knownNode = anyNode{}
	}
	if cfg.Mode.node() {
		d.node, err = newNodeService(d)
		if err != nil {
			return nil, err
		}
	}
	return d, nil
}

func newClient(cfg Config, token string) (*client.Client, error) {
	opts := []client.Option{client.WithHTTPClient(cfg.HTTPClient)}
	if cfg.CAFile != "" || cfg.CertFile != "" || cfg.KeyFile != "" {
		tc, err := tlscert.ClientConfig(cfg.CAFile, cfg.CertFile, cfg.KeyFile)
		if err != nil {
			return nil, fmt.Errorf("quiver API: %w", err)
		}
		opts = append(opts, client.WithTLSConfig(tc))
	}
	if token != "" {
		opts = append(opts, client.WithToken(token))
	}
	c, err := client.New(cfg.Server, opts...)
	if err != nil {
		return nil, fmt.Errorf("quiver API: %w", err)
	}
	return c, nil
}

// clientFor returns the API client for a request: one with the token of
// its secrets when they carry one, else the plugin's own.
func (d *Driver) clientFor(secrets map[string]string) (*client.Client, error) {
	token, ok := secrets[SecretToken]
	if !ok {
		return d.api, nil
	}
	if strings.TrimSpace(token) == "" {
		return nil, fmt.Errorf("secret %s is empty: %w", SecretToken, ErrUnauthenticated)
	}
	return newClient(d.cfg, strings.TrimSpace(token))
}

// lockedClient returns the API client for a request (clientFor) and takes
// the lock of volume; call the returned function to release it.
func (d *Driver) lockedClient(secrets map[string]string, volume string) (*client.Client, func(), error) {
	qc, err := d.clientFor(secrets)
	if err != nil {
		return nil, nil, err
	}
	unlock, err := d.locks.tryLock(volume)
	if err != nil {
		return nil, nil, err
	}
	return qc, unlock, nil
}

// lockedVolume is lockedClient, then getVolume of the volume; call the
// returned function to release the lock.
func (d *Driver) lockedVolume(ctx context.Context, secrets map[string]string, volume string) (*client.Client, api.Volume, func(), error) {
	qc, unlock, err := d.lockedClient(secrets, volume)
	if err != nil {
		return nil, api.Volume{}, nil, err
	}
	v, err := getVolume(ctx, qc, volume)
	if err != nil {
		unlock()
		return nil, api.Volume{}, nil, err
	}
	return qc, v, unlock, nil
}

// ownVolumes lists the volumes this plugin made (label LabelDriver).
func (d *Driver) ownVolumes(ctx context.Context, qc *client.Client) ([]api.Volume, error) {
	vols, err := qc.ListVolumes(ctx, LabelDriver+"="+d.cfg.DriverName)
	if err != nil {
		return nil, fmt.Errorf("list volumes: %w", err)
	}
	return vols, nil
}

// getVolume looks a volume up; an unknown one is ErrNotFound.
func getVolume(ctx context.Context, qc *client.Client, name string) (api.Volume, error) {
	v, err := qc.GetVolume(ctx, name)
	if client.IsNotFound(err) {
		return v, fmt.Errorf("volume %s: %w", name, ErrNotFound)
	} else if err != nil {
		return v, fmt.Errorf("look up volume %s: %w", name, err)
	}
	return v, nil
}

// maxVolumeName returns the longest volume name the client's token may
// create: shorter than 63 for a tenant's token, whose volumes the server
// names <tenant>--<name> (docs/security.md). A server without tenants
// (no /v1/whoami) allows 63.
func (d *Driver) maxVolumeName(ctx context.Context, c *client.Client) (int, error) {
	w, err := c.WhoAmI(ctx)
	if client.IsNotFound(err) {
		return validation.DNS1123LabelMaxLength, nil
	}
	if err != nil {
		return 0, fmt.Errorf("quiver whoami: %w", err)
	}
	return w.MaxVolumeName, nil
}

// poolInfo returns the pool's identity, asked once.
func (d *Driver) poolInfo(ctx context.Context, c *client.Client) (api.PoolInfo, error) {
	d.poolMu.Lock()
	defer d.poolMu.Unlock()
	if d.pool != nil {
		return *d.pool, nil
	}
	info, err := c.Pool(ctx)
	if err != nil {
		return info, fmt.Errorf("quiver pool: %w", err)
	}
	d.pool = &info
	return info, nil
}

// topology is the segment of the pool this plugin serves.
func (d *Driver) topology(ctx context.Context, c *client.Client) (*csi.Topology, error) {
	info, err := d.poolInfo(ctx, c)
	if err != nil {
		return nil, err
	}
	return &csi.Topology{Segments: map[string]string{TopologyPoolKey: info.ID}}, nil
}

// Serve listens on the configured endpoint and serves until ctx ends, then
// stops gracefully.
func (d *Driver) Serve(ctx context.Context) error {
	path, err := SocketPath(d.cfg.Endpoint)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return fmt.Errorf("endpoint %s: %w", d.cfg.Endpoint, err)
	}
	// A socket left by a previous run would make Listen fail.
	if fi, err := os.Lstat(path); err == nil && fi.Mode()&os.ModeSocket != 0 {
		_ = os.Remove(path)
	}
	ln, err := net.Listen("unix", path)
	if err != nil {
		return fmt.Errorf("endpoint %s: %w", d.cfg.Endpoint, err)
	}
	return d.ServeListener(ctx, ln)
}

// ServeListener serves the plugin's services on ln until ctx ends.
func (d *Driver) ServeListener(ctx context.Context, ln net.Listener) error {
	srv := grpc.NewServer(grpc.UnaryInterceptor(d.intercept), grpc.StreamInterceptor(d.interceptStream))
	csi.RegisterIdentityServer(srv, &identity{d: d})
	addonsid.RegisterIdentityServer(srv, &addonsIdentity{d: d})
	if d.cfg.Mode.controller() {
		csi.RegisterControllerServer(srv, &controller{d: d})
		csi.RegisterSnapshotMetadataServer(srv, &snapshotMetadata{d: d})
		replication.RegisterControllerServer(srv, &replicationController{d: d})
	}
	if d.cfg.Mode.node() {
		csi.RegisterNodeServer(srv, d.node)
	}
	d.log.Info("serving CSI", "endpoint", ln.Addr().String(), "mode", string(d.cfg.Mode), "driver", d.cfg.DriverName,
		"node", d.cfg.NodeID)
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	stopped := make(chan struct{})
	go func() { srv.GracefulStop(); close(stopped) }()
	select {
	case <-stopped:
	case <-time.After(10 * time.Second):
		srv.Stop()
	}
	return nil
}

// intercept maps every RPC's error to its gRPC status (toStatus, the one
// mapping) and logs the call: method, code, duration. Requests are never
// logged: they carry secrets and tokens.
func (d *Driver) intercept(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	start := time.Now()
	resp, err := handler(ctx, req)
	err = toStatus(err)
	code := status.Code(err)
	if err != nil {
		d.log.Info("csi call failed", "op", info.FullMethod, "code", code.String(), "err", status.Convert(err).Message(),
			"duration", time.Since(start))
		return nil, err
	}
	d.log.Debug("csi call", "op", info.FullMethod, "duration", time.Since(start))
	return resp, nil
}

// interceptStream is intercept for the streaming RPCs (SnapshotMetadata):
// the error that ends a stream gets its gRPC status from toStatus.
func (d *Driver) interceptStream(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
	start := time.Now()
	err := toStatus(handler(srv, ss))
	if err != nil {
		d.log.Info("csi call failed", "op", info.FullMethod, "code", status.Code(err).String(),
			"err", status.Convert(err).Message(), "duration", time.Since(start))
		return err
	}
	d.log.Debug("csi call", "op", info.FullMethod, "duration", time.Since(start))
	return nil
}

// SocketPath is the path of a CSI endpoint. It accepts unix:///path, unix:/path or a bare absolute path.
func SocketPath(endpoint string) (string, error) {
	if strings.HasPrefix(endpoint, "/") {
		return endpoint, nil
	}
	u, err := url.Parse(endpoint)
	if err != nil || u.Scheme != "unix" || u.Host != "" || u.Path == "" {
		return "", fmt.Errorf("endpoint %q: want unix:///path/to/csi.sock", endpoint)
	}
	return u.Path, nil
}

// nodeRegistry tells the controller whether a node ID names a node. quiver
// has no node registry of its own yet: in all mode (one host, controller and
// node in one process) the only node is this one; in controller mode every
// node ID is taken as existing, since the Kubernetes external-attacher only
// publishes to node IDs that node plugins reported (CSINode objects).
type nodeRegistry interface {
	exists(id string) bool
}

type localNode string

func (n localNode) exists(id string) bool { return id == string(n) }

type anyNode struct{}

func (anyNode) exists(string) bool { return true }

// keyLocks is a set of try-locks, one per volume name: a second operation
// on a volume while one runs gets ErrBusy (Aborted), as the CSI spec asks.
type keyLocks struct {
	mu   sync.Mutex
	held map[string]bool
}

func newKeyLocks() *keyLocks { return &keyLocks{held: map[string]bool{}} }

// tryLock takes the lock of key or fails with ErrBusy; call the returned
// function to release it.
func (l *keyLocks) tryLock(key string) (func(), error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.held[key] {
		return nil, fmt.Errorf("volume %s: %w; retry later", key, ErrBusy)
	}
	l.held[key] = true
	return func() {
		l.mu.Lock()
		delete(l.held, key)
		l.mu.Unlock()
	}, nil
}
