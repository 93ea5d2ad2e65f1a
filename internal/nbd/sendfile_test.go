package nbd

import (
	"bytes"
	"context"
	"net"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/quiverstorage/quiver/internal/pool"
)

// sendCountExports wraps exports so that each disk counts the READs it sent
// with sendfile and those it refused. The wrapper keeps the disk's
// Nonblocking side, so that READs still run on the reader.
type sendCountExports struct {
	Exports
	sent, refused *atomic.Int32
}

type sendCountDisk struct {
	pool.Disk
	pool.Nonblocking
	s             pool.Sender
	sent, refused *atomic.Int32
}

func (x sendCountExports) Open(ctx context.Context, name, peer string) (Export, error) {
	e, err := x.Exports.Open(ctx, name, peer)
	if err != nil {
		return Export{}, err
	}
	caps := pool.CapabilitiesOf(e.Disk)
	e.Disk = sendCountDisk{Disk: e.Disk, Nonblocking: caps.Nonblocking, s: caps.Sender, sent: x.sent, refused: x.refused}
	return e, nil
}

// Capabilities offers the inner disk's Nonblocking side and, through
// TrySendTo, its Sender, when it has them.
func (d sendCountDisk) Capabilities() pool.Capabilities {
	var c pool.Capabilities
	if d.Nonblocking != nil {
		c.Nonblocking = d
	}
	if d.s != nil {
		c.Sender = d
	}
	return c
}

func (d sendCountDisk) TrySendTo(sock int, head []byte, off int64, n int) (int, error) {
	sent, err := d.s.TrySendTo(sock, head, off, n)
	if err == nil {
		d.sent.Add(1)
	} else if sent == 0 {
		d.refused.Add(1)
	}
	return sent, err
}

// TestLargeReadsWithSendfile: READs of at least sendfileMin bytes whose data
// is in the page cache go out with sendfile over a unix socket (and not
// over TCP), with structured and simple
// replies, at any offset, and in bursts whose replies must not interleave;
// once the pages are evicted the same READs are read the ordinary way. The
// client checks every byte against the model.
func TestLargeReadsWithSendfile(t *testing.T) {
	var sent, refused atomic.Int32
	e := newEnv(t, Config{}, func(x Exports) Exports {
		return sendCountExports{Exports: x, sent: &sent, refused: &refused}
	})
	e.poolWrite("root", 0, pattern(7, 0, rootSize)) // all data, no hole, in the page cache

	reads := []testReq{
		{typ: cmdRead, off: 0, length: 1 << 20},
		{typ: cmdRead, off: 1000, length: sendfileMin},                   // unaligned start
		{typ: cmdRead, off: 4096, length: 1<<20 + 12345},                 // unaligned length
		{typ: cmdRead, off: 0, length: rootSize},                         // the whole disk
		{typ: cmdRead, off: rootSize - sendfileMin, length: sendfileMin}, // up to the end
	}
	check := func(c *testClient, r testReq, rep *tReply) {
		t.Helper()
		if rep.errno != 0 {
			t.Fatalf("%s: error %d", reqString(r), rep.errno)
		}
		if want := e.model["root"][r.off : r.off+uint64(r.length)]; !bytes.Equal(rep.data, want) {
			t.Fatalf("%s: data differs from what was written", reqString(r))
		}
	}
	// A unix socket beside the environment's TCP one.
	sock := filepath.Join(t.TempDir(), "nbd.sock")
	uln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = e.srv.Serve(uln) }()
	connect := func(transport string, structured bool) *testClient {
		t.Helper()
		if transport == "tcp" {
			return e.connect(t, hsOpts{export: exportRoot, structured: structured})
		}
		nc, err := net.DialTimeout("unix", sock, 5*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = nc.Close() })
		c := newTestClient(t, nc)
		c.handshake(hsOpts{export: exportRoot, structured: structured})
		return c
	}
	for _, tc := range []struct {
		transport  string
		structured bool
	}{{"unix", true}, {"unix", false}, {"tcp", true}} {
		c := connect(tc.transport, tc.structured)
		for _, r := range reads {
			check(c, r, c.do(r))
		}
		// A burst: eight at once, replies read after all are sent.
		byCookie := map[uint64]testReq{}
		for i := range 8 {
			r := testReq{typ: cmdRead, off: uint64(i) * 64 << 10, length: 1 << 20}
			byCookie[c.send(r)] = r
		}
		for range 8 {
			rep, err := c.readReply()
			if err != nil {
				t.Fatal(err)
			}
			check(c, byCookie[rep.cookie], rep)
		}
	}
	// Every READ over unix, none over TCP.
	if n := sent.Load(); n != 2*int32(len(reads)+8) {
		t.Fatalf("%d READs sent with sendfile, want the %d over unix (%d refused)", n, 2*(len(reads)+8), refused.Load())
	}

	// Evicted pages: refused at first, then read the ordinary way (or
	// sent once cached), same data.
	evict(t, filepath.Join(e.pool.Dir(), "volumes", testVolume, "disks", "root.img"))
	sent.Store(0)
	c := connect("unix", true)
	r := testReq{typ: cmdRead, off: 0, length: 1 << 20}
	check(c, r, c.do(r))
	// The first try finds pages missing; a later one (the reader's lone
	// run) may find them cached by the readahead the failed RWF_NOWAIT
	// read started, and send them.
	if refused.Load() == 0 {
		t.Fatalf("READ of evicted pages: none refused (%d sent with sendfile)", sent.Load())
	}
}

// evict writes back and drops the page cache of the file at path.
func evict(t *testing.T, path string) {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := f.Sync(); err != nil {
		t.Fatal(err)
	}
	if err := unix.Fadvise(int(f.Fd()), 0, 0, unix.FADV_DONTNEED); err != nil {
		t.Fatal(err)
	}
}
