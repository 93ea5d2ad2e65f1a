package forward

import (
	"context"
	"errors"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/quiverstorage/quiver/internal/nbd"
	"github.com/quiverstorage/quiver/internal/pool"
)

// markedExports serves vol/disk, recording the names its server was asked
// for; with down set it refuses every open as not served now.
type markedExports struct {
	exports
	down bool
}

func (e markedExports) Open(ctx context.Context, name, peer string) (nbd.Export, error) {
	if e.down {
		return nbd.Export{}, errors.New("not ready")
	}
	return e.exports.Open(ctx, name, peer)
}

// startMarked is a primary over s whose server recognizes names marked
// "/mark" (nbd.Config.Forwarded) and records every name it was asked for.
func startMarked(t *testing.T, s *store, down bool, asked *names) *primary {
	t.Helper()
	p := &primary{}
	p.fail.Store(failure{})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p.addr = ln.Addr().String()
	ex := markedExports{exports{memDisk{s: s, fail: &p.fail, writes: &p.writes, held: &p.held}}, down}
	p.srv = nbd.NewServer(ex, nbd.Config{Forwarded: func(name string) (string, bool) {
		asked.add(name)
		return strings.CutSuffix(name, "/mark")
	}})
	go func() { _ = p.srv.Serve(ln) }()
	t.Cleanup(func() { p.stop() })
	return p
}

type names struct {
	mu sync.Mutex
	l  []string
}

func (n *names) add(s string) { n.mu.Lock(); n.l = append(n.l, s); n.mu.Unlock() }
func (n *names) get() []string {
	n.mu.Lock()
	defer n.mu.Unlock()
	return append([]string(nil), n.l...)
}

// TestNameEachConnection: with Options.Name, every connection to a primary,
// the first and each one after the primary moved, opens the name Name
// makes then (a cluster node's hop is signed with the time), and no error
// shows that name: the client gets this node's errors, and a signed name
// must not reach it.
func TestNameEachConnection(t *testing.T) {
	s := &store{data: make([]byte, 1<<20)}
	var asked names
	a, b := startMarked(t, s, false, &asked), startMarked(t, s, false, &asked)
	var current atomic.Pointer[primary]
	current.Store(a)
	resolve := func(context.Context) (string, error) { return current.Load().addr, nil }
	var made atomic.Int64
	mark := func(export string) string { made.Add(1); return export + "/mark" }
	d, err := Open(context.Background(), "vol/disk", resolve, Options{RequestTimeout: 5 * time.Second,
		RetryFor: 20 * time.Second, Name: mark})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	a.stop()
	current.Store(b)
	if err := d.WriteAt(make([]byte, 4096), 0, false); err != nil {
		t.Fatalf("write after the primary moved: %v", err)
	}
	if got := asked.get(); made.Load() != 2 || len(got) != 2 || got[0] != "vol/disk/mark" || got[1] != "vol/disk/mark" {
		t.Fatalf("Name made %d names, the primaries were asked for %q; want 2, each connection's", made.Load(), got)
	}

	// A primary that cannot serve it now: the error names no marked name.
	c := startMarked(t, s, true, &asked)
	_, err = Open(context.Background(), "vol/disk", func(context.Context) (string, error) { return c.addr, nil },
		Options{RequestTimeout: time.Second, RetryFor: 200 * time.Millisecond, Name: mark})
	if err == nil || errors.Is(err, pool.ErrUnauthorized) {
		t.Fatalf("open at a primary not ready: %v; want it not served now", err)
	}
	t.Logf("open at a primary not ready: %v", err)
	if strings.Contains(err.Error(), "/mark") {
		t.Errorf("open at a primary not ready: %q shows the marked name", err)
	}
}
