package testserver

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/quiverstorage/quiver/internal/api"
	"github.com/quiverstorage/quiver/internal/client"
)

// Options says how to run `quiver server`.
type Options struct {
	Pool      string   // pool directory (required)
	NBDTCP    bool     // serve NBD on a free loopback TCP port
	NBDSocket string   // serve NBD on this unix socket too ("" none)
	LogLevel  string   // default "info"
	Args      []string // more flags
	// Token, when set, is the server's bearer token: Start writes it to a
	// file beside the pool, passes --token-file, and Process.API sends it.
	Token string
	// AdminTokenFromPool makes Process.API send the admin token the
	// server made at first start in the pool (admin.token); pass
	// --require-token in Args to need it on loopback.
	AdminTokenFromPool bool
	// TLS, when set, makes Process.API call the server over HTTPS and
	// verify it with this configuration (pass --tls-cert in Args).
	TLS *tls.Config
	// Wrap, when set, runs the server through this command, which must
	// exec it in the same process (e.g. ip netns exec NS).
	Wrap []string
	// Dial, when set, makes the connections of Process.API (e.g. from
	// inside a network namespace).
	Dial func(ctx context.Context, network, addr string) (net.Conn, error)
}

// Process is one `quiver server` on loopback ports the kernel chose.
type Process struct {
	API     *client.Client
	APIAddr string // host:port of the HTTP API
	NBDAddr string // host:port of NBD over TCP, when Options.NBDTCP
	Socket  string // NBD unix socket, when set
	Pool    string
	Log     *LogBuffer

	cmd        *exec.Cmd
	readyFile  string
	clientOpts []client.Option
	tls        *tls.Config
	dial       func(ctx context.Context, network, addr string) (net.Conn, error)
	hc         *http.Client
	exited     chan struct{} // closed once the process is reaped
	werr       error         // cmd.Wait's result, set before exited is closed
	killed     atomic.Bool   // Kill sent the SIGKILL
	poolToken  bool          // Options.AdminTokenFromPool
}

// Start runs bin as a server on loopback port 0 and returns once it has
// written its ready file (--ready-file: the bound addresses) and its API
// answers.
func Start(ctx context.Context, bin string, o Options) (*Process, error) {
	p, err := Spawn(bin, o)
	if err != nil {
		return nil, err
	}
	if err := p.WaitReady(ctx); err != nil {
		p.Kill()
		return nil, err
	}
	return p, nil
}

// WaitReady waits for a server made by Spawn to serve (see Start); on
// failure the error holds the tail of its log, and the server runs on.
func (p *Process) WaitReady(ctx context.Context) error {
	if err := p.waitReady(ctx); err != nil {
		return fmt.Errorf("quiver server: %w\nlog:\n%s", err, Tail(p.Log.String(), 100))
	}
	return nil
}

// Spawn starts bin as a server and returns at once, without waiting for it
// to serve: for tests that kill a server during its start-up. The fields
// filled from the ready file (API, APIAddr, NBDAddr) stay empty.
func Spawn(bin string, o Options) (*Process, error) {
	dir, err := os.MkdirTemp("", "quiver-ready-")
	if err != nil {
		return nil, err
	}
	p := &Process{Socket: o.NBDSocket, Pool: o.Pool, Log: &LogBuffer{}, exited: make(chan struct{}), tls: o.TLS,
		dial: o.Dial, readyFile: filepath.Join(dir, "ready.json"), poolToken: o.AdminTokenFromPool}
	args := []string{"server", "--pool", o.Pool, "--listen", "127.0.0.1:0", "--nbd-listen=", "--ready-file", p.readyFile}
	if o.NBDTCP {
		args[5] = "--nbd-listen=127.0.0.1:0"
	}
	if o.NBDSocket != "" {
		args = append(args, "--nbd-socket", o.NBDSocket)
	}
	level := o.LogLevel
	if level == "" {
		level = "info"
	}
	args = append(args, "--log-level", level)
	if o.Token != "" {
		file := filepath.Clean(o.Pool) + ".token"
		if err := os.WriteFile(file, []byte(o.Token+"\n"), 0o600); err != nil {
			return nil, err
		}
		args = append(args, "--token-file", file)
		p.clientOpts = append(p.clientOpts, client.WithToken(o.Token))
	}
	args = append(args, o.Args...)
	if len(o.Wrap) > 0 {
		args = append(append(o.Wrap[1:len(o.Wrap):len(o.Wrap)], bin), args...)
		bin = o.Wrap[0]
	}
	p.cmd = exec.Command(bin, args...)
	p.cmd.Stdout, p.cmd.Stderr = p.Log, p.Log
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL} // never outlive the test
	if err := p.cmd.Start(); err != nil {
		_ = os.RemoveAll(dir)
		return nil, err
	}
	go func() {
		p.werr = p.cmd.Wait()
		_ = os.RemoveAll(dir)
		close(p.exited)
	}()
	return p, nil
}

