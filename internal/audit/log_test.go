package audit

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/quiverstorage/quiver/internal/api"
	"github.com/quiverstorage/quiver/internal/storage"
)

func openFS(t *testing.T) (storage.FS, string) {
	t.Helper()
	dir := t.TempDir()
	fsys, err := storage.OpenOS(dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { fsys.Close() })
	return fsys, dir
}

func event(i int) api.Event {
	return api.Event{Time: time.Unix(1700000000+int64(i), 0).UTC(), Method: "DELETE", Route: "DELETE /v1/volumes/{volume}",
		Names: map[string]string{"volume": fmt.Sprintf("vm-%04d", i)}, Status: 204,
		Who: api.EventWho{TokenID: "tk-0123456789ab", Role: "admin", Remote: "127.0.0.1"}}
}

// TestRotationBounds: 1,000 events through 3 files of 4 KiB: never more
// than 3 files, none over 4 KiB, the newest events readable in order with
// no gap, the oldest gone; numbering goes on after a reopen.
func TestRotationBounds(t *testing.T) {
	fsys, dir := openFS(t)
	opts := Options{MaxFileBytes: 4096, MaxFiles: 3}
	l, err := Open(fsys, opts)
	if err != nil {
		t.Fatal(err)
	}
	const n = 1000
	for i := 1; i <= n; i++ {
		if err := l.Append(event(i)); err != nil {
			t.Fatal(err)
		}
		es, err := os.ReadDir(filepath.Join(dir, Dir))
		if err != nil {
			t.Fatal(err)
		}
		if len(es) > opts.MaxFiles {
			t.Fatalf("after %d events: %d files, want at most %d", i, len(es), opts.MaxFiles)
		}
		for _, e := range es {
			fi, _ := e.Info()
			if fi.Size() > opts.MaxFileBytes {
				t.Fatalf("after %d events: %s has %d bytes, over %d", i, e.Name(), fi.Size(), opts.MaxFileBytes)
			}
		}
	}
	evs, err := l.Read(Query{})
	if err != nil {
		t.Fatal(err)
	}
	if len(evs) == 0 || len(evs) >= n/2 {
		t.Fatalf("%d events kept of %d in 3 files of 4 KiB", len(evs), n)
	}
	for i, ev := range evs {
		want := int64(n - len(evs) + 1 + i)
		if ev.Seq != want || ev.Names["volume"] != fmt.Sprintf("vm-%04d", want) {
			t.Fatalf("event %d: seq %d volume %s, want seq %d", i, ev.Seq, ev.Names["volume"], want)
		}
	}
	last, err := l.Read(Query{Limit: 5, Keep: func(ev api.Event) bool { return ev.Seq%2 == 0 }})
	if err != nil || len(last) != 5 || last[4].Seq != n || last[0].Seq != n-8 {
		t.Fatalf("last 5 even: %v %+v", err, last)
	}
	after, err := l.Read(Query{After: n - 3})
	if err != nil || len(after) != 3 {
		t.Fatalf("after %d: %v %d events", n-3, err, len(after))
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	l, err = Open(fsys, opts)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if err := l.Append(event(n + 1)); err != nil {
		t.Fatal(err)
	}
	evs, _ = l.Read(Query{After: n})
	if len(evs) != 1 || evs[0].Seq != n+1 {
		t.Fatalf("after a reopen: %+v, want seq %d", evs, n+1)
	}
}

// TestPartialLineCut: a line cut short at the end of the current file (a
// crash in a write) is dropped at Open, and the next event is whole.
func TestPartialLineCut(t *testing.T) {
	fsys, dir := openFS(t)
	l, err := Open(fsys, Options{})
	if err != nil {
		t.Fatal(err)
	}
	for i := 1; i <= 2; i++ {
		if err := l.Append(event(i)); err != nil {
			t.Fatal(err)
		}
	}
	l.Close()
	f, err := os.OpenFile(filepath.Join(dir, Dir, current), os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatal(err)
	}
	f.WriteString(`{"seq":3,"time":"2023-`)
	f.Close()
	l, err = Open(fsys, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if err := l.Append(event(3)); err != nil {
		t.Fatal(err)
	}
	evs, err := l.Read(Query{})
	if err != nil || len(evs) != 3 || evs[2].Seq != 3 || evs[2].Names["volume"] != "vm-0003" {
		t.Fatalf("%v %+v", err, evs)
	}
	data, _ := os.ReadFile(filepath.Join(dir, Dir, current))
	if strings.Count(string(data), "\n") != 3 || strings.Contains(string(data), `"2023-{`) {
		t.Fatalf("file:\n%s", data)
	}
}

// TestLongNamesCut: a name is cut at MaxName, so one event stays small
// whatever a client puts in its path.
func TestLongNamesCut(t *testing.T) {
	fsys, _ := openFS(t)
	l, err := Open(fsys, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	ev := event(1)
	ev.Names["volume"] = strings.Repeat("x", 10000)
	if err := l.Append(ev); err != nil {
		t.Fatal(err)
	}
	evs, _ := l.Read(Query{})
	if len(evs) != 1 || len(evs[0].Names["volume"]) != MaxName {
		t.Fatalf("%d events, name of %d bytes", len(evs), len(evs[0].Names["volume"]))
	}
}

func TestOptionsBounds(t *testing.T) {
	fsys, _ := openFS(t)
	for _, o := range []Options{{MaxFiles: 1}, {MaxFileBytes: 100}} {
		if _, err := Open(fsys, o); err == nil {
			t.Errorf("%+v accepted", o)
		}
	}
}
