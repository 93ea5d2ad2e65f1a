package nbdcrash

import (
	"bytes"
	"context"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/quiverstorage/quiver/internal/api"
	"github.com/quiverstorage/quiver/internal/testfs"
	"github.com/quiverstorage/quiver/internal/testserver"
)

// qemuIOOnce runs one qemu-io command on an export and returns its output;
// qemu-io exits 0 even when the command fails, so callers read the output.
func qemuIOOnce(t *testing.T, uri, command string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, "qemu-io", "-f", "raw", "-c", command, uri).CombinedOutput()
	if err != nil && !strings.Contains(string(out), "failed") {
		t.Fatalf("qemu-io %q on %s: %v\n%s", command, uri, err, out)
	}
	return string(out)
}

// TestFencingSurvivesKill: the destination's first write fences the source;
// the server is then SIGKILLed and restarted on the same pool; the source's
// token still opens the export but its writes are refused with EPERM and
// change nothing, the destination still writes, and the epoch is the same.
func TestFencingSurvivesKill(t *testing.T) {
	testfs.RequireTool(t, "qemu-io")
	bin := testserver.Binary(t, true) // before the clock starts: a build on a busy machine is slow
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	dir := t.TempDir()
	srv, err := startQuiver(ctx, bin, dir)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = srv.Stop(20 * time.Second) }()
	if _, err := srv.API.CreateVolume(ctx, api.VolumeSpec{Name: "vm", Capacity: 64 << 20,
		Disks: []api.DiskSpec{{Name: "root", Size: 16 << 20}, {Name: "data", Size: 16 << 20}}}); err != nil {
		t.Fatal(err)
	}
	src, err := srv.API.Attach(ctx, "vm", api.AttachmentSpec{Node: "src"})
	if err != nil {
		t.Fatal(err)
	}
	dst, err := srv.API.Attach(ctx, "vm", api.AttachmentSpec{Node: "dst"})
	if err != nil {
		t.Fatal(err)
	}
	uri := func(disk, token string) string { return srv.URI("vm/" + disk + "/" + token) }

	if out := qemuIOOnce(t, uri("root", src.Token), "write -P 0x11 0 64k"); !strings.Contains(out, "wrote 65536/65536") {
		t.Fatalf("source write: %s", out)
	}
	if out := qemuIOOnce(t, uri("data", dst.Token), "write -P 0x22 1M 64k"); !strings.Contains(out, "wrote 65536/65536") {
		t.Fatalf("destination write: %s", out)
	}
	if out := qemuIOOnce(t, uri("root", src.Token), "write -P 0x33 0 4k"); !strings.Contains(out, "Operation not permitted") {
		t.Fatalf("fenced source write before the kill: want EPERM, got %s", out)
	}
	before, err := srv.API.GetVolume(ctx, "vm")
	if err != nil {
		t.Fatal(err)
	}

	if err := killServer(srv); err != nil {
		t.Fatal(err)
	}
	srv, err = startQuiver(ctx, bin, dir)
	if err != nil {
		t.Fatal(err)
	}
	after, err := srv.API.GetVolume(ctx, "vm")
	if err != nil {
		t.Fatal(err)
	}
	if after.Writer != before.Writer || after.Writer.Attachment != dst.ID || after.Writer.Epoch != 2 {
		t.Fatalf("writer after restart %+v, before %+v (want %s at epoch 2)", after.Writer, before.Writer, dst.ID)
	}
	for _, disk := range []string{"root", "data"} {
		if out := qemuIOOnce(t, uri(disk, src.Token), "write -P 0x44 0 4k"); !strings.Contains(out, "Operation not permitted") {
			t.Fatalf("fenced source write to %s after restart: want EPERM, got %s", disk, out)
		}
	}
	if out := qemuIOOnce(t, uri("root", src.Token), "read -P 0x11 0 64k"); !strings.Contains(out, "read 65536/65536") ||
		strings.Contains(out, "verification failed") {
		t.Fatalf("source data changed by a fenced write: %s", out)
	}
	if out := qemuIOOnce(t, uri("root", dst.Token), "write -P 0x55 64k 4k"); !strings.Contains(out, "wrote 4096/4096") {
		t.Fatalf("writer after restart: %s", out)
	}
	atts, err := srv.API.ListAttachments(ctx, "vm")
	if err != nil {
		t.Fatal(err)
	}
	var states bytes.Buffer
	for _, a := range atts {
		if (a.ID == src.ID) != a.Fenced || (a.ID == dst.ID) != a.Writer {
			t.Errorf("attachment %s after restart: writer=%v fenced=%v", a.Node, a.Writer, a.Fenced)
		}
		states.WriteString(a.Node + " ")
	}
	if len(atts) != 2 {
		t.Fatalf("attachments after restart: %s", states.String())
	}
}