// waitReady waits up to a minute for the ready file, takes the addresses
// from it and checks that the API answers.
func (p *Process) waitReady(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	var ready api.ReadyFile
	for {
		b, err := os.ReadFile(p.readyFile)
		if err == nil {
			if err := json.Unmarshal(b, &ready); err != nil {
				return fmt.Errorf("ready file: %w", err)
			}
			break
		}
		select {
		case <-p.exited:
			return fmt.Errorf("server exited before it was ready: %v", p.werr)
		case <-ctx.Done():
			return fmt.Errorf("server not ready: no ready file: %w", ctx.Err())
		case <-time.After(5 * time.Millisecond):
		}
	}
	if ready.PID != p.cmd.Process.Pid {
		return fmt.Errorf("ready file names pid %d, not %d", ready.PID, p.cmd.Process.Pid)
	}
	p.APIAddr, p.NBDAddr = ready.API, ready.NBD
	p.hc = &http.Client{Transport: http.DefaultTransport.(*http.Transport).Clone(), Timeout: 30 * time.Second}
	if p.dial != nil {
		p.hc.Transport.(*http.Transport).DialContext = p.dial
	}
	scheme := "http://"
	if p.tls != nil {
		scheme = "https://"
		p.hc.Transport.(*http.Transport).TLSClientConfig = p.tls
	}
	if p.poolToken {
		b, err := os.ReadFile(filepath.Join(p.Pool, "admin.token"))
		if err != nil {
			return fmt.Errorf("admin token: %w", err)
		}
		p.clientOpts = append(p.clientOpts, client.WithToken(strings.TrimSpace(string(b))))
	}
	var err error
	if p.API, err = client.New(scheme+p.APIAddr, append(p.clientOpts, client.WithHTTPClient(p.hc))...); err != nil {
		return err
	}
	info, err := p.API.Pool(ctx)
	if err != nil {
		return fmt.Errorf("GET /v1/pool: %w", err)
	}
	if abs, _ := filepath.Abs(p.Pool); info.Path != abs {
		return fmt.Errorf("%s answers for pool %q, not %q", p.APIAddr, info.Path, abs)
	}
	return nil
}

// ClientWith returns a client of the server's API that sends token (none
// when ""), over the same transport as Process.API.
func (p *Process) ClientWith(token string) (*client.Client, error) {
	scheme := "http://"
	if p.tls != nil {
		scheme = "https://"
	}
	hc := &http.Client{Transport: p.hc.Transport.(*http.Transport).Clone(), Timeout: p.hc.Timeout}
	opts := []client.Option{client.WithHTTPClient(hc)}
	if token != "" {
		opts = append(opts, client.WithToken(token))
	}
	return client.New(scheme+p.APIAddr, opts...)
}

// URI is the NBD URI of an export over TCP.
func (p *Process) URI(export string) string { return "nbd://" + p.NBDAddr + "/" + export }

// UnixURI is the NBD URI of an export over the unix socket.
func (p *Process) UnixURI(export string) string {
	return "nbd+unix:///" + export + "?socket=" + p.Socket
}

// Signal sends sig to the server.
func (p *Process) Signal(sig os.Signal) error { return p.cmd.Process.Signal(sig) }

// PID is the server's process ID.
func (p *Process) PID() int { return p.cmd.Process.Pid }

// Exited is closed once the process has ended and been reaped.
func (p *Process) Exited() <-chan struct{} { return p.exited }

