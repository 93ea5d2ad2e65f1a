package endpoint

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/quiverstorage/quiver/internal/api"
	"github.com/quiverstorage/quiver/internal/client"
	"github.com/quiverstorage/quiver/internal/nbd"
	"github.com/quiverstorage/quiver/internal/nbdclient"
	"github.com/quiverstorage/quiver/internal/pool"
)

const mib = 1 << 20

func quiet() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// storageNode is a pool with volume "vm" (disks "disk" and "data") served
// over NBD on loopback with tokens required, as a cluster node serves it,
// and an attachment's token.
type storageNode struct {
	pool  *pool.Pool
	addr  string
	token string
}

func startStorageNode(t *testing.T) storageNode {
	t.Helper()
	ctx := context.Background()
	p, err := pool.Open(ctx, t.TempDir(), quiet())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	_, _, err = p.Create(ctx, pool.VolumeSpec{Name: "vm", Capacity: 4 * mib,
		Disks: []pool.DiskSpec{{Name: "disk", Size: mib}, {Name: "data", Size: 2 * mib}}})
	if err != nil {
		t.Fatal(err)
	}
	v, err := p.Volume("vm")
	if err != nil {
		t.Fatal(err)
	}
	a, _, err := v.Attach("compute-1", pool.ModeReadWrite)
	if err != nil {
		t.Fatal(err)
	}
	cfg := nbd.DefaultConfig()
	cfg.Logger = quiet()
	srv := nbd.NewServer(nbd.PoolExports{Pool: p, RequireToken: true}, cfg)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(ln)
	t.Cleanup(func() { _ = srv.Shutdown(context.Background()) })
	return storageNode{pool: p, addr: ln.Addr().String(), token: a.Token}
}

// fakeAPI answers GET /v1/volumes/vm/primary with the NBD address it holds
// ("" answers 503 Unavailable, as a node does during a failover), and
// counts the questions.
type fakeAPI struct {
	nbd   atomic.Value // string
	asked atomic.Int64
	url   string
}

func startFakeAPI(t *testing.T, addr string) *fakeAPI {
	f := &fakeAPI{}
	f.nbd.Store(addr)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		f.asked.Add(1)
		w.Header().Set("Content-Type", "application/json")
		if r.URL.Path != "/v1/volumes/vm/primary" {
			w.WriteHeader(http.StatusNotFound)
			json.NewEncoder(w).Encode(api.ErrorBody{Error: api.Error{Code: api.CodeNotFound, Message: "volume not found"}})
			return
		}
		addr := f.nbd.Load().(string)
		if addr == "" {
			w.WriteHeader(http.StatusServiceUnavailable)
			json.NewEncoder(w).Encode(api.ErrorBody{Error: api.Error{Code: api.CodeUnavailable, Message: "no primary now"}})
			return
		}
		json.NewEncoder(w).Encode(api.Primary{Volume: "vm", Node: "n1", NBD: addr, Term: 1})
	}))
	t.Cleanup(srv.Close)
	f.url = srv.URL
	return f
}

// deadURL is the URL of an API that refuses connections (a storage node
// that died).
func deadURL(t *testing.T) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	return "http://" + addr
}

func locator(t *testing.T, urls ...string) *Locator {
	var cs []*client.Client
	for _, u := range urls {
		c, err := client.New(u)
		if err != nil {
			t.Fatal(err)
		}
		cs = append(cs, c)
	}
	return NewLocator(cs...)
}

