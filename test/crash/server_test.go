package crash

import (
	"context"
	"errors"
	"fmt"
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

	"github.com/quiverstorage/quiver/internal/client"
	"github.com/quiverstorage/quiver/internal/testfs"
	"github.com/quiverstorage/quiver/internal/testserver"
)

// The server binary is built once per test binary, by the first test that
// needs it, into binDir; TestMain removes it.
var (
	buildOnce sync.Once
	binDir    string
	binPath   string
	buildErr  error
)

func TestMain(m *testing.M) {
	code := m.Run()
	if binDir != "" {
		os.RemoveAll(binDir)
	}
	os.Exit(code)
}

// buildServer returns cmd/quiver compiled with the race detector when the
// test has it, so the server is checked for races too.
func buildServer(t *testing.T) string {
	t.Helper()
	testfs.RequireTool(t, "go")
	buildOnce.Do(func() { binPath, buildErr = build() })
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return binPath
}

func build() (string, error) {
	dir, err := os.MkdirTemp("", "quiver-crash-")
	if err != nil {
		return "", err
	}
	binDir = dir
	bin := filepath.Join(dir, "quiver")
	return bin, testserver.Build(bin, testserver.RaceEnabled)
}

// serverProc is one run of `quiver server`.
type serverProc struct {
	cmd     *exec.Cmd
	addr    string
	poolDir string
	log     *testserver.LogBuffer
	hc      *http.Client
	client  *client.Client
	exited  chan struct{} // closed once the process is reaped
	werr    error         // cmd.Wait's error, set before exited is closed
	killed  bool          // kill was called (only by the test goroutine)
}

// spawn starts the server on a free loopback port. It does not wait for it.
func spawn(bin, poolDir string) (*serverProc, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	addr := ln.Addr().String()
	ln.Close()
	s := &serverProc{addr: addr, poolDir: poolDir, log: &testserver.LogBuffer{}, exited: make(chan struct{})}
	// No NBD listener: the test uses none, and its fixed default port
	// would clash with other servers on the machine.
	s.cmd = exec.Command(bin, "server", "--pool", poolDir, "--listen", addr, "--nbd-listen=", "--log-level", "debug")
	s.cmd.Stdout = s.log
	s.cmd.Stderr = s.log
	if err := s.cmd.Start(); err != nil {
		return nil, err
	}
	go func() {
		s.werr = s.cmd.Wait()
		close(s.exited)
	}()
	s.hc = &http.Client{Transport: http.DefaultTransport.(*http.Transport).Clone()}
	s.client, err = client.New("http://"+addr, client.WithHTTPClient(s.hc))
	if err != nil {
		s.kill()
		return nil, err
	}
	return s, nil
}

// startServer spawns the server and waits until it answers GET /v1/pool,
// trying another port when the chosen one was taken meanwhile.
func startServer(ctx context.Context, bin, poolDir string) (*serverProc, error) {
	for attempt := 0; ; attempt++ {
		s, err := spawn(bin, poolDir)
		if err != nil {
			return nil, err
		}
		err = s.waitReady(ctx)
		if err == nil {
			return s, nil
		}
		s.kill()
		if attempt < 5 && strings.Contains(s.log.String(), "address already in use") {
			continue
		}
		return s, err
	}
}

// waitReady polls GET /v1/pool until the server answers, exits or ctx ends.
func (s *serverProc) waitReady(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	for {
		select {
		case <-s.exited:
			return fmt.Errorf("server exited before it was ready: %v", s.werr)
		default:
		}
		rctx, rcancel := context.WithTimeout(ctx, time.Second)
		info, err := s.client.Pool(rctx)
		rcancel()
		if err == nil {
			if info.Path != s.poolDir {
				return fmt.Errorf("%s answers for pool %q, not %q: another server took the port", s.addr, info.Path, s.poolDir)
			}
			return nil
		}
		if client.Code(err) != "" {
			return fmt.Errorf("GET /v1/pool: %w", err)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("server not ready: %w (last error: %v)", ctx.Err(), err)
		case <-s.exited:
		case <-time.After(2 * time.Millisecond):
		}
	}
}

// kill sends SIGKILL and reaps the process.
func (s *serverProc) kill() {
	s.killed = true
	_ = s.cmd.Process.Kill()
	<-s.exited
	s.hc.CloseIdleConnections()
}

// died reports how the process ended when it was not by our SIGKILL, or ""
// when it was (or is still running).
func (s *serverProc) died() string {
	select {
	case <-s.exited:
	default:
		return ""
	}
	var ee *exec.ExitError
	if errors.As(s.werr, &ee) {
		if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() && ws.Signal() == syscall.SIGKILL && s.killed {
			return ""
		}
	}
	return fmt.Sprintf("server ended by itself: %v", s.werr)
}

// problems scans the server's log for what must never happen: data races
// and panics.
func (s *serverProc) problems() string {
	log := s.log.String()
	for _, bad := range []string{"WARNING: DATA RACE", "panic:", "fatal error:"} {
		if strings.Contains(log, bad) {
			return fmt.Sprintf("server log contains %q", bad)
		}
	}
	return ""
}
