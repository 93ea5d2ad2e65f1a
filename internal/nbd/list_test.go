package nbd

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/quiverstorage/quiver/internal/testfs"
)

var manyExports = flag.Int("nbd.exports", 500,
	"exports served to nbdinfo --list in TestNbdinfoListsManyExports (the issue asks for 10000 to work)")

// newManyExports serves n small in-memory exports named vol-NNNNN/disk.
func newManyExports(n int) (*memExports, []string) {
	e := &memExports{disks: map[string]*memDisk{}}
	names := make([]string, 0, n)
	for i := range n {
		name := fmt.Sprintf("vol-%05d/disk", i)
		e.disks[name] = &memDisk{e: e, data: make([]byte, 4096), ro: i%2 == 1}
		names = append(names, name)
	}
	return e, names
}

// serveExports runs a server over exports on network ("tcp": a loopback
// port; "unix": a socket in a temporary directory) until t ends, and returns
// the address.
func serveExports(t testing.TB, network string, exports Exports, cfg Config) string {
	t.Helper()
	if cfg.Logger == nil {
		cfg.Logger = discardLogger()
	}
	srv := NewServer(exports, cfg)
	addr := "127.0.0.1:0"
	if network == "unix" {
		addr = filepath.Join(t.TempDir(), "nbd.sock")
	}
	ln, err := net.Listen(network, addr)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ln) }()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := srv.Shutdown(ctx); err != nil {
			t.Errorf("shutdown: %v", err)
		}
		if err := <-done; !errors.Is(err, ErrServerClosed) {
			t.Errorf("Serve: %v, want ErrServerClosed", err)
		}
	})
	return ln.Addr().String()
}

// TestNbdinfoListsManyExports: nbdinfo --list sends NBD_OPT_LIST and then
// NBD_OPT_INFO and NBD_OPT_LIST_META_CONTEXT for every export on one
// connection; every export must come back with its size and read-only flag.
// Before the option bound grew with the exports listed, the server hung up
// after 127 exports (256 options).
//
// The test uses the unix socket: over TCP libnbd 1.14 sends the last bytes
// of each NBD_OPT_LIST_META_CONTEXT with MSG_MORE, so the kernel holds them
// for its 200 ms cork timeout and a list costs 200 ms per export whatever
// the server (nbdkit too). Run with -nbd.exports=10000 for the case.
func TestNbdinfoListsManyExports(t *testing.T) {
	testfs.RequireTool(t, "nbdinfo")
	exports, names := newManyExports(*manyExports)
	sock := serveExports(t, "unix", exports, Config{})
	start := time.Now()
	out, err := exec.CommandContext(t.Context(), "nbdinfo", "--json", "--list", "nbd+unix:///?socket="+sock).Output()
	if err != nil {
		t.Fatalf("nbdinfo --list with %d exports: %v\n%.2000s", len(names), err, out)
	}
	t.Logf("nbdinfo --list of %d exports: %v", len(names), time.Since(start))
	var info struct {
		Exports []struct {
			Name     string `json:"export-name"`
			Size     int64  `json:"export-size"`
			ReadOnly bool   `json:"is_read_only"`
		} `json:"exports"`
	}
	if err := json.Unmarshal(out, &info); err != nil {
		t.Fatalf("nbdinfo output: %v\n%.2000s", err, out)
	}
	var got []string
	for i, x := range info.Exports {
		got = append(got, x.Name)
		if x.Size != 4096 {
			t.Errorf("export %q: size %d, want 4096", x.Name, x.Size)
		}
		if want := exports.disks[x.Name] != nil && exports.disks[x.Name].ro; x.ReadOnly != want {
			t.Errorf("export %d %q: read-only %v, want %v", i, x.Name, x.ReadOnly, want)
		}
	}
	slices.Sort(got)
	if !slices.Equal(got, names) {
		t.Errorf("nbdinfo listed %d exports, want %d", len(got), len(names))
	}
}

