package nbd

import (
	"bytes"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/quiverstorage/quiver/internal/client"
	"github.com/quiverstorage/quiver/internal/metrics"
	"github.com/quiverstorage/quiver/internal/testfs"
)

// attachToken creates an attachment of the test volume and returns its ID and
// token.
func (e *testEnv) attachToken(node, mode string) (string, string) {
	e.t.Helper()
	a, _, err := e.vol.Attach(node, mode)
	if err != nil {
		e.t.Fatal(err)
	}
	return a.ID, a.Token
}

func writeReq(off uint64, b []byte) testReq {
	return testReq{typ: cmdWrite, off: off, length: uint32(len(b)), payload: b}
}

func (c *testClient) readAt(off uint64, n uint32) []byte {
	c.t.Helper()
	rep := c.do(testReq{typ: cmdRead, off: off, length: n})
	if rep.errno != 0 {
		c.t.Fatalf("read [%d,+%d): errno %d", off, n, rep.errno)
	}
	return rep.data
}

// TestFencingOverNBD runs the live-migration sequence through the wire: the
// source writes, the destination attaches and reads, then writes; the
// source's next write gets EPERM and changes nothing, its FLUSH succeeds.
func TestFencingOverNBD(t *testing.T) {
	var m *metrics.Metrics
	e := newEnv(t, Config{}, func(x Exports) Exports {
		pe := x.(PoolExports)
		m = metrics.New(pe.Pool)
		pe.Metrics = m
		return pe
	})
	_, srcTok := e.attachToken("src", "rw")
	dstID, dstTok := e.attachToken("dst", "rw")
	src := e.connect(t, hsOpts{export: exportRoot + "/" + srcTok, structured: true})
	srcData := e.connect(t, hsOpts{export: exportData + "/" + srcTok, structured: true})
	if rep := src.do(writeReq(0, pattern(10, 0, 4096))); rep.errno != 0 {
		t.Fatalf("source write: errno %d", rep.errno)
	}
	dst := e.connect(t, hsOpts{export: exportRoot + "/" + dstTok, structured: true})
	if got := dst.readAt(0, 4096); !bytes.Equal(got, pattern(10, 0, 4096)) {
		t.Fatal("destination does not see the source's write")
	}
	if rep := dst.do(writeReq(8192, pattern(11, 8192, 4096))); rep.errno != 0 {
		t.Fatalf("destination write: errno %d", rep.errno)
	}
	if w := e.vol.Writer(); w.Writer != dstID || w.Epoch != 2 {
		t.Fatalf("writer %+v, want %s at epoch 2", w, dstID)
	}
	// The source is fenced on every disk of the volume.
	for _, c := range []*testClient{src, srcData} {
		if rep := c.do(writeReq(0, pattern(12, 0, 4096))); rep.errno != errPerm {
			t.Fatalf("fenced write: errno %d, want EPERM", rep.errno)
		}
		if rep := c.do(testReq{typ: cmdWriteZeroes, off: 0, length: 4096}); rep.errno != errPerm {
			t.Fatalf("fenced write-zeroes: errno %d, want EPERM", rep.errno)
		}
		if rep := c.do(testReq{typ: cmdFlush}); rep.errno != 0 {
			t.Fatalf("fenced flush: errno %d, want success", rep.errno)
		}
	}
	if got := dst.readAt(0, 4096); !bytes.Equal(got, pattern(10, 0, 4096)) {
		t.Fatal("a fenced write reached the disk")
	}
	// Each refused write and zero is counted under the volume.
	rec := httptest.NewRecorder()
	m.Handler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	got, err := client.ParseMetrics(rec.Body)
	if err != nil {
		t.Fatal(err)
	}
	if n := got.Sum("quiver_fenced_writes_total", map[string]string{"volume": testVolume}); n != 4 {
		t.Errorf("quiver_fenced_writes_total = %v, want 4 (a write and a zero on each of two disks)", n)
	}
	if n := got.Sum("quiver_volume_writer_epoch", map[string]string{"volume": testVolume}); n != 2 {
		t.Errorf("quiver_volume_writer_epoch = %v, want 2", n)
	}
}

