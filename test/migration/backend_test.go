package migration

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/quiverstorage/quiver/internal/api"
	"github.com/quiverstorage/quiver/internal/testfs"
	"github.com/quiverstorage/quiver/internal/testserver"
)

// A ppBackend serves the guest's disks to the QEMUs of a ping-pong run
// (TestMigrationPingPong): quiver, with attachment tokens as in production
// or tokenless as in issue 12's report, or another NBD server as a control.
type ppBackend interface {
	// boot prepares fresh, empty disks for boot number n.
	boot(t *testing.T, ctx context.Context, n int) ppBoot
}

// ppBoot is the disks of one boot of the guest.
type ppBoot interface {
	// config is the QEMU configuration of generation gen (0 boots the
	// guest, each migration starts the next), name naming its files.
	config(t *testing.T, ctx context.Context, gen int, v vmConfig) vmConfig
	// released says that the QEMU of generation gen has quit.
	released(t *testing.T, ctx context.Context, gen int)
	// read returns a disk's contents, every QEMU having quit.
	read(t *testing.T, ctx context.Context, disk string) []byte
	// end ends the boot's servers, if it has any of its own.
	end()
}

// ppBackends are the backends by the names QUIVER_MIGRATION_BACKEND takes.
var ppBackends = map[string]func(t *testing.T, dir string) ppBackend{
	"quiver":           func(t *testing.T, dir string) ppBackend { return newQuiverBackend(t, dir, true) },
	"quiver-tokenless": func(t *testing.T, dir string) ppBackend { return newQuiverBackend(t, dir, false) },
	"nbdkit-file":      newNbdkitFileBackend,
	"nbdkit-memory":    func(t *testing.T, dir string) ppBackend { return &perDiskBackend{dir: dir, kind: "nbdkit-memory"} },
	"qemu-nbd":         func(t *testing.T, dir string) ppBackend { return &perDiskBackend{dir: dir, kind: "qemu-nbd"} },
}

// quiverBackend is a quiver server; each boot has a volume of its own. With
// tokens every generation attaches as a node of its own and the previous
// one is detached once it has quit, as KubeVirt does; without, every QEMU
// connects tokenless (one implicit writer group: nobody is fenced).
type quiverBackend struct {
	t      *testing.T
	srv    *server
	tokens bool
	dir    string
}

func newQuiverBackend(t *testing.T, dir string, tokens bool) ppBackend {
	var args []string
	if tokens {
		args = []string{"--nbd-require-token"}
	}
	p := testserver.StartT(t, quiverBin, testserver.Options{NBDSocket: filepath.Join(dir, "nbd.sock"), Args: args})
	return &quiverBackend{t: t, srv: &server{Process: p, api: p.API, socket: p.Socket}, tokens: tokens, dir: dir}
}

func (b *quiverBackend) boot(t *testing.T, ctx context.Context, n int) ppBoot {
	vol := fmt.Sprintf("pp%d", n)
	spec := api.VolumeSpec{Name: vol, Capacity: diskSize * int64(len(guestDisks))}
	for _, d := range guestDisks {
		spec.Disks = append(spec.Disks, api.DiskSpec{Name: d, Size: diskSize})
	}
	if _, err := b.srv.api.CreateVolume(ctx, spec); err != nil {
		t.Fatalf("create volume %s: %v", vol, err)
	}
	return &quiverBoot{b: b, vol: vol, atts: map[int]api.Attachment{}}
}

type quiverBoot struct {
	b    *quiverBackend
	vol  string
	atts map[int]api.Attachment
}

func (q *quiverBoot) export(disk string, a *api.Attachment) string {
	if a == nil {
		return q.vol + "/" + disk
	}
	return q.vol + "/" + disk + "/" + a.Token
}

func (q *quiverBoot) config(t *testing.T, ctx context.Context, gen int, v vmConfig) vmConfig {
	var att *api.Attachment
	if q.b.tokens {
		a, err := q.b.srv.api.Attach(ctx, q.vol, api.AttachmentSpec{Node: fmt.Sprintf("g%d", gen), Mode: api.ModeReadWrite})
		if err != nil {
			t.Fatalf("attach %s: %v", q.vol, err)
		}
		q.atts[gen] = a
		att = &a
	}
	v.nbdSocket = q.b.srv.socket
	v.exports = map[string]string{}
	for _, d := range guestDisks {
		v.exports[d] = q.export(d, att)
	}
	return v
}

