package migration

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/quiverstorage/quiver/internal/api"
	"github.com/quiverstorage/quiver/internal/testguest"
	"github.com/quiverstorage/quiver/test/migration/record"
)

// fixture is a quiver server with the VM's volume and the guest to boot.
type fixture struct {
	srv   *server
	guest *guest
	dir   string // short: sockets and consoles
}

func newFixture(t *testing.T, ctx context.Context) *fixture {
	t.Helper()
	f := &fixture{guest: requireGuest(t), dir: testguest.ShortDir(t, "qvm")}
	f.srv = startServer(t, f.dir)
	f.srv.createVolume(t, ctx, volumeName, diskSize)
	return f
}

// attach creates an attachment of the volume for node, as the orchestrator
// does before it starts QEMU on that node.
func (f *fixture) attach(t *testing.T, ctx context.Context, node, mode string) api.Attachment {
	t.Helper()
	a, err := f.srv.api.Attach(ctx, volumeName, api.AttachmentSpec{Node: node, Mode: mode})
	if err != nil {
		t.Fatalf("attach %s for node %s: %v", volumeName, node, err)
	}
	if a.Token == "" {
		t.Fatalf("attach %s for node %s: no token in %+v", volumeName, node, a)
	}
	return a
}

// export is the NBD export name of a disk for an attachment.
func export(disk string, a api.Attachment) string {
	return volumeName + "/" + disk + "/" + a.Token
}

// config is the QEMU configuration of one side of the migration, reaching
// the disks through attachment a.
func (f *fixture) config(name string, a api.Attachment, incoming bool) vmConfig {
	exports := map[string]string{}
	for _, d := range guestDisks {
		exports[d] = export(d, a)
	}
	return vmConfig{name: name, dir: f.dir, guest: f.guest, nbdSocket: f.srv.socket, exports: exports, incoming: incoming}
}

// writer returns the volume's single-writer state.
func (f *fixture) writer(t *testing.T, ctx context.Context) api.Writer {
	t.Helper()
	v, err := f.srv.api.GetVolume(ctx, volumeName)
	if err != nil {
		t.Fatalf("get volume %s: %v", volumeName, err)
	}
	return v.Writer
}

// checkAttachment fails the test unless the attachment's writer and fenced
// flags are as wanted, and, when conns >= 0, it has that many NBD
// connections.
func (f *fixture) checkAttachment(t *testing.T, ctx context.Context, a api.Attachment, writer, fenced bool, conns int) {
	t.Helper()
	got, err := f.srv.api.GetAttachment(ctx, volumeName, a.ID)
	if err != nil {
		t.Fatalf("get attachment %s (node %s): %v", a.ID, a.Node, err)
	}
	if got.Writer != writer || got.Fenced != fenced || conns >= 0 && got.Conns != conns {
		want := fmt.Sprintf("writer=%v fenced=%v", writer, fenced)
		if conns >= 0 {
			want += fmt.Sprintf(" connections=%d", conns)
		}
		t.Errorf("attachment of node %s: writer=%v fenced=%v connections=%d, want %s",
			a.Node, got.Writer, got.Fenced, got.Conns, want)
	}
}

// checkSplitBrain writes through the fenced source's token with qemu-io, a
// client of its own beside the source QEMU: over slot 0 of each disk,
// which holds the source's first record, and over the disk's last slot,
// which nobody wrote. Every write must fail with EPERM; verifyDisks later
// finds slot 0 intact and the last slot empty, so none was applied.
func (f *fixture) checkSplitBrain(t *testing.T, ctx context.Context, fenced api.Attachment) {
	t.Helper()
	refused := 0
	for _, d := range guestDisks {
		for _, off := range []int64{0, diskSize - record.Size} {
			cmd := fmt.Sprintf("write -P 0xee %d %d", off, record.Size)
			out, _ := f.srv.qemuIO(t, ctx, export(d, fenced), cmd)
			if !strings.Contains(out, "Operation not permitted") || strings.Contains(out, "wrote ") {
				t.Errorf("qemu-io %q on %s through the fenced source's token: want EPERM, got\n%s", cmd, d, out)
				continue
			}
			refused++
		}
	}
	t.Logf("split brain: %d writes through the fenced source's token refused with EPERM", refused)
}

// detach deletes an attachment and checks that its token no longer opens
// an export.
func (f *fixture) detach(t *testing.T, ctx context.Context, a api.Attachment) {
	t.Helper()
	if err := f.srv.api.Detach(ctx, volumeName, a.ID); err != nil {
		t.Fatalf("detach node %s: %v", a.Node, err)
	}
	out, err := f.srv.qemuIO(t, ctx, export(guestDisks[0], a), fmt.Sprintf("read 0 %d", record.Size))
	if err == nil || strings.Contains(out, fmt.Sprintf("read %d/%d", record.Size, record.Size)) {
		t.Errorf("qemu-io opened an export with the token of detached node %s (%v):\n%s", a.Node, err, out)
	}
}

// verifyDisks reads every disk back over NBD, through a read-only
// attachment that must refuse a write, and checks that it holds
// records 0..n-1 for that disk, intact, and nothing after them, where n is
// the number of writes the QEMUs (stats, one per QEMU that ran the guest)
// completed on it: the guest writes nothing else, and one O_DIRECT write
// of a record is one virtio-blk write request. The guest writes each
// record to vda, then vdb, so vdb has the records of vda or one fewer.
func (f *fixture) verifyDisks(t *testing.T, ctx context.Context, stats ...map[string]testguest.BlockStats) map[string]int64 {
	t.Helper()
	dir := t.TempDir()
	ro := f.attach(t, ctx, "verify", api.ModeReadOnly)
	counts := map[string]int64{}
	for i, d := range guestDisks {
		// The export is READ_ONLY, so QEMU's NBD client does not even
		// open it for writing.
		out, err := f.srv.qemuIO(t, ctx, export(d, ro), fmt.Sprintf("write -P 0xee 0 %d", record.Size))
		if err == nil && !strings.Contains(out, "failed") || strings.Contains(out, "wrote ") {
			t.Errorf("qemu-io could write to %s through a read-only attachment:\n%s", d, out)
		}
		img := f.srv.readDisk(t, ctx, export(d, ro), dir)
		n, err := record.Count(img, uint64(i))
		if err != nil {
			t.Fatalf("disk %s read back over NBD: %v", d, err)
		}
		var want int64
		for _, s := range stats {
			want += s[d].WrOperations
		}
		if n != want {
			t.Errorf("disk %s holds %d records, but QEMU completed %d writes to it", d, n, want)
		}
		counts[d] = n
	}
	if a, b := counts["vda"], counts["vdb"]; b != a && b != a-1 {
		t.Errorf("vda holds %d records and vdb %d: vdb must have the same or one fewer", a, b)
	}
	return counts
}
