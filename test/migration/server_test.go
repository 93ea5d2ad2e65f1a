package migration

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/quiverstorage/quiver/internal/api"
	"github.com/quiverstorage/quiver/internal/client"
	"github.com/quiverstorage/quiver/internal/testfs"
	"github.com/quiverstorage/quiver/internal/testserver"
)

// server is one `quiver server` on a temporary pool: the API on a free
// loopback port, NBD on a unix socket only, tokens required (every NBD
// client of the test presents an attachment token: no connection can slip in
// through an implicit attachment). t.Cleanup stops it with SIGTERM and fails
// the test unless it exits cleanly with no race or panic in its log.
type server struct {
	*testserver.Process
	api    *client.Client
	socket string
}

func startServer(t *testing.T, sockDir string) *server {
	t.Helper()
	p := testserver.StartT(t, quiverBin, testserver.Options{NBDSocket: filepath.Join(sockDir, "nbd.sock"),
		Args: []string{"--nbd-require-token"}})
	return &server{Process: p, api: p.API, socket: p.Socket}
}

// createVolume creates the VM's volume: one disk per guestDisks entry,
// each diskSize bytes.
func (s *server) createVolume(t *testing.T, ctx context.Context, name string, diskSize int64) {
	t.Helper()
	spec := api.VolumeSpec{Name: name, Capacity: diskSize * int64(len(guestDisks))}
	for _, d := range guestDisks {
		spec.Disks = append(spec.Disks, api.DiskSpec{Name: d, Size: diskSize})
	}
	if _, err := s.api.CreateVolume(ctx, spec); err != nil {
		t.Fatalf("create volume %s: %v", name, err)
	}
}

// qemuIO runs one qemu-io command on an export and returns its output and
// exit error. qemu-io exits 0 even when its command fails and 1 when it
// cannot open the export, so callers read both; failing to run it at all
// fails the test.
func (s *server) qemuIO(t *testing.T, ctx context.Context, export, command string) (string, error) {
	t.Helper()
	testfs.RequireTool(t, "qemu-io")
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, "qemu-io", "-f", "raw", "-c", command, s.uri(export)).CombinedOutput()
	var exit *exec.ExitError
	if err != nil && !errors.As(err, &exit) {
		t.Fatalf("qemu-io -c %q %s: %v\n%s", command, redact(s.uri(export)), err, out)
	}
	return redact(string(out)), err
}

// tokenPattern matches attachment tokens (64 hex digits), which the test
// keeps out of its messages as the server keeps them out of its logs.
var tokenPattern = regexp.MustCompile(`[0-9a-f]{64}`)

func redact(s string) string { return tokenPattern.ReplaceAllString(s, "<token>") }

// uri is the NBD URI of an export on the unix socket, as qemu-img and
// qemu-io take it.
func (s *server) uri(export string) string {
	return "nbd+unix:///" + export + "?socket=" + s.socket
}

// readDisk copies an export to a file in dir with qemu-img convert and
// returns its contents.
func (s *server) readDisk(t *testing.T, ctx context.Context, export, dir string) []byte {
	t.Helper()
	testfs.RequireTool(t, "qemu-img")
	out := filepath.Join(dir, strings.SplitN(export, "/", 3)[1]+".img")
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "qemu-img", "convert", "-f", "raw", "-O", "raw", s.uri(export), out)
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("qemu-img convert %s: %v\n%s", redact(s.uri(export)), err, b)
	}
	img, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	return img
}