func openEndpoint(t *testing.T, root string, loc *Locator) *Endpoint {
	t.Helper()
	cfg := nbd.DefaultConfig()
	e, err := Open(Config{Root: root, Locator: loc, NBD: cfg, Log: quiet()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e.Close)
	t.Cleanup(func() {
		// Immutable placeholders would stop TempDir's removal.
		dirs, _ := filepath.Glob(filepath.Join(root, "volumes", "*"))
		for _, d := range dirs {
			_ = RemovePlaceholder(d)
		}
	})
	return e
}

// dialSocket opens export on the endpoint's unix socket.
func dialSocket(t *testing.T, sock, export string) (*nbdclient.Conn, error) {
	t.Helper()
	return nbdclient.Dial(context.Background(), sock, export, nbdclient.Options{Timeout: 10 * time.Second,
		Dial: func(ctx context.Context, _, addr string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", addr)
		}})
}

func vmVolume(token string) Volume {
	return Volume{Name: "vm", Token: token, Disks: []Disk{{Name: "disk", Size: mib}, {Name: "data", Size: 2 * mib}}}
}

// TestPublishServesEveryDisk publishes a volume with the first storage
// node's API dead: the endpoint asks the next one, serves each disk by
// name on the volume's socket (0666 in a 0755 directory, with the
// manifest), and a write through it is on the storage node's disk after a
// flush. A disk the publication does not name is refused.
func TestPublishServesEveryDisk(t *testing.T) {
	sn := startStorageNode(t)
	f := startFakeAPI(t, sn.addr)
	e := openEndpoint(t, t.TempDir(), locator(t, deadURL(t), f.url))
	pub, err := e.Publish(context.Background(), vmVolume(sn.token))
	if err != nil {
		t.Fatal(err)
	}
	if pub.Socket != filepath.Join(pub.Dir, SocketName) {
		t.Fatalf("published %+v", pub)
	}
	for path, want := range map[string]os.FileMode{pub.Dir: 0o755, pub.Socket: 0o666, filepath.Join(pub.Dir, ManifestName): 0o644} {
		fi, err := os.Stat(path)
		if err != nil {
			t.Fatal(err)
		}
		if fi.Mode().Perm() != want {
			t.Errorf("%s: mode %v, want %v", path, fi.Mode().Perm(), want)
		}
	}
	var m Manifest
	b, err := os.ReadFile(filepath.Join(pub.Dir, ManifestName))
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, &m); err != nil || m.Volume != "vm" || m.Socket != SocketName || len(m.Disks) != 2 || m.Disks[1] != (Disk{"data", 2 * mib}) {
		t.Fatalf("manifest %s: %+v %v", b, m, err)
	}
	if strings.Contains(string(b), sn.token) {
		t.Fatal("the manifest holds the token")
	}

	c, err := dialSocket(t, pub.Socket, "data")
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if c.Size() != 2*mib {
		t.Fatalf("data: %d bytes, want %d", c.Size(), 2*mib)
	}
	msg := bytes.Repeat([]byte("endpoint"), 512)
	if err := c.WriteAt(msg, 4096, false); err != nil {
		t.Fatal(err)
	}
	if err := c.Flush(); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, len(msg))
	direct, err := nbdclient.Dial(context.Background(), sn.addr, "vm/data/"+sn.token, nbdclient.Options{Timeout: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer direct.Close()
	if err := direct.ReadAt(got, 4096); err != nil || !bytes.Equal(got, msg) {
		t.Fatalf("the storage node's disk after the write: %v %q", err, got[:16])
	}
	// The first disk under the default name.
	c0, err := dialSocket(t, pub.Socket, "")
	if err != nil || c0.Size() != mib {
		t.Fatalf("default export: %v", err)
	}
	c0.Close()
	if _, err := dialSocket(t, pub.Socket, "logs"); !errors.Is(err, nbdclient.ErrRefused) {
		t.Fatalf("a disk not published: %v, want a refusal", err)
	}
	// The token is not in what List shows.
	for _, s := range e.List() {
		if s.Token != "" {
			t.Fatalf("List shows the token: %+v", s)
		}
	}
}

// TestRestartServesAgain closes an endpoint and opens another on its root:
// the publication is served again on the same socket path without being
// published again, and Unpublish removes the socket, the directory and
// the record, so a third endpoint serves nothing.
func TestRestartServesAgain(t *testing.T) {
	sn := startStorageNode(t)
	f := startFakeAPI(t, sn.addr)
	root := t.TempDir()
	e := openEndpoint(t, root, locator(t, f.url))
	pub, err := e.Publish(context.Background(), vmVolume(sn.token))
	if err != nil {
		t.Fatal(err)
	}
	e.Close()
	if _, err := dialSocket(t, pub.Socket, "disk"); err == nil {
		t.Fatal("a closed endpoint still serves")
	}
	e2 := openEndpoint(t, root, locator(t, f.url))
	c, err := dialSocket(t, pub.Socket, "disk")
	if err != nil {
		t.Fatalf("after a restart: %v", err)
	}
	if err := c.WriteAt([]byte("again"), 0, true); err != nil {
		t.Fatal(err)
	}
	c.Close()
	// Publishing the same again is the same answer.
	if again, err := e2.Publish(context.Background(), vmVolume(sn.token)); err != nil || again != pub {
		t.Fatalf("publish again: %+v %v, want %+v", again, err, pub)
	}
	if err := e2.Unpublish(context.Background(), "vm"); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(pub.Dir); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the volume's directory after unpublish: %v", err)
	}
	if err := e2.Unpublish(context.Background(), "vm"); err != nil {
		t.Fatalf("unpublish again: %v", err)
	}
	e2.Close()
	e3 := openEndpoint(t, root, locator(t, f.url))
	if n := len(e3.List()); n != 0 {
		t.Fatalf("a third endpoint serves %d volumes, want 0", n)
	}
}

// TestLocator asks the storage nodes in turn: a dead node is skipped, the
// node that answered is asked first next time, and an API's own answer
// (no primary now) ends the search with that answer.
func TestLocator(t *testing.T) {
	f := startFakeAPI(t, "10.0.0.1:10809")
	dead := deadURL(t)
	loc := locator(t, dead, f.url)
	pr, err := loc.Primary(context.Background(), "vm")
	if err != nil || pr.NBD != "10.0.0.1:10809" {
		t.Fatalf("primary: %+v %v", pr, err)
	}
	f.nbd.Store("")
	asked := f.asked.Load()
	if _, err := loc.Primary(context.Background(), "vm"); client.Code(err) != api.CodeUnavailable {
		t.Fatalf("no primary now: %v, want %s", err, api.CodeUnavailable)
	}
	if f.asked.Load() != asked+1 {
		t.Fatal("the node that answered last was not asked first")
	}
	if _, err := locator(t, dead).Primary(context.Background(), "vm"); err == nil || !strings.Contains(err.Error(), "no storage node answered") {
		t.Fatalf("every node dead: %v", err)
	}
}

