package nbdcrash

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/quiverstorage/quiver/internal/client"
	"github.com/quiverstorage/quiver/internal/testfs"
	"github.com/quiverstorage/quiver/internal/testserver"
)

// The quiver binaries built for this run, in one temporary directory that
// TestMain removes.
var (
	binMu    sync.Mutex
	binDir   string
	binPaths = map[bool]string{} // by race detector
)

func TestMain(m *testing.M) {
	code := m.Run()
	if binDir != "" {
		_ = os.RemoveAll(binDir)
	}
	os.Exit(code)
}

// quiverBinary builds cmd/quiver once per test binary. With race, and when
// the tests run with the race detector, the server has it too, so that it
// is checked for races while clients load it.
func quiverBinary(t *testing.T, race bool) string {
	t.Helper()
	testfs.RequireTool(t, "go")
	race = race && testserver.RaceEnabled
	binMu.Lock()
	defer binMu.Unlock()
	if p, ok := binPaths[race]; ok {
		return p
	}
	if binDir == "" {
		dir, err := os.MkdirTemp("", "nbdcrash-bin-")
		if err != nil {
			t.Fatal(err)
		}
		binDir = dir
	}
	bin := filepath.Join(binDir, "quiver")
	if race {
		bin += "-race"
	}
	if err := testserver.Build(bin, race); err != nil {
		t.Fatal(err)
	}
	binPaths[race] = bin
	return bin
}

// quiverServer is one run of `quiver server` on loopback ports.
type quiverServer struct {
	cmd     *exec.Cmd
	api     string // host:port of the HTTP API
	nbd     string // host:port of NBD
	log     *testserver.LogBuffer
	hc      *http.Client
	client  *client.Client
	exited  chan struct{} // closed once the process is reaped
	waitErr error         // cmd.Wait's result, set before exited is closed
}

// startQuiver starts a server on poolDir and waits until its API answers.
// Ports are picked free; if another process takes one first, it tries again
// on new ones.
func startQuiver(ctx context.Context, bin, poolDir string) (*quiverServer, error) {
	for attempt := 0; ; attempt++ {
		s, err := spawnQuiver(bin, poolDir)
		if err != nil {
			return nil, err
		}
		if err = s.waitReady(ctx); err == nil {
			return s, nil
		}
		s.kill()
		if attempt < 5 && strings.Contains(s.log.String(), "address already in use") {
			continue
		}
		return nil, fmt.Errorf("%w\nserver log:\n%s", err, s.log.String())
	}
}

func spawnQuiver(bin, poolDir string) (*quiverServer, error) {
	apiAddr, err := testserver.FreePort()
	if err != nil {
		return nil, err
	}
	nbdAddr, err := testserver.FreePort()
	if err != nil {
		return nil, err
	}
	s := &quiverServer{api: apiAddr, nbd: nbdAddr, log: &testserver.LogBuffer{}, exited: make(chan struct{})}
	s.cmd = exec.Command(bin, "server", "--pool", poolDir, "--listen", apiAddr, "--nbd-listen", nbdAddr)
	s.cmd.Stdout, s.cmd.Stderr = s.log, s.log
	s.cmd.SysProcAttr = dieWithTest()
	s.hc = &http.Client{Transport: http.DefaultTransport.(*http.Transport).Clone()}
	if s.client, err = client.New("http://"+apiAddr, client.WithHTTPClient(s.hc)); err != nil {
		return nil, err
	}
	if err := s.cmd.Start(); err != nil {
		return nil, err
	}
	go func() {
		s.waitErr = s.cmd.Wait()
		close(s.exited)
	}()
	return s, nil
}

// waitReady polls GET /v1/pool. The NBD listener is open before the API
// serves, so an answer means both are up.
func (s *quiverServer) waitReady(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	for {
		rctx, rcancel := context.WithTimeout(ctx, 2*time.Second)
		_, err := s.client.Pool(rctx)
		rcancel()
		if err == nil {
			return nil
		}
		if client.Code(err) != "" { // the server answered, with an error
			return fmt.Errorf("GET /v1/pool: %w", err)
		}
		select {
		case <-s.exited:
			return fmt.Errorf("server exited before it was ready: %v", s.waitErr)
		case <-ctx.Done():
			return fmt.Errorf("server not ready: %w (last error: %v)", ctx.Err(), err)
		case <-time.After(5 * time.Millisecond):
		}
	}
}

// uri is the NBD URI of an export.
func (s *quiverServer) uri(export string) string { return "nbd://" + s.nbd + "/" + export }

// kill sends SIGKILL and reaps the process. It returns an error when the
// process had ended by itself before.
func (s *quiverServer) kill() error {
	var early error
	select {
	case <-s.exited:
		early = fmt.Errorf("server ended before it was killed: %v", s.waitErr)
	default:
		_ = s.cmd.Process.Kill()
		<-s.exited
		var ee *exec.ExitError
		if errors.As(s.waitErr, &ee) {
			if ws, ok := ee.Sys().(syscall.WaitStatus); !ok || !ws.Signaled() || ws.Signal() != syscall.SIGKILL {
				early = fmt.Errorf("server ended before it was killed: %v", s.waitErr)
			}
		}
	}
	s.hc.CloseIdleConnections()
	return early
}

// stop asks the server to shut down (SIGTERM) and waits for it, killing it
// after a while.
func (s *quiverServer) stop() {
	select {
	case <-s.exited:
		return
	default:
	}
	_ = s.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-s.exited:
	case <-time.After(20 * time.Second):
		_ = s.cmd.Process.Kill()
		<-s.exited
	}
	s.hc.CloseIdleConnections()
}

// dump makes the Go runtime print every goroutine of the server (SIGQUIT,
// which also ends it) and returns its log: for a test that found the server
// stuck.
func (s *quiverServer) dump() string {
	select {
	case <-s.exited:
	default:
		_ = s.cmd.Process.Signal(syscall.SIGQUIT)
		select {
		case <-s.exited:
		case <-time.After(10 * time.Second):
			_ = s.cmd.Process.Kill()
			<-s.exited
		}
	}
	return s.log.String()
}

// problems reports what must never be in the server's log: data races,
// panics, fatal runtime errors.
func (s *quiverServer) problems() error {
	log := s.log.String()
	for _, bad := range []string{"WARNING: DATA RACE", "panic:", "fatal error:"} {
		if i := strings.Index(log, bad); i >= 0 {
			return fmt.Errorf("server log contains %q:\n%s", bad, log[i:min(len(log), i+8000)])
		}
	}
	return nil
}
