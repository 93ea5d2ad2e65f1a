package csi

import (
	"context"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/quiverstorage/quiver/internal/client"
	"github.com/quiverstorage/quiver/internal/testserver"
)

// quiverBin is the server binary, built once by TestMain.
var quiverBin string

func TestMain(m *testing.M) { os.Exit(testserver.MainWithBinary(m, &quiverBin)) }

// server is one `quiver server` process on a temporary pool, with a bearer
// token: the API on a free loopback port, NBD on a unix socket.
type server struct {
	apiURL    string
	nbdSocket string
	token     string
	api       *client.Client
	pool      string // the pool directory
}

// startServer starts a server for the test; t.Cleanup stops it and fails
// the test if it did not exit cleanly.
func startServer(t *testing.T, args ...string) *server {
	t.Helper()
	const token = "sanity-token-0123456789"
	p := testserver.StartT(t, quiverBin, testserver.Options{Token: token, Args: args})
	return &server{apiURL: "http://" + p.APIAddr, nbdSocket: p.Socket, token: token, api: p.API, pool: p.Pool}
}

// shortTempDir is a temporary directory with a short path, for unix sockets
// (at most 108 bytes), removed when the test ends.
func shortTempDir(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "qcsi")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}

// plugin is an in-process CSI plugin on a unix socket, with gRPC clients.
type plugin struct {
	d        *Driver
	endpoint string
	conn     *grpc.ClientConn
	ctrl     csi.ControllerClient
	node     csi.NodeClient
	ident    csi.IdentityClient
	stateDir string
}

// startPlugin runs a plugin in all mode against s until the test ends. With
// withToken false it has no API token of its own.
func startPlugin(t *testing.T, s *server, nodeID string, withToken bool) *plugin {
	t.Helper()
	dir := shortTempDir(t)
	cfg := Config{
		Mode:     ModeAll,
		Endpoint: "unix://" + filepath.Join(dir, "csi.sock"),
		Server:   s.apiURL,
		NodeID:   nodeID,
		NBD:      "unix://" + s.nbdSocket,
		StateDir: filepath.Join(dir, "state"),
		Logger:   slog.New(slog.NewTextHandler(io.Discard, nil)),
	}
	if withToken {
		cfg.Token = s.token
	}
	if testing.Verbose() {
		cfg.Logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))
	}
	return servePlugin(t, cfg)
}

// servePlugin runs the plugin of cfg (its Endpoint a unix:// socket) until
// the test ends.
func servePlugin(t *testing.T, cfg Config) *plugin {
	t.Helper()
	sock := strings.TrimPrefix(cfg.Endpoint, "unix://")
	d, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- d.ServeListener(ctx, ln) }()
	conn, err := grpc.NewClient("unix://"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		conn.Close()
		cancel()
		if err := <-done; err != nil {
			t.Errorf("plugin: %v", err)
		}
	})
	return &plugin{d: d, endpoint: cfg.Endpoint, conn: conn, stateDir: cfg.StateDir,
		ctrl: csi.NewControllerClient(conn), node: csi.NewNodeClient(conn), ident: csi.NewIdentityClient(conn)}
}