// Kill sends SIGKILL and reaps the process.
func (p *Process) Kill() {
	p.killed.Store(true)
	_ = p.cmd.Process.Kill()
	<-p.exited
	if p.hc != nil {
		p.hc.CloseIdleConnections()
	}
}

// EndedByItself reports how the process ended when it ended by any means but
// Kill, and nil while it runs or after Kill: crash tests call it before
// they kill a server to know it was still serving.
func (p *Process) EndedByItself() error {
	select {
	case <-p.exited:
	default:
		return nil
	}
	var ee *exec.ExitError
	if p.killed.Load() && errors.As(p.werr, &ee) {
		if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() && ws.Signal() == syscall.SIGKILL {
			return nil
		}
	}
	return fmt.Errorf("server ended by itself: %v", p.werr)
}

// Stop ends the server with SIGTERM (which drains and flushes every NBD
// connection) and reports an error unless it exited by itself, with status
// 0, within timeout, and its log holds no data race or panic.
func (p *Process) Stop(timeout time.Duration) error {
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	var errs []string
	select {
	case <-p.exited:
		if p.werr != nil {
			errs = append(errs, fmt.Sprintf("did not exit cleanly on SIGTERM: %v", p.werr))
		}
	case <-time.After(timeout):
		p.Kill()
		errs = append(errs, fmt.Sprintf("did not exit within %v of SIGTERM", timeout))
	}
	if err := p.CheckLog(); err != nil {
		errs = append(errs, err.Error())
	}
	if len(errs) > 0 {
		return fmt.Errorf("quiver server: %s", strings.Join(errs, "; "))
	}
	return nil
}

// Dump makes the Go runtime print every goroutine of the server (SIGQUIT,
// which also ends it) and returns the tail of its log: for a test that finds
// the server stuck.
func (p *Process) Dump() string {
	select {
	case <-p.exited:
	default:
		_ = p.cmd.Process.Signal(syscall.SIGQUIT)
		select {
		case <-p.exited:
		case <-time.After(10 * time.Second):
			p.Kill()
		}
	}
	return Tail(p.Log.String(), 400)
}

// CheckLog reports a data race, panic or fatal error in the server's log,
// with the log from there on.
func (p *Process) CheckLog() error {
	log := p.Log.String()
	for _, bad := range []string{"WARNING: DATA RACE", "panic:", "fatal error:"} {
		if i := strings.Index(log, bad); i >= 0 {
			return fmt.Errorf("server log contains %q:\n%s", bad, log[i:min(len(log), i+8000)])
		}
	}
	return nil
}

// StartT starts a server on a fresh pool for t, with NBD on TCP and on a
// unix socket; t.Cleanup stops it and fails t if it does not stop cleanly.
func StartT(t testing.TB, bin string, o Options) *Process {
	t.Helper()
	if o.Pool == "" {
		o.Pool = t.TempDir()
	}
	if o.NBDSocket == "" {
		o.NBDSocket = SocketPath(t)
	}
	p, err := Start(context.Background(), bin, o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := p.Stop(20 * time.Second); err != nil {
			t.Error(err)
		}
		if t.Failed() {
			t.Logf("server log:\n%s", Tail(p.Log.String(), 200))
		}
	})
	return p
}

// SocketPath returns a fresh unix socket path that fits in 108 bytes, which
// t.TempDir() paths, named after the test, may not.
func SocketPath(t testing.TB) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "qv")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	return filepath.Join(dir, "nbd.sock")
}

// Tail returns the last n lines of s.
func Tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = append([]string{fmt.Sprintf("[%d lines before]", len(lines)-n)}, lines[len(lines)-n:]...)
	}
	return strings.Join(lines, "\n")
}

// MainWithBinary builds the server once for a test binary's TestMain,
// stores its path in *bin, runs the tests and removes it.
func MainWithBinary(m *testing.M, bin *string) int {
	dir, err := os.MkdirTemp("", "quiver-bin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, "build quiver:", err)
		return 1
	}
	defer os.RemoveAll(dir)
	*bin = filepath.Join(dir, "quiver")
	if err := Build(*bin, RaceEnabled); err != nil {
		fmt.Fprintln(os.Stderr, "build quiver:", err)
		return 1
	}
	return m.Run()
}
