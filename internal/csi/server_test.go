package csi

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/quiverstorage/quiver/internal/client"
	"github.com/quiverstorage/quiver/internal/testserver"
)

// The quiver binary, built once per test binary by the first test that
// needs a server.
var (
	buildOnce sync.Once
	quiverBin string
	buildErr  error
)

func quiverBinary(t *testing.T) string {
	t.Helper()
	buildOnce.Do(func() {
		dir, err := os.MkdirTemp("", "quiver-csi-bin-")
		if err != nil {
			buildErr = err
			return
		}
		quiverBin = filepath.Join(dir, "quiver")
		buildErr = testserver.Build(quiverBin, testserver.RaceEnabled)
	})
	if buildErr != nil {
		t.Fatalf("build quiver: %v", buildErr)
	}
	return quiverBin
}

// server is one `quiver server` process on a temporary pool: the API on a
// free loopback port, NBD on a unix socket.
type server struct {
	apiURL    string
	nbdSocket string
	token     string
	pool      string
	api       *client.Client

	cmd    *exec.Cmd
	log    *testserver.LogBuffer
	exited chan struct{}
	werr   error
}

// startServer starts a server with a bearer token; t.Cleanup stops it and
// fails the test if it did not exit cleanly.
func startServer(t *testing.T) *server {
	t.Helper()
	bin := quiverBinary(t)
	dir := shortTempDir(t)
	pool := t.TempDir()
	tokenFile := filepath.Join(dir, "token")
	const token = "sanity-token-0123456789"
	if err := os.WriteFile(tokenFile, []byte(token+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for attempt := 0; ; attempt++ {
		addr, err := testserver.FreePort()
		if err != nil {
			t.Fatal(err)
		}
		s := &server{apiURL: "http://" + addr, nbdSocket: filepath.Join(dir, "nbd.sock"), token: token, pool: pool,
			log: &testserver.LogBuffer{}, exited: make(chan struct{})}
		s.cmd = exec.Command(bin, "server", "--pool", pool, "--listen", addr, "--token-file", tokenFile,
			"--nbd-listen=", "--nbd-socket", s.nbdSocket)
		s.cmd.Stdout, s.cmd.Stderr = s.log, s.log
		if err := s.cmd.Start(); err != nil {
			t.Fatalf("start quiver server: %v", err)
		}
		go func() { s.werr = s.cmd.Wait(); close(s.exited) }()
		s.api, err = client.New(s.apiURL, client.WithToken(token), client.WithHTTPClient(&http.Client{Timeout: 30 * time.Second}))
		if err != nil {
			t.Fatal(err)
		}
		if err = s.waitReady(t.Context()); err == nil {
			t.Cleanup(func() { s.stop(t) })
			return s
		}
		_ = s.cmd.Process.Kill()
		<-s.exited
		if attempt < 5 && strings.Contains(s.log.String(), "address already in use") {
			continue
		}
		t.Fatalf("quiver server: %v\nlog:\n%s", err, s.log.String())
	}
}

func (s *server) waitReady(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	for {
		_, err := s.api.Pool(ctx)
		if err == nil {
			return nil
		}
		select {
		case <-s.exited:
			return fmt.Errorf("server exited before it was ready: %v", s.werr)
		case <-ctx.Done():
			return fmt.Errorf("server not ready: %w (last error: %v)", ctx.Err(), err)
		case <-time.After(10 * time.Millisecond):
		}
	}
}

func (s *server) stop(t *testing.T) {
	_ = s.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-s.exited:
		if s.werr != nil {
			t.Errorf("quiver server did not exit cleanly on SIGTERM: %v", s.werr)
		}
	case <-time.After(20 * time.Second):
		_ = s.cmd.Process.Kill()
		<-s.exited
		t.Errorf("quiver server did not exit within 20 s of SIGTERM")
	}
	for _, bad := range []string{"WARNING: DATA RACE", "panic:", "fatal error:"} {
		if strings.Contains(s.log.String(), bad) {
			t.Errorf("server log contains %q", bad)
		}
	}
	if t.Failed() {
		t.Logf("server log:\n%s", s.log.String())
	}
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
	d, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("unix", filepath.Join(dir, "csi.sock"))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- d.ServeListener(ctx, ln) }()
	conn, err := grpc.NewClient("unix://"+filepath.Join(dir, "csi.sock"), grpc.WithTransportCredentials(insecure.NewCredentials()))
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