// lockedBuffer collects a server's log.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// TestOptionBudget: a client may send maxOptions options plus
// optionsPerExport per export the server listed to it; asking for the list
// again does not raise the bound, and the server logs why it hangs up.
func TestOptionBudget(t *testing.T) {
	t.Run("every export listed can be asked about", func(t *testing.T) {
		exports, names := newManyExports(300)
		addr := serveExports(t, "tcp", exports, Config{})
		c := dial(t, addr)
		c.mustGreet(clientFlagFixedNewstyle)
		if reps := c.option(optList, nil); len(reps) != len(names)+1 || final(reps) != repAck {
			t.Fatalf("LIST: %d replies, want %d and an ACK", len(reps), len(names)+1)
		}
		for _, name := range names { // 600 options, more than maxOptions
			if reps := c.option(optInfo, goData(name)); final(reps) != repAck {
				t.Fatalf("INFO %s: %s", name, describe(reps))
			}
			if reps := c.option(optListMetaContext, metaData(name)); final(reps) != repAck {
				t.Fatalf("LIST_META_CONTEXT %s: %s", name, describe(reps))
			}
		}
		c.handshake2Go(names[0])
	})
	t.Run("listing again does not raise the bound", func(t *testing.T) {
		var log lockedBuffer
		exports := newMemExports()
		addr := serveExports(t, "tcp", exports, Config{Logger: slog.New(slog.NewTextHandler(&log, nil))})
		c := dial(t, addr)
		c.mustGreet(clientFlagFixedNewstyle)
		budget := maxOptions + optionsPerExport*len(exports.disks)
		for i := range budget {
			if reps := c.option(optList, nil); final(reps) != repAck {
				t.Fatalf("LIST #%d: %s", i+1, describe(reps))
			}
		}
		c.sendOpt(optList, nil)
		c.expectClosed(5 * time.Second)
		deadline := time.Now().Add(5 * time.Second)
		for !strings.Contains(log.String(), "too many options") {
			if time.Now().After(deadline) {
				t.Fatalf("the server did not log why it closed the connection; log:\n%s", log.String())
			}
			time.Sleep(5 * time.Millisecond)
		}
	})
}

// handshake2Go ends a negotiation with NBD_OPT_GO on name and checks that
// the connection entered transmission.
func (c *testClient) handshake2Go(name string) {
	c.t.Helper()
	reps := c.option(optGo, goData(name, infoBlockSize))
	if final(reps) != repAck {
		c.t.Fatalf("GO %q: %s", name, describe(reps))
	}
	c.size, c.flags = exportInfo(c.t, reps)
	if rep := c.do(testReq{typ: cmdRead, length: 512}); rep.errno != 0 {
		c.t.Fatalf("READ after GO: errno %d", rep.errno)
	}
}

// TestNbdinfoListsOverTCP: over TCP libnbd 1.14 spends about 200 ms per
// export listed (see TestNbdinfoListsManyExports), so a list of many
// exports outlasts a fixed handshake timeout; the negotiation's deadline
// grows with the exports listed. Here the timeout is 1 s and the list of 12
// exports takes more than 2 s.
func TestNbdinfoListsOverTCP(t *testing.T) {
	testfs.RequireTool(t, "nbdinfo")
	exports, names := newManyExports(12)
	addr := serveExports(t, "tcp", exports, Config{HandshakeTimeout: time.Second})
	start := time.Now()
	out, err := exec.CommandContext(t.Context(), "nbdinfo", "--json", "--list", "nbd://"+addr).Output()
	if err != nil {
		t.Fatalf("nbdinfo --list over TCP with %d exports: %v\n%.2000s", len(names), err, out)
	}
	t.Logf("nbdinfo --list of %d exports over TCP: %v", len(names), time.Since(start))
	var info struct {
		Exports []struct {
			Name string `json:"export-name"`
		} `json:"exports"`
	}
	if err := json.Unmarshal(out, &info); err != nil {
		t.Fatalf("nbdinfo output: %v\n%.2000s", err, out)
	}
	if len(info.Exports) != len(names) {
		t.Errorf("nbdinfo listed %d exports, want %d", len(info.Exports), len(names))
	}
}