// TestPublishRefusesBadInput sends malformed publications through the
// control API: each is a 400 with a message, and nothing is made on disk.
func TestPublishRefusesBadInput(t *testing.T) {
	root := t.TempDir()
	e := openEndpoint(t, root, locator(t, deadURL(t)))
	srv := httptest.NewServer(e.Handler(nil))
	defer srv.Close()
	long := strings.Repeat("a", 600)
	for name, tc := range map[string]struct{ path, body string }{
		"upper case":    {"/v1/volumes/VM", `{"name":"VM","token":"t","disks":[{"name":"disk"}]}`},
		"names differ":  {"/v1/volumes/vm", `{"name":"other","token":"t","disks":[{"name":"disk"}]}`},
		"no token":      {"/v1/volumes/vm", `{"name":"vm","disks":[{"name":"disk"}]}`},
		"token with /":  {"/v1/volumes/vm", `{"name":"vm","token":"a/b","disks":[{"name":"disk"}]}`},
		"long token":    {"/v1/volumes/vm", `{"name":"vm","token":"` + long + `","disks":[{"name":"disk"}]}`},
		"no disk":       {"/v1/volumes/vm", `{"name":"vm","token":"t","disks":[]}`},
		"disk twice":    {"/v1/volumes/vm", `{"name":"vm","token":"t","disks":[{"name":"d"},{"name":"d"}]}`},
		"bad disk":      {"/v1/volumes/vm", `{"name":"vm","token":"t","disks":[{"name":"../d"}]}`},
		"unknown field": {"/v1/volumes/vm", `{"name":"vm","token":"t","disks":[{"name":"d"}],"x":1}`},
		"not JSON":      {"/v1/volumes/vm", `{`},
		"negative size": {"/v1/volumes/vm", `{"name":"vm","token":"t","disks":[{"name":"d","size":-1}]}`},
		"bad export":    {"/v1/volumes/vm", `{"name":"vm","export":"a/b","token":"t","disks":[{"name":"d"}]}`},
		"oversize body": {"/v1/volumes/vm", `{"name":"vm","token":"` + strings.Repeat("x", maxBody) + `"}`},
	} {
		req, _ := http.NewRequest(http.MethodPut, srv.URL+tc.path, strings.NewReader(tc.body))
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		var ce controlError
		json.NewDecoder(resp.Body).Decode(&ce)
		resp.Body.Close()
		if resp.StatusCode != http.StatusBadRequest || ce.Code != "Invalid" || ce.Error == "" {
			t.Errorf("%s: %d %+v, want 400 Invalid with a message", name, resp.StatusCode, ce)
		}
	}
	for _, d := range []string{"state", "volumes"} {
		ents, _ := os.ReadDir(filepath.Join(root, d))
		if len(ents) != 0 {
			t.Errorf("%s/ holds %d entries after bad input, want none", d, len(ents))
		}
	}
}

// TestPlaceholder: a published volume's directory holds an empty disk.img
// that cannot be written (immutable: a VM started without the hook fails
// rather than write a local file), and unpublishing removes it.
func TestPlaceholder(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("FS_IMMUTABLE_FL needs root")
	}
	sn := startStorageNode(t)
	f := startFakeAPI(t, sn.addr)
	e := openEndpoint(t, t.TempDir(), locator(t, f.url))
	pub, err := e.Publish(context.Background(), vmVolume(sn.token))
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(pub.Dir, PlaceholderName)
	fi, err := os.Stat(path)
	if err != nil || fi.Size() != 0 {
		t.Fatalf("placeholder: %v %v", fi, err)
	}
	if w, err := os.OpenFile(path, os.O_WRONLY, 0); err == nil {
		w.Close()
		t.Fatal("root opened the placeholder for writing: it is not immutable")
	}
	if err := e.Unpublish(context.Background(), "vm"); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(pub.Dir); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("directory after unpublish: %v", err)
	}
}

// TestUnknownVolumeRefusedAtOnce: when the storage nodes answer that the
// volume is unknown (deleted while published), a client's open on the
// socket is refused at once, not after forward's retries (90 s).
func TestUnknownVolumeRefusedAtOnce(t *testing.T) {
	sn := startStorageNode(t)
	f := startFakeAPI(t, sn.addr)
	e := openEndpoint(t, t.TempDir(), locator(t, f.url))
	v := vmVolume(sn.token)
	v.Name = "gone" // the fake API knows only vm
	pub, err := e.Publish(context.Background(), v)
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if _, err := dialSocket(t, pub.Socket, "disk"); !errors.Is(err, nbdclient.ErrRefused) {
		t.Fatalf("open of an unknown volume's disk: %v, want a refusal", err)
	}
	if took := time.Since(start); took > 5*time.Second {
		t.Fatalf("the refusal took %v", took)
	}
}
