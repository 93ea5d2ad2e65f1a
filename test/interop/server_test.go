package interop

import (
	"context"
	"fmt"
	"github.com/quiverstorage/quiver/internal/testserver"
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
// and NBD on free loopback ports and NBD on a unix socket.
type server struct {
	api     *client.Client
	nbdAddr string // host:port of the NBD TCP listener
	socket  string // path of the NBD unix socket
	pool    string // pool directory

	cmd    *exec.Cmd
	log    *testserver.LogBuffer
	exited chan struct{} // closed once the process is reaped
	werr   error         // cmd.Wait's error, set before exited is closed
}

// startServer starts a server for the test; t.Cleanup stops it with SIGTERM
// and fails the test if it does not exit cleanly or its log holds a data
// race or a panic.
func startServer(t *testing.T) *server {
	t.Helper()
	pool := t.TempDir()
	// A unix socket path must fit in 108 bytes: t.TempDir() paths, which
	// carry the test name, may not.
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
		err = s.waitReady(t.Context())
		if err == nil {
			t.Cleanup(func() { s.stop(t) })
			return s
		}
		s.kill()
		// Another process may have taken a port between our probe and the
		// server's listen.
		if attempt < 5 && strings.Contains(s.log.String(), "address already in use") {
			continue
		}
		t.Fatalf("quiver server: %v\nlog:\n%s", err, s.log.String())
	}
}

func spawn(pool, socket string) (*server, error) {
	apiAddr, err := testserver.FreePort()
	if err != nil {
		return nil, err
	}
	nbdAddr, err := testserver.FreePort()
	if err != nil {
		return nil, err
	}
	s := &server{nbdAddr: nbdAddr, socket: socket, pool: pool, log: &testserver.LogBuffer{}, exited: make(chan struct{})}
	s.cmd = exec.Command(quiverBin, "server", "--pool", pool, "--listen", apiAddr,
		"--nbd-listen", nbdAddr, "--nbd-socket", socket, "--log-level", "debug")
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
	s.api, err = client.New("http://"+apiAddr, client.WithHTTPClient(hc))
	if err != nil {
		s.kill()
		return nil, err
	}
	return s, nil
}

// waitReady polls GET /v1/pool. The NBD listeners are bound before the API
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

// stop ends the server with SIGTERM, which drains and flushes every NBD
// connection, and checks that it exited by itself with status 0.
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
		t.Logf("server log:\n%s", tail(log, 200))
	}
}

// tail returns the last n lines of s.
func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = append([]string{fmt.Sprintf("[%d lines before]", len(lines)-n)}, lines[len(lines)-n:]...)
	}
	return strings.Join(lines, "\n")
}

// createVolume creates a volume with the given disks (name, size pairs in
// order) and a capacity that fits them.
func (s *server) createVolume(t *testing.T, name string, disks ...api.DiskSpec) api.Volume {
	t.Helper()
	var total int64
	for _, d := range disks {
		total += d.Size
	}
	v, err := s.api.CreateVolume(t.Context(), api.VolumeSpec{Name: name, Capacity: total, Disks: disks})
	if err != nil {
		t.Fatalf("create volume %s: %v", name, err)
	}
	return v
}

// snapshot takes a snapshot of a volume through the API.
func (s *server) snapshot(t *testing.T, volume, name string) api.Snapshot {
	t.Helper()
	snap, err := s.api.CreateSnapshot(t.Context(), volume, name)
	if err != nil {
		t.Fatalf("snapshot %s@%s: %v", volume, name, err)
	}
	return snap
}

// diskPath returns the image file of a disk as the API reports it.
func diskPath(t *testing.T, disks []api.Disk, name string) string {
	t.Helper()
	for _, d := range disks {
		if d.Name == name {
			return d.Path
		}
	}
	t.Fatalf("no disk %q in %+v", name, disks)
	return ""
}

// uri is the NBD URI of an export over TCP: nbd://host:port/<export>.
func (s *server) uri(export string) string { return "nbd://" + s.nbdAddr + "/" + export }

// unixURI is the NBD URI of an export over the unix socket.
func (s *server) unixURI(export string) string {
	return "nbd+unix:///" + export + "?socket=" + s.socket
}

func disk(name string, size int64) api.DiskSpec { return api.DiskSpec{Name: name, Size: size} }

const (
	kiB = int64(1) << 10
	miB = int64(1) << 20
	giB = int64(1) << 30
)
