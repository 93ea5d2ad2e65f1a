// Package csitest runs quiver's CSI plugin in process for tests that drive
// it over gRPC, as the container orchestrator does (test/storm,
// test/cluster): on a unix socket in a short temporary directory, with a
// client connection, until the test ends.
//
// internal/csi's own tests cannot use it (csitest imports csi).
//
// Imports from quiver: csi.
package csitest

import (
	"context"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"sync"
	"testing"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/quiverstorage/quiver/internal/csi"
)

// Plugin is a CSI plugin serving in process on a unix socket, and a gRPC
// connection to it.
type Plugin struct {
	Endpoint string // unix:///<short dir>/csi.sock
	Conn     *grpc.ClientConn

	t    testing.TB
	dir  string
	stop context.CancelFunc
	done chan error // the plugin's ServeListener
	once sync.Once
}

// Start runs the plugin of cfg until Stop or the end of the test. It sets
// cfg.Endpoint to a unix socket in a new directory with a short path (unix
// socket paths must fit in 108 bytes); a nil cfg.Logger discards the
// plugin's log.
func Start(t testing.TB, cfg csi.Config) *Plugin {
	t.Helper()
	dir, err := os.MkdirTemp("", "qcsi")
	if err != nil {
		t.Fatal(err)
	}
	p := &Plugin{t: t, dir: dir, stop: func() {}}
	t.Cleanup(p.Stop)
	sock := filepath.Join(dir, "csi.sock")
	p.Endpoint = "unix://" + sock
	cfg.Endpoint = p.Endpoint
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	d, err := csi.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	p.stop, p.done = cancel, make(chan error, 1)
	go func() { p.done <- d.ServeListener(ctx, ln) }()
	if p.Conn, err = grpc.NewClient(p.Endpoint, grpc.WithTransportCredentials(insecure.NewCredentials())); err != nil {
		t.Fatal(err)
	}
	return p
}

// Controller is a client of the plugin's controller service.
func (p *Plugin) Controller() csipb.ControllerClient { return csipb.NewControllerClient(p.Conn) }

// Stop closes the connection, stops the plugin, fails the test if it
// served with an error, and removes its directory. Later calls do nothing;
// the end of the test calls it.
func (p *Plugin) Stop() {
	p.once.Do(func() {
		if p.Conn != nil {
			p.Conn.Close()
		}
		p.stop()
		if p.done != nil {
			if err := <-p.done; err != nil {
				p.t.Errorf("CSI plugin: %v", err)
			}
		}
		os.RemoveAll(p.dir)
	})
}
