package nbd

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/quiverstorage/quiver/internal/faultio"
	"github.com/quiverstorage/quiver/internal/pool"
	"github.com/quiverstorage/quiver/internal/storage"
)

// errorLog collects the server's error-level log records.
type errorLog struct {
	mu   sync.Mutex
	recs []string
}

func (l *errorLog) Enabled(_ context.Context, lv slog.Level) bool { return lv >= slog.LevelError }
func (l *errorLog) Handle(_ context.Context, r slog.Record) error {
	var b strings.Builder
	b.WriteString(r.Message)
	r.Attrs(func(a slog.Attr) bool { b.WriteString(" " + a.String()); return true })
	l.mu.Lock()
	l.recs = append(l.recs, b.String())
	l.mu.Unlock()
	return nil
}
func (l *errorLog) WithAttrs([]slog.Attr) slog.Handler { return l }
func (l *errorLog) WithGroup(string) slog.Handler      { return l }

// waitFor waits until a record containing all of words is logged.
func (l *errorLog) waitFor(t *testing.T, words ...string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		l.mu.Lock()
		for _, r := range l.recs {
			all := true
			for _, w := range words {
				all = all && strings.Contains(r, w)
			}
			if all {
				l.mu.Unlock()
				return
			}
		}
		l.mu.Unlock()
		time.Sleep(5 * time.Millisecond)
	}
	t.Fatalf("no error logged with %q; logged: %q", words, l.recs)
}

// TestFailedFlushIsStickyOverNBD: one failed fdatasync fails that FLUSH
// and every later FLUSH and FUA write of the disk, on every connection to
// it, although the storage's next fdatasync would succeed; other disks are
// unaffected. Once every connection to the disk is gone a new one finds it
// reopened and its flushes work.
func TestFailedFlushIsStickyOverNBD(t *testing.T) {
	fio := faultio.New(osFS(t))
	e := newEnvWith(t, Config{}, nil, pool.Options{FS: fio})
	c1 := e.connect(t, hsOpts{export: exportRoot})
	c2 := e.connect(t, hsOpts{export: exportRoot})
	other := e.connect(t, hsOpts{export: exportData})
	if rep := c1.do(writeReq(0, pattern(7, 0, 4096))); rep.errno != 0 {
		t.Fatalf("write: errno %d (%s)", rep.errno, rep.msg)
	}
	fio.FailSync(1, syscall.EIO)
	fua := withPayload(testReq{typ: cmdWrite, flags: cmdFlagFUA, off: 8192, length: 4096}, 8)
	for i, step := range []struct {
		c   *testClient
		req testReq
	}{
		{c1, testReq{typ: cmdFlush}}, // the one that fails in the storage
		{c1, testReq{typ: cmdFlush}},
		{c2, testReq{typ: cmdFlush}},
		{c2, fua},
		{c1, fua},
	} {
		if rep := step.c.do(step.req); rep.errno != errIO {
			t.Errorf("step %d, %s: errno %d, want EIO (%s)", i, reqString(step.req), rep.errno, rep.msg)
		}
	}
	if fio.Failures() != 1 {
		t.Fatalf("%d faults injected, want 1", fio.Failures())
	}
	if rep := other.do(testReq{typ: cmdFlush}); rep.errno != 0 {
		t.Errorf("flush of another disk: errno %d (%s)", rep.errno, rep.msg)
	}
	c1.nc.Close()
	c2.nc.Close()
	other.nc.Close()
	e.waitIdle()
	c3 := e.connect(t, hsOpts{export: exportRoot})
	if rep := c3.do(fua); rep.errno != 0 {
		t.Errorf("FUA write once the disk is reopened: errno %d (%s)", rep.errno, rep.msg)
	}
	if rep := c3.do(testReq{typ: cmdFlush}); rep.errno != 0 {
		t.Errorf("flush once the disk is reopened: errno %d (%s)", rep.errno, rep.msg)
	}
}

// TestFlushOnDisconnectReportsFailure: a client that goes away with
// unflushed writes while the storage fails gets them flushed by the server,
// and the failure is logged at error level, not dropped.
func TestFlushOnDisconnectReportsFailure(t *testing.T) {
	fio := faultio.New(osFS(t))
	log := &errorLog{}
	e := newEnvWith(t, Config{Logger: slog.New(log)}, nil, pool.Options{FS: fio})
	c := e.connect(t, hsOpts{export: exportRoot})
	if rep := c.do(writeReq(0, pattern(7, 0, 4096))); rep.errno != 0 {
		t.Fatalf("write: errno %d (%s)", rep.errno, rep.msg)
	}
	fio.FailSync(1, syscall.EIO)
	c.nc.Close()
	e.waitIdle()
	if fio.Failures() != 1 {
		t.Fatalf("%d faults injected, want 1: the server did not flush on disconnect", fio.Failures())
	}
	log.waitFor(t, "flush on disconnect failed", exportRoot, "input/output error")
}

// TestRemovedDiskOverNBD: a connection holds the disk it opened, not its
// name. When the disk is removed its requests fail with EIO; when a disk of
// the same name is added, the old connection still fails and none of its
// writes reaches the new disk.
func TestRemovedDiskOverNBD(t *testing.T) {
	e := newEnv(t, Config{}, nil)
	ctx := context.Background()
	c := e.connect(t, hsOpts{export: exportData})
	if rep := c.do(writeReq(0, pattern(3, 0, 4096))); rep.errno != 0 {
		t.Fatalf("write: errno %d (%s)", rep.errno, rep.msg)
	}
	if _, err := e.vol.RemoveDiskWith(ctx, "data", true); err != nil { // forced: its writer is connected
		t.Fatal(err)
	}
	if rep := c.do(writeReq(4096, pattern(4, 4096, 4096))); rep.errno != errIO {
		t.Errorf("write to the removed disk: errno %d, want EIO (%s)", rep.errno, rep.msg)
	}
	if _, err := e.vol.AddDisk(ctx, pool.DiskSpec{Name: "data", Size: dataSize}); err != nil {
		t.Fatal(err)
	}
	e.model["data"] = make([]byte, dataSize)
	for _, req := range []testReq{
		writeReq(0, pattern(5, 0, 4096)),
		withPayload(testReq{typ: cmdWrite, flags: cmdFlagFUA, off: 65536, length: 4096}, 6),
		{typ: cmdWriteZeroes, flags: cmdFlagNoHole, off: 0, length: 4096},
		{typ: cmdRead, off: 0, length: 4096},
		{typ: cmdFlush},
	} {
		if rep := c.do(req); rep.errno != errIO {
			t.Errorf("%s on the old connection after the disk was added again: errno %d, want EIO (%s)",
				reqString(req), rep.errno, rep.msg)
		}
	}
	if got := e.content("data"); !bytes.Equal(got, e.model["data"]) {
		t.Errorf("the new disk holds data from the old connection at offset %d", firstDiff(got, e.model["data"]))
	}
	fresh := e.connect(t, hsOpts{export: exportData})
	if rep := fresh.do(writeReq(0, pattern(9, 0, 4096))); rep.errno != 0 {
		t.Errorf("write on a new connection to the new disk: errno %d (%s)", rep.errno, rep.msg)
	}
}

// osFS returns the operating system's storage layer rooted at a new
// temporary directory, for a twin to wrap; the pool then lives there.
func osFS(t *testing.T) storage.FS {
	t.Helper()
	fsys, err := storage.OpenOS(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	return fsys
}
