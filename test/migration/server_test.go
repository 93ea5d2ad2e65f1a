package migration

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/quiverstorage/quiver/internal/api"
	"github.com/quiverstorage/quiver/internal/client"
	"github.com/quiverstorage/quiver/internal/testfs"
	"github.com/quiverstorage/quiver/internal/testserver"
)

// server is one `quiver server` on a temporary pool: the API on a free
// loopback port, NBD on a unix socket only, tokens required.
type server struct {
	api    *client.Client
	socket string
	cmd    *exec.Cmd
	log    *testserver.LogBuffer
	exited chan struct{}
	werr   error
}

// startServer starts quiver for the test; t.Cleanup stops it with SIGTERM
// and fails the test unless it exits cleanly with no race or panic in its
// log.
func startServer(t *testing.T, ctx context.Context, sockDir string) *server {
	t.Helper()
	pool := t.TempDir()
	for attempt := 0; ; attempt++ {
		s, err := spawnServer(pool, filepath.Join(sockDir, "nbd.sock"))
		if err != nil {
			t.Fatalf("start quiver server: %v", err)
		}
		if err = s.waitReady(ctx); err == nil {
			t.Cleanup(func() { s.stop(t) })
			return s
		}
		s.kill()
		if attempt < 5 && strings.Contains(s.log.String(), "address already in use") {
			continue // another process took the port we probed
		}
		t.Fatalf("quiver server: %v\nlog:\n%s", err, tail(s.log.String(), 50))
	}
}

func spawnServer(pool, socket string) (*server, error) {
	apiAddr, err := testserver.FreePort()
	if err != nil {
		return nil, err
	}
	_ = os.Remove(socket)
	s := &server{socket: socket, log: &testserver.LogBuffer{}, exited: make(chan struct{})}
	// Every NBD client of the test presents an attachment token: no
	// connection can slip in through an implicit attachment.
	s.cmd = exec.Command(quiverBin, "server", "--pool", pool, "--listen", apiAddr,
		"--nbd-listen", "", "--nbd-socket", socket, "--nbd-require-token")
	s.cmd.Stdout = s.log
	s.cmd.Stderr = s.log
	s.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := s.cmd.Start(); err != nil {
		return nil, err
	}
	go func() {
		s.werr = s.cmd.Wait()
		close(s.exited)
	}()
	hc := &http.Client{Transport: http.DefaultTransport.(*http.Transport).Clone(), Timeout: 30 * time.Second}
	if s.api, err = client.New("http://"+apiAddr, client.WithHTTPClient(hc)); err != nil {
		s.kill()
		return nil, err
	}
	return s, nil
}

// waitReady polls GET /v1/pool; the NBD socket is bound before the API
// serves.
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
		case <-time.After(10 * time.Millisecond):
		}
	}
}

func (s *server) kill() {
	_ = s.cmd.Process.Kill()
	<-s.exited
}

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
			t.Errorf("quiver server log contains %q", bad)
		}
	}
	if t.Failed() {
		t.Logf("quiver server log (tail):\n%s", tail(log, 60))
	}
}

// createVolume creates the VM's volume: one disk per guestDisks entry,
// each diskSize bytes.
func (s *server) createVolume(t *testing.T, ctx context.Context, name string, diskSize int64) {
	t.Helper()
	spec := api.VolumeSpec{Name: name, Capacity: diskSize * int64(len(guestDisks))}
	for _, d := range guestDisks {
		spec.Disks = append(spec.Disks, api.DiskSpec{Name: d, Size: diskSize})
	}
	if _, err := s.api.CreateVolume(ctx, spec); err != nil {
		t.Fatalf("create volume %s: %v", name, err)
	}
}

// qemuIO runs one qemu-io command on an export and returns its output and
// exit error. qemu-io exits 0 even when its command fails and 1 when it
// cannot open the export, so callers read both; failing to run it at all
// fails the test.
func (s *server) qemuIO(t *testing.T, ctx context.Context, export, command string) (string, error) {
	t.Helper()
	testfs.RequireTool(t, "qemu-io")
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, "qemu-io", "-f", "raw", "-c", command, s.uri(export)).CombinedOutput()
	var exit *exec.ExitError
	if err != nil && !errors.As(err, &exit) {
		t.Fatalf("qemu-io -c %q %s: %v\n%s", command, redact(s.uri(export)), err, out)
	}
	return redact(string(out)), err
}

// tokenPattern matches attachment tokens (64 hex digits), which the test
// keeps out of its messages as the server keeps them out of its logs.
var tokenPattern = regexp.MustCompile(`[0-9a-f]{64}`)

func redact(s string) string { return tokenPattern.ReplaceAllString(s, "<token>") }

// uri is the NBD URI of an export on the unix socket, as qemu-img and
// qemu-io take it.
func (s *server) uri(export string) string {
	return "nbd+unix:///" + export + "?socket=" + s.socket
}

// readDisk copies an export to a file in dir with qemu-img convert and
// returns its contents.
func (s *server) readDisk(t *testing.T, ctx context.Context, export, dir string) []byte {
	t.Helper()
	testfs.RequireTool(t, "qemu-img")
	out := filepath.Join(dir, strings.SplitN(export, "/", 3)[1]+".img")
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "qemu-img", "convert", "-f", "raw", "-O", "raw", s.uri(export), out)
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("qemu-img convert %s: %v\n%s", redact(s.uri(export)), err, b)
	}
	img, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	return img
}
