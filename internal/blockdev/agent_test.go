package blockdev

import (
	"context"
	"errors"
	"math/rand/v2"
	"net"
	"net/http"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// fakeDevices records the calls that reach it and answers with err.
type fakeDevices struct {
	mu    sync.Mutex
	calls []string
	err   error
}

func (f *fakeDevices) record(call string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls = append(f.calls, call)
	return f.err
}

func (f *fakeDevices) Attach(_ context.Context, fuseDir, file, uri string, ro bool) (string, int, error) {
	return "/dev/loop7", 4242, f.record("attach " + fuseDir + " " + file + " " + uri)
}

func (f *fakeDevices) Detach(_ context.Context, fuseDir, file, loop string, pid int) error {
	return f.record("detach " + fuseDir + " " + loop)
}

func (f *fakeDevices) Healthy(_ context.Context, fuseDir, file, loop string, pid int) (bool, error) {
	return true, f.record("healthy " + fuseDir)
}

func (f *fakeDevices) count() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.calls)
}

// startAgent serves an agent over a unix socket and returns its client.
func startAgent(t *testing.T, root string, dev Devices) *Client {
	t.Helper()
	sock := filepath.Join(t.TempDir(), "agent.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: (&Agent{Root: root, Devices: dev}).Handler()}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	return NewClient(sock)
}

// TestAgentRefusesBadRequests: nothing outside the root, no path tricks,
// no foreign URI schemes, no device that is not a loop device reaches the
// devices; each refusal is ErrBadRequest at the client, and never echoes
// the URI (it holds an attachment token).
func TestAgentRefusesBadRequests(t *testing.T) {
	root := "/var/lib/quiver-csi/fuse"
	dev := &fakeDevices{}
	c := startAgent(t, root, dev)
	ctx := t.Context()
	const uri = "nbd://10.0.0.1:10809/vm/root/SECRETTOKEN"
	attach := []struct{ name, fuseDir, file, uri string }{
		{"relative dir", "fuse/vm", "root", uri},
		{"dir outside root", "/tmp/vm", "root", uri},
		{"dir is root", root, "root", uri},
		{"nested dir", root + "/a/b", "root", uri},
		{"dot dot dir", root + "/../etc", "root", uri},
		{"unclean dir", root + "//vm", "root", uri},
		{"dir with trailing slash", root + "/vm/", "root", uri},
		{"file with slash", root + "/vm", "../root", uri},
		{"file dot dot", root + "/vm", "..", uri},
		{"empty file", root + "/vm", "", uri},
		{"file with NUL", root + "/vm", "ro\x00ot", uri},
		{"long file", root + "/vm", strings.Repeat("a", 256), uri},
		{"file URI", root + "/vm", "root", "file:///etc/shadow?SECRETTOKEN"},
		{"http URI", root + "/vm", "root", "http://10.0.0.1/SECRETTOKEN"},
		{"no URI", root + "/vm", "root", ""},
		{"not a URI", root + "/vm", "root", "nbd://[::1/SECRETTOKEN"},
	}
	for _, tc := range attach {
		t.Run("attach "+tc.name, func(t *testing.T) {
			_, _, err := c.Attach(ctx, tc.fuseDir, tc.file, tc.uri, false)
			if !errors.Is(err, ErrBadRequest) {
				t.Fatalf("want ErrBadRequest, got %v", err)
			}
			if strings.Contains(err.Error(), "SECRETTOKEN") {
				t.Errorf("the refusal echoes the URI's token: %v", err)
			}
		})
	}
	detach := []struct {
		name, fuseDir, loop string
		pid                 int
	}{
		{"loop not a loop device", root + "/vm", "/dev/sda", 0},
		{"loop path trick", root + "/vm", "/dev/loop0/../sda", 0},
		{"negative pid", root + "/vm", "/dev/loop0", -1},
		{"dir outside root", "/", "/dev/loop0", 10},
	}
	for _, tc := range detach {
		t.Run("detach "+tc.name, func(t *testing.T) {
			if err := c.Detach(ctx, tc.fuseDir, "root", tc.loop, tc.pid); !errors.Is(err, ErrBadRequest) {
				t.Fatalf("want ErrBadRequest, got %v", err)
			}
		})
	}
	if n := dev.count(); n != 0 {
		t.Fatalf("%d refused requests reached the devices: %v", n, dev.calls)
	}
}

// TestAgentForwards: good requests reach the devices and their answers and
// errors come back through the client, mapped once.
func TestAgentForwards(t *testing.T) {
	root := "/var/lib/quiver-csi/fuse"
	dev := &fakeDevices{}
	c := startAgent(t, root, dev)
	ctx := t.Context()
	loop, pid, err := c.Attach(ctx, root+"/vm1", "root", "nbd+unix:///vm1/root?socket=/run/q.sock", true)
	if err != nil || loop != "/dev/loop7" || pid != 4242 {
		t.Fatalf("attach: %q %d %v", loop, pid, err)
	}
	if ok, err := c.Healthy(ctx, root+"/vm1", "root", loop, pid); !ok || err != nil {
		t.Fatalf("healthy: %v %v", ok, err)
	}
	if err := c.Detach(ctx, root+"/vm1", "root", loop, pid); err != nil {
		t.Fatal(err)
	}
	if dev.count() != 3 {
		t.Fatalf("calls: %v", dev.calls)
	}
	dev.err = ErrNoTool
	if _, _, err := c.Attach(ctx, root+"/vm2", "root", "nbd://127.0.0.1:10809/vm2/root", false); !errors.Is(err, ErrNoTool) {
		t.Fatalf("a missing tool at the agent: %v", err)
	}
	dev.err = errors.New("losetup failed")
	if err := c.Detach(ctx, root+"/vm2", "root", "", 0); err == nil || !strings.Contains(err.Error(), "losetup failed") {
		t.Fatalf("a failure at the agent: %v", err)
	}
}

// TestAgentLocksPerDirectory: requests on one FUSE directory run one at a
// time, requests on others do not wait for them, and a directory's lock is
// dropped once no request holds or waits for it.
func TestAgentLocksPerDirectory(t *testing.T) {
	a := &Agent{Root: "/r"}
	unlock1 := a.lock("/r/vm1")
	got := make(chan struct{})
	go func() {
		unlock := a.lock("/r/vm1")
		close(got)
		unlock()
	}()
	other := a.lock("/r/vm2") // another directory: not held up
	other()
	select {
	case <-got:
		t.Fatal("a second request on /r/vm1 ran while the first held it")
	case <-time.After(50 * time.Millisecond):
	}
	unlock1()
	select {
	case <-got:
	case <-time.After(10 * time.Second):
		t.Fatal("the second request on /r/vm1 never ran")
	}
	for range 1000 {
		a.lock("/r/vm" + strconv.Itoa(rand.IntN(1<<20)))()
	}
	deadline := time.Now().Add(10 * time.Second)
	for a.lockedDirs() != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("%d directory locks left after every request ended", a.lockedDirs())
		}
		time.Sleep(time.Millisecond)
	}
}

// TestClientAgentDown: an agent that does not answer is an error, never
// "unhealthy" (which would make the node plugin undo a staging).
func TestClientAgentDown(t *testing.T) {
	c := NewClient(filepath.Join(t.TempDir(), "none.sock"))
	ok, err := c.Healthy(t.Context(), "/x/fuse/vm", "root", "/dev/loop0", 1)
	if ok || !errors.Is(err, ErrAgentUnreachable) {
		t.Fatalf("healthy with no agent: %v %v", ok, err)
	}
}
