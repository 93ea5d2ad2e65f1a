package pluginreg

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"
)

// kubelet dials the registration socket as the kubelet's plugin watcher does.
func kubelet(t *testing.T, path string) registerapi.RegistrationClient {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		if fi, err := os.Lstat(path); err == nil && fi.Mode()&os.ModeSocket != 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no registration socket at %s", path)
		}
		time.Sleep(10 * time.Millisecond)
	}
	cc, err := grpc.NewClient("unix://"+path, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	return registerapi.NewRegistrationClient(cc)
}

// serve runs s.Serve until the test ends or stop is called; stop returns
// Serve's error.
func serve(t *testing.T, cfg Config) (s *Server, stop func() error) {
	t.Helper()
	s, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	var serveErr error
	go func() { serveErr = s.Serve(ctx); close(done) }()
	stop = func() error { cancel(); <-done; return serveErr }
	t.Cleanup(func() { stop() })
	return s, stop
}

func TestRegistration(t *testing.T) {
	dir := t.TempDir()
	cfg := Config{Dir: dir, DriverName: "csi.quiver.io", Endpoint: "/var/lib/kubelet/plugins/csi.quiver.io/csi.sock"}
	s, stop := serve(t, cfg)
	path := filepath.Join(dir, "csi.quiver.io-reg.sock")
	if s.SocketPath() != path {
		t.Fatalf("socket %s, want %s", s.SocketPath(), path)
	}
	c := kubelet(t, path)
	ctx := context.Background()
	info, err := c.GetInfo(ctx, &registerapi.InfoRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if info.Type != registerapi.CSIPlugin || info.Name != cfg.DriverName || info.Endpoint != cfg.Endpoint ||
		len(info.SupportedVersions) != 1 || info.SupportedVersions[0] != "1.0.0" {
		t.Fatalf("GetInfo = %+v", info)
	}
	if ok, err := s.Registered(); ok || err != nil {
		t.Fatalf("before the kubelet's answer: Registered() = %v, %v", ok, err)
	}
	if _, err := c.NotifyRegistrationStatus(ctx, &registerapi.RegistrationStatus{PluginRegistered: true}); err != nil {
		t.Fatal(err)
	}
	if ok, err := s.Registered(); !ok || err != nil {
		t.Fatalf("after registration: Registered() = %v, %v", ok, err)
	}
	// Stopping removes the socket: that is how the kubelet learns the plugin is gone.
	if err := stop(); err != nil {
		t.Fatalf("Serve: %v", err)
	}
	if _, err := os.Lstat(path); !os.IsNotExist(err) {
		t.Fatalf("socket left after stop: %v", err)
	}
}

// A refusal ends Serve with ErrRefused and removes the socket: the kubelet
// asks again only for a new socket, so the process must restart.
func TestRefusalEndsServe(t *testing.T) {
	dir := t.TempDir()
	cfg := Config{Dir: dir, DriverName: "csi.quiver.io", Endpoint: "/csi/csi.sock"}
	s, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- s.Serve(context.Background()) }()
	c := kubelet(t, s.SocketPath())
	if _, err := c.NotifyRegistrationStatus(context.Background(), &registerapi.RegistrationStatus{PluginRegistered: false,
		Error: "NodeGetInfo: deadline exceeded"}); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if !errors.Is(err, ErrRefused) {
			t.Fatalf("Serve after a refusal = %v, want ErrRefused", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Serve goes on after the kubelet refused the plugin")
	}
	if ok, err := s.Registered(); ok || !errors.Is(err, ErrRefused) {
		t.Fatalf("after a refusal: Registered() = %v, %v; want ErrRefused", ok, err)
	}
	if _, err := os.Lstat(s.SocketPath()); !os.IsNotExist(err) {
		t.Fatalf("socket left after a refusal: %v", err)
	}
}

// A socket left by a crashed run is replaced; a file that is not a socket is
// refused and left alone.
func TestStaleSocketAndForeignFile(t *testing.T) {
	dir := t.TempDir()
	cfg := Config{Dir: dir, DriverName: "csi.quiver.io", Endpoint: "/csi/csi.sock"}
	path := filepath.Join(dir, "csi.quiver.io-reg.sock")

	// A stale socket: listen, then leave the file behind.
	// A stale socket file, as a crashed run leaves it.
	ln, err := listenUnix(path)
	if err != nil {
		t.Fatal(err)
	}
	ln.SetUnlinkOnClose(false)
	ln.Close()
	serve(t, cfg)
	c := kubelet(t, path)
	if _, err := c.GetInfo(context.Background(), &registerapi.InfoRequest{}); err != nil {
		t.Fatalf("over a stale socket: %v", err)
	}

	other := Config{Dir: dir, DriverName: "other.example.com", Endpoint: "/csi/csi.sock"}
	foreign := filepath.Join(dir, "other.example.com-reg.sock")
	if err := os.WriteFile(foreign, []byte("not a socket"), 0o600); err != nil {
		t.Fatal(err)
	}
	s, err := New(other)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Serve(context.Background()); !errors.Is(err, ErrInvalid) {
		t.Fatalf("Serve over a regular file: %v, want ErrInvalid", err)
	}
	if b, err := os.ReadFile(foreign); err != nil || string(b) != "not a socket" {
		t.Fatalf("the foreign file was changed: %q, %v", b, err)
	}
}

func TestBadConfig(t *testing.T) {
	for _, cfg := range []Config{
		{Dir: "relative", DriverName: "d", Endpoint: "/csi.sock"},
		{Dir: "/r", DriverName: "", Endpoint: "/csi.sock"},
		{Dir: "/r", DriverName: "../x", Endpoint: "/csi.sock"},
		{Dir: "/r", DriverName: "a/b", Endpoint: "/csi.sock"},
		{Dir: "/r", DriverName: "..", Endpoint: "/csi.sock"},
		{Dir: "/r", DriverName: "d", Endpoint: "csi.sock"},
		{Dir: "/r", DriverName: "d", Endpoint: ""},
	} {
		if _, err := New(cfg); !errors.Is(err, ErrInvalid) {
			t.Errorf("New(%+v) = %v, want ErrInvalid", cfg, err)
		}
	}
}