func (q *quiverBoot) released(t *testing.T, ctx context.Context, gen int) {
	if a, ok := q.atts[gen]; ok {
		if err := q.b.srv.api.Detach(ctx, q.vol, a.ID); err != nil {
			t.Errorf("detach %s generation %d: %v", q.vol, gen, err)
		}
		delete(q.atts, gen)
	}
}

func (q *quiverBoot) read(t *testing.T, ctx context.Context, disk string) []byte {
	for gen := range q.atts {
		q.released(t, ctx, gen)
	}
	var att *api.Attachment
	if q.b.tokens {
		a, err := q.b.srv.api.Attach(ctx, q.vol, api.AttachmentSpec{Node: "verify-" + disk, Mode: api.ModeReadOnly})
		if err != nil {
			t.Fatalf("attach %s read-only: %v", q.vol, err)
		}
		defer q.b.srv.api.Detach(ctx, q.vol, a.ID)
		att = &a
	}
	return q.b.srv.readDisk(t, ctx, q.export(disk, att), t.TempDir())
}

// end logs what quiver's metrics say of the boot's volume: its writer
// epoch (one more per migration with tokens) and the writes it refused as
// fenced (none: the source never writes after the destination took over).
func (q *quiverBoot) end() {
	resp, err := http.Get("http://" + q.b.srv.APIAddr + "/metrics")
	if err != nil {
		q.b.t.Logf("pingpong: metrics: %v", err)
		return
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	var lines []string
	for l := range strings.Lines(string(body)) {
		if strings.Contains(l, `volume="`+q.vol+`"`) &&
			(strings.HasPrefix(l, "quiver_volume_writer_epoch") || strings.HasPrefix(l, "quiver_fenced_writes_total")) {
			lines = append(lines, strings.TrimSpace(l))
		}
	}
	q.b.t.Logf("pingpong: quiver metrics of %s: %s", q.vol, strings.Join(lines, "; "))
}

// nbdkitFileBackend is one nbdkit with the file plugin serving a directory:
// the export name picks the file, one per disk and boot.
type nbdkitFileBackend struct {
	dir, socket string
}

func newNbdkitFileBackend(t *testing.T, dir string) ppBackend {
	testfs.RequireTool(t, "nbdkit")
	b := &nbdkitFileBackend{dir: filepath.Join(dir, "files"), socket: filepath.Join(dir, "nbdkit.sock")}
	if err := os.Mkdir(b.dir, 0o755); err != nil {
		t.Fatal(err)
	}
	p := startHelper(t, "nbdkit", "-f", "-U", b.socket, "file", "dir="+b.dir)
	t.Cleanup(p.stop)
	waitSocket(t, b.socket)
	return b
}

func (b *nbdkitFileBackend) boot(t *testing.T, ctx context.Context, n int) ppBoot {
	files := map[string]string{}
	for _, d := range guestDisks {
		files[d] = fmt.Sprintf("b%d-%s", n, d)
		if err := os.WriteFile(filepath.Join(b.dir, files[d]), nil, 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Truncate(filepath.Join(b.dir, files[d]), diskSize); err != nil {
			t.Fatal(err)
		}
	}
	return &fileBoot{files: files, dir: b.dir, socket: b.socket}
}

type fileBoot struct {
	files       map[string]string
	dir, socket string
}

func (f *fileBoot) config(t *testing.T, ctx context.Context, gen int, v vmConfig) vmConfig {
	v.nbdSocket, v.exports = f.socket, map[string]string{}
	for _, d := range guestDisks {
		v.exports[d] = f.files[d]
	}
	return v
}

func (f *fileBoot) released(*testing.T, context.Context, int) {}

func (f *fileBoot) read(t *testing.T, ctx context.Context, disk string) []byte {
	b, err := os.ReadFile(filepath.Join(f.dir, f.files[disk]))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func (f *fileBoot) end() {}

// perDiskBackend starts one server per disk and boot: nbdkit's memory
// plugin (RAM, no file at all) or qemu-nbd on a file in /dev/shm (tmpfs).
type perDiskBackend struct {
	dir, kind string
}

func (b *perDiskBackend) boot(t *testing.T, ctx context.Context, n int) ppBoot {
	pb := &perDiskBoot{sockets: map[string]string{}, files: map[string]string{}}
	for _, d := range guestDisks {
		sock := filepath.Join(b.dir, fmt.Sprintf("b%d-%s.sock", n, d))
		pb.sockets[d] = sock
		var p *helper
		switch b.kind {
		case "nbdkit-memory":
			testfs.RequireTool(t, "nbdkit")
			p = startHelper(t, "nbdkit", "-f", "-U", sock, "memory", fmt.Sprint(diskSize))
		case "qemu-nbd":
			testfs.RequireTool(t, "qemu-nbd")
			shm, err := os.MkdirTemp("/dev/shm", "qvm")
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { os.RemoveAll(shm) })
			file := filepath.Join(shm, d+".img")
			if err := os.WriteFile(file, nil, 0o644); err != nil {
				t.Fatal(err)
			}
			if err := os.Truncate(file, diskSize); err != nil {
				t.Fatal(err)
			}
			pb.files[d] = file
			p = startHelper(t, "qemu-nbd", "-f", "raw", "-k", sock, "-t", "-e", "16", file)
		}
		pb.procs = append(pb.procs, p)
		t.Cleanup(p.stop)
		waitSocket(t, sock)
	}
	return pb
}

type perDiskBoot struct {
	sockets, files map[string]string
	procs          []*helper
}

func (p *perDiskBoot) config(t *testing.T, ctx context.Context, gen int, v vmConfig) vmConfig {
	v.sockets, v.exports = p.sockets, map[string]string{}
	for _, d := range guestDisks {
		v.exports[d] = ""
	}
	return v
}

func (p *perDiskBoot) released(*testing.T, context.Context, int) {}

func (p *perDiskBoot) read(t *testing.T, ctx context.Context, disk string) []byte {
	if f, ok := p.files[disk]; ok {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	out := filepath.Join(t.TempDir(), disk+".img")
	uri := "nbd+unix:///?socket=" + p.sockets[disk]
	if b, err := exec.CommandContext(ctx, "qemu-img", "convert", "-f", "raw", "-O", "raw", uri, out).CombinedOutput(); err != nil {
		t.Fatalf("qemu-img convert %s: %v\n%s", uri, err, b)
	}
	b, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func (p *perDiskBoot) end() {
	for _, h := range p.procs {
		h.stop()
	}
}

// helper is a server process the test started (nbdkit, qemu-nbd), ended by
// its PID.
type helper struct {
	cmd    *exec.Cmd
	out    *testserver.LogBuffer
	exited chan struct{}
}

func startHelper(t *testing.T, name string, args ...string) *helper {
	t.Helper()
	h := &helper{cmd: exec.Command(name, args...), out: &testserver.LogBuffer{}, exited: make(chan struct{})}
	h.cmd.Stdout, h.cmd.Stderr = h.out, h.out
	h.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := h.cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", name, err)
	}
	go func() { _ = h.cmd.Wait(); close(h.exited) }()
	return h
}

func (h *helper) stop() {
	select {
	case <-h.exited:
		return
	default:
	}
	_ = h.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-h.exited:
	case <-time.After(5 * time.Second):
		_ = h.cmd.Process.Kill()
		<-h.exited
	}
}

// waitSocket waits up to 10 s for a server to create its unix socket.
func waitSocket(t *testing.T, path string) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if _, err := os.Stat(path); err == nil {
			return
		}
	}
	t.Fatalf("no socket %s after 10 s", path)
}

// ppBackendName is QUIVER_MIGRATION_BACKEND, default quiver.
func ppBackendName(t *testing.T) string {
	name := os.Getenv("QUIVER_MIGRATION_BACKEND")
	if name == "" {
		name = "quiver"
	}
	if _, ok := ppBackends[name]; !ok {
		var names []string
		for n := range ppBackends {
			names = append(names, n)
		}
		t.Fatalf("QUIVER_MIGRATION_BACKEND=%q: want one of %s", name, strings.Join(names, ", "))
	}
	return name
}