// TestInFlightFencedWriteOverNBD: a source write that has arrived but not
// passed the gate when the destination takes over is refused and not
// applied (the pool's write hook holds it in flight).
func TestInFlightFencedWriteOverNBD(t *testing.T) {
	e := newEnv(t, Config{}, nil)
	srcID, srcTok := e.attachToken("src", "rw")
	_, dstTok := e.attachToken("dst", "rw")
	src := e.connect(t, hsOpts{export: exportRoot + "/" + srcTok, structured: true})
	dst := e.connect(t, hsOpts{export: exportRoot + "/" + dstTok, structured: true})
	if rep := src.do(writeReq(0, pattern(20, 0, 4096))); rep.errno != 0 {
		t.Fatalf("source write: errno %d", rep.errno)
	}
	arrived, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	e.pool.SetWriteHook(func(att string) {
		if att == srcID {
			once.Do(func() { close(arrived); <-release })
		}
	})
	t.Cleanup(func() { e.pool.SetWriteHook(nil) })
	ck := src.send(testReq{typ: cmdWrite, flags: cmdFlagFUA, off: 0, length: 4096, payload: pattern(0xee, 0, 4096)})
	select {
	case <-arrived:
	case <-time.After(10 * time.Second):
		t.Fatal("source write never reached the pool")
	}
	if rep := dst.do(writeReq(65536, pattern(21, 65536, 4096))); rep.errno != 0 {
		t.Fatalf("destination write: errno %d", rep.errno)
	}
	close(release)
	rep, err := src.readReply()
	if err != nil || rep.cookie != ck {
		t.Fatalf("in-flight reply: %+v %v", rep, err)
	}
	if rep.errno != errPerm {
		t.Fatalf("in-flight fenced write: errno %d, want EPERM", rep.errno)
	}
	if got := dst.readAt(0, 4096); !bytes.Equal(got, pattern(20, 0, 4096)) {
		t.Fatal("the fenced in-flight write was applied")
	}
}

func TestReadOnlyAttachmentOverNBD(t *testing.T) {
	e := newEnv(t, Config{}, nil)
	_, tok := e.attachToken("backup", "ro")
	c := e.connect(t, hsOpts{export: exportRoot + "/" + tok, structured: true})
	if c.flags&tflagReadOnly == 0 {
		t.Fatalf("flags %#x: an ro attachment must be advertised READ_ONLY", c.flags)
	}
	if rep := c.do(writeReq(0, pattern(30, 0, 512))); rep.errno != errPerm {
		t.Fatalf("ro write: errno %d, want EPERM", rep.errno)
	}
	if got := c.readAt(0, 4096); !bytes.Equal(got, pattern(1, 0, 4096)) {
		t.Fatal("ro attachment reads wrong data")
	}
	if w := e.vol.Writer(); w.Epoch != 0 {
		t.Fatalf("ro attachment moved the epoch: %+v", w)
	}
}

// TestDetachClosesConnections: deleting an attachment closes its connections
// within a second, and its token no longer opens exports.
func TestDetachClosesConnections(t *testing.T) {
	e := newEnv(t, Config{}, nil)
	id, tok := e.attachToken("n1", "rw")
	root := e.connect(t, hsOpts{export: exportRoot + "/" + tok, structured: true})
	data := e.connect(t, hsOpts{export: exportData + "/" + tok})
	start := time.Now()
	if err := e.vol.Detach(id); err != nil {
		t.Fatal(err)
	}
	root.expectClosed(time.Second)
	data.expectClosed(time.Second)
	t.Logf("connections closed %v after the detach", time.Since(start))
	c := dial(t, e.addr)
	c.mustGreet(clientFlagFixedNewstyle)
	if reps := c.option(optGo, goData(exportRoot+"/"+tok)); final(reps) != repErrPolicy {
		t.Fatalf("GO with a detached token: %s, want ERR_POLICY", describe(reps))
	}
}

