package qosbench

import (
	"context"
	"fmt"
	"github.com/quiverstorage/quiver/internal/testserver"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/quiverstorage/quiver/internal/api"
	"github.com/quiverstorage/quiver/internal/client"
)

// server is one `quiver server` process on a temporary pool, serving the API
// on a free loopback port and NBD on a unix socket only.
type server struct {
	api    *client.Client
	apiURL string
	socket string

	cmd    *exec.Cmd
	log    *testserver.LogBuffer
	exited chan struct{} // closed once the process is reaped
	werr   error         // cmd.Wait's error, set before exited is closed
}

// startServer starts a server for the test; t.Cleanup stops it with SIGTERM
// and fails the test if it does not exit cleanly or logged a data race or a
// panic.
func startServer(t *testing.T) *server {
	t.Helper()
	pool := t.TempDir()
	// A unix socket path must fit in 108 bytes, which t.TempDir() paths,
	// named after the test, may not.
	sockDir, err := os.MkdirTemp("", "qv")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(sockDir) })
	socket := filepath.Join(sockDir, "nbd.sock")
	for attempt := 0; ; attempt++ {
		s, err := spawn(pool, socket)
		if err != nil {
			t.Fatalf("start quiver server: %v", err)
		}
		if err = s.waitReady(t.Context()); err == nil {
			t.Cleanup(func() { s.stop(t) })
			return s
		}
		s.kill()
		// Another process may have taken the port between our probe and
		// the server's listen.
		if attempt < 5 && strings.Contains(s.log.String(), "address already in use") {
			continue
		}
		t.Fatalf("quiver server: %v\nlog:\n%s", err, s.log.String())
	}
}

func spawn(pool, socket string) (*server, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	addr := ln.Addr().String()
	ln.Close()
	s := &server{apiURL: "http://" + addr, socket: socket, log: &testserver.LogBuffer{}, exited: make(chan struct{})}
	s.cmd = exec.Command(quiverBin, "server", "--pool", pool, "--listen", addr,
		"--nbd-listen=", "--nbd-socket", socket, "--log-level", "info")
	s.cmd.Stdout = s.log
	s.cmd.Stderr = s.log
	if err := s.cmd.Start(); err != nil {
		return nil, err
	}
	go func() {
		s.werr = s.cmd.Wait()
		close(s.exited)
	}()
	hc := &http.Client{Transport: http.DefaultTransport.(*http.Transport).Clone(), Timeout: 30 * time.Second}
	s.api, err = client.New(s.apiURL, client.WithHTTPClient(hc))
	if err != nil {
		s.kill()
		return nil, err
	}
	return s, nil
}

// waitReady polls GET /v1/pool. The NBD socket is bound before the API
// serves, so an answer means NBD accepts connections too.
func (s *server) waitReady(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	for {
		rctx, rcancel := context.WithTimeout(ctx, time.Second)
		_, err := s.api.Pool(rctx)
		rcancel()
		if err == nil {
			return nil
		}
		select {
		case <-s.exited:
			return fmt.Errorf("server exited before it was ready: %v", s.werr)
		case <-ctx.Done():
			return fmt.Errorf("server not ready: %w (last error: %v)", ctx.Err(), err)
		case <-time.After(5 * time.Millisecond):
		}
	}
}

func (s *server) kill() {
	_ = s.cmd.Process.Kill()
	<-s.exited
}

// stop ends the server with SIGTERM and checks it exited by itself with
// status 0 and without a race report or a panic in its log.
func (s *server) stop(t *testing.T) {
	_ = s.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-s.exited:
		if s.werr != nil {
			t.Errorf("quiver server did not exit cleanly on SIGTERM: %v", s.werr)
		}
	case <-time.After(20 * time.Second):
		s.kill()
		t.Errorf("quiver server did not exit within 20 s of SIGTERM")
	}
	log := s.log.String()
	for _, bad := range []string{"WARNING: DATA RACE", "panic:", "fatal error:"} {
		if strings.Contains(log, bad) {
			t.Errorf("server log contains %q", bad)
		}
	}
	if t.Failed() {
		t.Logf("server log:\n%s", log)
	}
}

// createVolume creates a volume of the given disks, with limits q (nil:
// unlimited) and a capacity that fits the disks.
func (s *server) createVolume(t *testing.T, name string, q *api.QoS, disks ...api.DiskSpec) api.Volume {
	t.Helper()
	var total int64
	for _, d := range disks {
		total += d.Size
	}
	v, err := s.api.CreateVolume(t.Context(), api.VolumeSpec{Name: name, Capacity: total, Disks: disks, QoS: q})
	if err != nil {
		t.Fatalf("create volume %s: %v", name, err)
	}
	return v
}

// setQoS replaces a volume's limits and returns when the server answered.
func (s *server) setQoS(t *testing.T, volume string, q api.QoS) time.Time {
	t.Helper()
	if _, err := s.api.UpdateVolume(t.Context(), volume, api.VolumeUpdate{QoS: &q}); err != nil {
		t.Fatalf("set qos of %s: %v", volume, err)
	}
	return time.Now()
}

// scrape reads /metrics.
func (s *server) scrape(t *testing.T) client.Metrics {
	t.Helper()
	m, err := s.api.Metrics(t.Context())
	if err != nil {
		t.Fatalf("scrape: %v", err)
	}
	return m
}

// uri is the NBD URI of a disk over the unix socket.
func (s *server) uri(volume, disk string) string {
	return "nbd+unix:///" + volume + "/" + disk + "?socket=" + s.socket
}

func disk(name string, size int64) api.DiskSpec { return api.DiskSpec{Name: name, Size: size} }

const (
	kiB = int64(1) << 10
	miB = int64(1) << 20
)
