package nbdclient_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/quiverstorage/quiver/internal/nbd"
	"github.com/quiverstorage/quiver/internal/nbdclient"
	"github.com/quiverstorage/quiver/internal/pool"
)

const diskSize = 4 << 20

// serve serves a fresh pool's volume "vm" (one disk "root") over NBD on
// loopback and returns the address.
func serve(t *testing.T) string {
	t.Helper()
	ctx := context.Background()
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	p, err := pool.OpenWith(ctx, t.TempDir(), pool.Options{Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close() })
	if _, _, err := p.Create(ctx, pool.VolumeSpec{Name: "vm", Capacity: diskSize,
		Disks: []pool.DiskSpec{{Name: "root", Size: diskSize}}}); err != nil {
		t.Fatal(err)
	}
	srv := nbd.NewServer(nbd.PoolExports{Pool: p}, nbd.Config{Logger: log})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() {
		sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx)
	})
	return ln.Addr().String()
}

// TestRoundTrip drives quiver's server with every command the client has,
// many requests in flight at once.
func TestRoundTrip(t *testing.T) {
	addr := serve(t)
	c, err := nbdclient.Dial(context.Background(), addr, "vm/root", nbdclient.Options{Timeout: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if c.Size() != diskSize || c.ReadOnly() {
		t.Fatalf("size %d read-only %v, want %d and false", c.Size(), c.ReadOnly(), diskSize)
	}
	const n = 32
	errs := make(chan error, n)
	for i := range n {
		go func() { errs <- c.WriteAt(bytes.Repeat([]byte{byte(i + 1)}, 4096), int64(i)*4096, i%2 == 0) }()
	}
	for range n {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	if err := c.Flush(); err != nil {
		t.Fatal(err)
	}
	if err := c.Trim(0, 4096, false); err != nil {
		t.Fatal(err)
	}
	if err := c.Zero(4096, 4096, false, false, true); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 4*4096)
	if err := c.ReadAt(buf, 0); err != nil {
		t.Fatal(err)
	}
	want := append(make([]byte, 2*4096), append(bytes.Repeat([]byte{3}, 4096), bytes.Repeat([]byte{4}, 4096)...)...)
	if !bytes.Equal(buf, want) {
		t.Fatal("read back differs from what was written, trimmed and zeroed")
	}
	// A request the server refuses: its errno, and the connection lives on.
	var errno nbdclient.Errno
	if err := c.WriteAt(make([]byte, 4096), diskSize, false); !errors.As(err, &errno) || errno != nbdclient.Errno(syscall.ENOSPC) {
		t.Fatalf("write past the end: %v, want NBD error ENOSPC", err)
	}
	if err := c.ReadAt(buf[:4096], 0); err != nil {
		t.Fatalf("after a refused request: %v", err)
	}
}

// TestRefusedExport: a name the server does not serve is ErrRefused, a
// *Refusal with the server's reply type (NBD_REP_ERR_UNKNOWN) and message.
func TestRefusedExport(t *testing.T) {
	addr := serve(t)
	_, err := nbdclient.Dial(context.Background(), addr, "nope/root", nbdclient.Options{Timeout: 10 * time.Second})
	if !errors.Is(err, nbdclient.ErrRefused) {
		t.Fatalf("dial of a missing export: %v, want ErrRefused", err)
	}
	var r *nbdclient.Refusal
	if !errors.As(err, &r) || r.Reply != 1<<31|6 || !strings.Contains(r.Message, `"nope/root"`) {
		t.Fatalf("dial of a missing export: %#v, want reply NBD_REP_ERR_UNKNOWN with the server's message", r)
	}
}

// TestSilentServer: a peer that accepts and never speaks fails the
// handshake within the timeout; one that stops answering requests fails
// them, and every later one, with ErrLost.
func TestSilentServer(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			defer c.Close()
		}
	}()
	start := time.Now()
	_, err = nbdclient.Dial(context.Background(), ln.Addr().String(), "vm/root", nbdclient.Options{Timeout: 300 * time.Millisecond})
	if !errors.Is(err, nbdclient.ErrHandshake) {
		t.Fatalf("dial of a silent peer: %v, want ErrHandshake", err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Fatalf("the handshake took %v with a 300 ms timeout", d)
	}

	// A real server, then a proxy that stops forwarding replies.
	addr := serve(t)
	proxy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer proxy.Close()
	stop := make(chan struct{})
	go func() {
		cc, err := proxy.Accept()
		if err != nil {
			return
		}
		sc, err := net.Dial("tcp", addr)
		if err != nil {
			cc.Close()
			return
		}
		go func() { _, _ = io.Copy(sc, cc) }()
		buf := make([]byte, 64<<10)
		for {
			n, err := sc.Read(buf)
			if err != nil {
				return
			}
			select {
			case <-stop: // replies are dropped from now on
			default:
				if _, err := cc.Write(buf[:n]); err != nil {
					return
				}
			}
		}
	}()
	c, err := nbdclient.Dial(context.Background(), proxy.Addr().String(), "vm/root", nbdclient.Options{Timeout: 500 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if err := c.Flush(); err != nil {
		t.Fatal(err)
	}
	close(stop)
	if err := c.Flush(); !errors.Is(err, nbdclient.ErrLost) {
		t.Fatalf("flush with no answer: %v, want ErrLost", err)
	}
	if !c.Failed() {
		t.Fatal("the connection is not marked failed")
	}
	if err := c.WriteAt(make([]byte, 512), 0, false); !errors.Is(err, nbdclient.ErrLost) {
		t.Fatalf("request after the failure: %v, want ErrLost", err)
	}
}

// TestStarted: requests started without waiting go out at Unplug, many
// in one burst, and each ends exactly once: with its reply (the data read
// is the data written), and, on a connection that stops answering, with
// ErrLost within the timeout; a request started on a failed connection
// ends at once. Their ends never mark more on the last of a run.
func TestStarted(t *testing.T) {
	addr := serve(t)
	c, err := nbdclient.Dial(context.Background(), addr, "vm/root", nbdclient.Options{Timeout: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	const n, size = 40, 4096
	type end struct {
		i    int
		err  error
		more bool
	}
	ends := make(chan end, 2*n)
	for i := range n {
		c.StartWrite(bytes.Repeat([]byte{byte(i + 1)}, size), int64(i)*size, i%5 == 0, func(err error, more bool) {
			ends <- end{i, err, more}
		})
	}
	c.Unplug()
	collect := func(what string) {
		t.Helper()
		seen := map[int]bool{}
		for range n {
			select {
			case e := <-ends:
				if e.err != nil {
					t.Fatalf("%s %d: %v", what, e.i, e.err)
				}
				if seen[e.i] {
					t.Fatalf("%s %d ended twice", what, e.i)
				}
				seen[e.i] = true
				if len(seen) == n && e.more {
					t.Errorf("the last %s's end says more follow", what)
				}
			case <-time.After(20 * time.Second):
				t.Fatalf("%d of %d %ss ended", len(seen), n, what)
			}
		}
	}
	collect("write")
	bufs := make([][]byte, n)
	for i := range n {
		bufs[i] = make([]byte, size)
		c.StartRead(bufs[i], int64(i)*size, func(err error, more bool) { ends <- end{i, err, more} })
	}
	c.Unplug()
	collect("read")
	for i, b := range bufs {
		if !bytes.Equal(b, bytes.Repeat([]byte{byte(i + 1)}, size)) {
			t.Fatalf("read %d: not the data written", i)
		}
	}

	c.Fail(errors.New("test"))
	got := make(chan error, 1)
	c.StartRead(make([]byte, size), 0, func(err error, _ bool) { got <- err })
	select {
	case err := <-got:
		if !errors.Is(err, nbdclient.ErrLost) {
			t.Fatalf("request started on a failed connection: %v, want ErrLost", err)
		}
	default:
		t.Fatal("a request started on a failed connection did not end at once")
	}
}