// TestRequireToken: beyond loopback every export needs a token and LIST is
// refused; a wrong token is refused the same way.
func TestRequireToken(t *testing.T) {
	e := newEnv(t, Config{}, func(x Exports) Exports {
		pe := x.(PoolExports)
		pe.RequireToken = true
		return pe
	})
	_, tok := e.attachToken("n1", "rw")
	for _, name := range []string{exportRoot, exportSnap, exportRoot + "/" + "00" + tok[2:], exportRoot + "/x"} {
		c := dial(t, e.addr)
		c.mustGreet(clientFlagFixedNewstyle)
		if reps := c.option(optGo, goData(name)); final(reps) != repErrPolicy {
			t.Errorf("GO %q: %s, want ERR_POLICY", name, describe(reps))
		}
		if reps := c.option(optList, nil); final(reps) != repErrPolicy {
			t.Errorf("LIST: %s, want ERR_POLICY", describe(reps))
		}
		_ = c.nc.Close()
	}
	for _, name := range []string{exportRoot + "/" + tok, exportSnap + "/" + tok} {
		c := e.connect(t, hsOpts{export: name})
		c.readAt(0, 512)
	}
}

// TestTokensAreNotEchoed: errors about export names, which reach option
// replies and logs, never show what follows the second slash, even when the
// name does not parse.
func TestTokensAreNotEchoed(t *testing.T) {
	e := newEnv(t, Config{}, nil)
	_, tok := e.attachToken("n1", "rw")
	for _, name := range []string{exportRoot + "/" + tok + "/", "vm//" + tok, "nope/root/" + tok, exportRoot + "/" + tok[1:]} {
		_, err := PoolExports{Pool: e.pool}.Open(t.Context(), name, "test")
		if err == nil {
			t.Fatalf("Open(%q) succeeded", name)
		}
		if strings.Contains(err.Error(), tok[1:]) {
			t.Errorf("Open error shows the token: %v", err)
		}
		c := dial(t, e.addr)
		c.mustGreet(clientFlagFixedNewstyle)
		for _, r := range c.option(optGo, goData(name)) {
			if bytes.Contains(r.data, []byte(tok[1:])) {
				t.Errorf("GO %q: reply shows the token: %q", name, r.data)
			}
		}
		_ = c.nc.Close()
	}
}

// TestTokenlessQemuImgCannotFenceAnAttachment: the tour's own
// `qemu-img convert -n ... nbd://127.0.0.1:10809/<volume>/<disk>`, run while
// a node's explicit rw attachment writes the volume, must not take the
// writer role from it (issue 14: it fenced the node, whose writes then
// failed with EPERM). The tokenless connection is read-only: qemu-img fails
// and writes nothing, and the node keeps writing at the same epoch.
func TestTokenlessQemuImgCannotFenceAnAttachment(t *testing.T) {
	testfs.RequireTool(t, "qemu-img")
	e := newEnv(t, Config{}, nil)
	id, tok := e.attachToken("node-a", "rw")
	node := e.connect(t, hsOpts{export: exportRoot + "/" + tok, structured: true})
	if rep := node.do(writeReq(0, pattern(20, 0, 4096))); rep.errno != 0 {
		t.Fatalf("node write: errno %d", rep.errno)
	}
	e.wrote("root", 0, pattern(20, 0, 4096))
	img := filepath.Join(t.TempDir(), "debian.img")
	if err := os.WriteFile(img, pattern(21, 0, rootSize), 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := exec.CommandContext(t.Context(), "qemu-img", "convert", "-n", "-f", "raw", "-O", "raw", img,
		"nbd://"+e.addr+"/"+exportRoot).CombinedOutput()
	if err == nil {
		t.Fatalf("qemu-img convert to a volume with an rw attachment succeeded without its token:\n%s", out)
	}
	t.Logf("qemu-img convert without the token: %v: %s", err, bytes.TrimSpace(out))
	if rep := node.do(writeReq(4096, pattern(22, 4096, 4096))); rep.errno != 0 {
		t.Fatalf("the node's write after the tokenless convert: errno %d, want success", rep.errno)
	}
	e.wrote("root", 4096, pattern(22, 4096, 4096))
	if w := e.vol.Writer(); w.Writer != id || w.Epoch != 1 {
		t.Errorf("writer %+v, want %s at epoch 1", w, id)
	}
	e.checkDisk(t, "root", "after the tokenless convert: ")
}
