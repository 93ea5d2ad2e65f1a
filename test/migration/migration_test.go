package migration

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/quiverstorage/quiver/internal/api"
	"github.com/quiverstorage/quiver/test/migration/record"
)

const (
	volumeName = "vm"
	// diskSize holds 16,384 records per disk: under TCG the guest writes a
	// few hundred a second, so the disks never fill within a test.
	diskSize = 64 << 20
	// fastMigration lets QEMU send RAM as fast as it can; slowMigration
	// keeps a migration of the guest's RAM going for many seconds, long
	// enough to cancel it while it is active.
	fastMigration = 1 << 30 // bytes per second
	slowMigration = 1 << 20
	// destinationRun is how long the guest writes on the destination
	// after the migration.
	destinationRun = 3 * time.Second
)

// fixture is a quiver server with the VM's volume and the guest to boot.
type fixture struct {
	srv   *server
	guest *guest
	dir   string // short: sockets and consoles
}

func newFixture(t *testing.T, ctx context.Context) *fixture {
	t.Helper()
	f := &fixture{guest: requireGuest(t), dir: shortTempDir(t)}
	f.srv = startServer(t, ctx, f.dir)
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

// TestLiveMigration migrates the writing guest from one QEMU to another
// and checks, from the disks read back over NBD, that every record the
// guest wrote on either side is there, intact and in order, and that the
// guest went on writing on the destination.
func TestLiveMigration(t *testing.T) {
	ctx := testContext(t, 3*time.Minute)
	start := time.Now()
	f := newFixture(t, ctx)

	srcAtt := f.attach(t, ctx, "src", api.ModeReadWrite)
	src := startVM(t, ctx, f.config("src", srcAtt, false))
	src.waitConsole(t, ctx, "guestwriter: seq ") // it has been writing for a second
	t.Logf("source booted and writing after %v", time.Since(start).Round(time.Millisecond))
	before := f.writer(t, ctx)
	if before.Attachment != srcAtt.ID {
		t.Fatalf("writer before the migration: %+v, want the source's attachment %s", before, srcAtt.ID)
	}

	dstAtt := f.attach(t, ctx, "dst", api.ModeReadWrite)
	dst := startVM(t, ctx, f.config("dst", dstAtt, true))
	// The destination has opened every disk, write-capable, but is no
	// writer: the source goes on writing.
	f.checkAttachment(t, ctx, dstAtt, false, false, len(guestDisks))
	startMigration(t, ctx, src, dst, "unix:"+filepath.Join(f.dir, "migrate.sock"), fastMigration)
	info := src.waitMigration(t, ctx, func(m migrationInfo) bool { return m.finished() })
	if info.Status != "completed" {
		t.Fatalf("migration ended %q: %s", info.Status, info.ErrorDesc)
	}
	t.Logf("migration completed: total-time %d ms, downtime %d ms, setup-time %d ms, %s",
		info.TotalTime, info.Downtime, info.SetupTime, info.RAM)
	if st := src.status(t, ctx); st != "postmigrate" {
		t.Errorf("source status after migration %q, want postmigrate", st)
	}
	// The source's guest is stopped for good: its counters are final.
	srcStats := src.blockStats(t, ctx)
	dst.waitStatus(t, ctx, "running")
	dst.waitWrites(t, ctx, map[string]int64{"vda": 1, "vdb": 1})

	// The destination's first write took the writer role and fenced the
	// source: one epoch later, whatever still holds the source's token
	// cannot write. The source QEMU still has its connections open.
	if after := f.writer(t, ctx); after.Attachment != dstAtt.ID || after.Epoch != before.Epoch+1 {
		t.Errorf("writer after the destination wrote: %+v, want the destination's attachment %s at epoch %d",
			after, dstAtt.ID, before.Epoch+1)
	}
	f.checkAttachment(t, ctx, srcAtt, false, true, len(guestDisks))
	f.checkAttachment(t, ctx, dstAtt, true, false, len(guestDisks))
	f.checkSplitBrain(t, ctx, srcAtt)

	// As in a KubeVirt migration, the source quits after the destination
	// has started writing; QEMU flushes its disks when it quits, and a
	// fenced attachment's FLUSH succeeds. Then the orchestrator detaches it.
	src.quit(t, ctx)
	f.detach(t, ctx, srcAtt)
	sleep(ctx, destinationRun)
	dst.checkGuestHealthy(t, ctx)
	if err := dst.qmp.execute(ctx, "stop", nil, nil); err != nil {
		t.Fatalf("dst: %v", err)
	}
	dstStats := dst.blockStats(t, ctx) // final: stop drains the guest's requests
	dst.quit(t, ctx)

	counts := f.verifyDisks(t, ctx, srcStats, dstStats)
	for _, d := range guestDisks {
		t.Logf("disk %s: records 0..%d intact and in order; the source wrote %d, the destination %d",
			d, counts[d]-1, srcStats[d].WrOperations, dstStats[d].WrOperations)
		if srcStats[d].WrOperations == 0 || dstStats[d].WrOperations == 0 {
			t.Errorf("disk %s: the source wrote %d records and the destination %d; want both to write",
				d, srcStats[d].WrOperations, dstStats[d].WrOperations)
		}
	}
	for _, v := range []*vm{src, dst} {
		checkConsoleClean(t, v)
		checkStderrClean(t, v)
	}
	t.Logf("TestLiveMigration took %v", time.Since(start).Round(time.Millisecond))
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

// TestMigrationCancelled starts two migrations of the writing guest that
// never complete, one cancelled with migrate_cancel and one whose
// destination is killed, and checks that the source goes on writing
// without an error and that every record it wrote is on the disks.
func TestMigrationCancelled(t *testing.T) {
	ctx := testContext(t, 3*time.Minute)
	start := time.Now()
	f := newFixture(t, ctx)

	srcAtt := f.attach(t, ctx, "src", api.ModeReadWrite)
	src := startVM(t, ctx, f.config("src", srcAtt, false))
	src.waitConsole(t, ctx, "guestwriter: seq ")
	t.Logf("source booted and writing after %v", time.Since(start).Round(time.Millisecond))
	writer := f.writer(t, ctx)
	if writer.Attachment != srcAtt.ID {
		t.Fatalf("writer: %+v, want the source's attachment %s", writer, srcAtt.ID)
	}

	for i, how := range []string{"migrate_cancel", "kill the destination"} {
		name := fmt.Sprintf("dst%d", i+1)
		dstAtt := f.attach(t, ctx, name, api.ModeReadWrite)
		dst := startVM(t, ctx, f.config(name, dstAtt, true))
		uri := "unix:" + filepath.Join(f.dir, name+".migrate.sock")
		startMigration(t, ctx, src, dst, uri, slowMigration)
		active := src.waitMigration(t, ctx, func(m migrationInfo) bool {
			return m.finished() || m.Status == "active" && m.RAM != nil && m.RAM.Transferred > 0
		})
		if active.Status != "active" {
			t.Fatalf("%s: migration %q before it could be stopped: %s", how, active.Status, active.ErrorDesc)
		}
		if w := dst.blockStats(t, ctx); w["vda"].WrOperations+w["vdb"].WrOperations != 0 {
			t.Fatalf("%s: the destination wrote before the migration completed: %+v", how, w)
		}
		// The destination is connected to every disk, and is no writer.
		f.checkAttachment(t, ctx, dstAtt, false, false, len(guestDisks))
		before := src.blockStats(t, ctx)
		want := "cancelled"
		if i == 0 {
			if err := src.qmp.execute(ctx, "migrate_cancel", nil, nil); err != nil {
				t.Fatalf("src: %v", err)
			}
		} else {
			dst.kill()
			want = "failed"
		}
		info := src.waitMigration(t, ctx, func(m migrationInfo) bool { return m.finished() })
		if info.Status != want {
			t.Fatalf("%s: migration ended %q (%s), want %q", how, info.Status, info.ErrorDesc, want)
		}
		t.Logf("%s: migration %s when %s, the source having written %d records",
			how, info.Status, active.RAM, before["vdb"].WrOperations)
		// An incoming migration that fails ends the destination QEMU; the
		// orchestrator detaches the destination.
		dst.shutdown()
		f.detach(t, ctx, dstAtt)

		// The source goes on writing, still the writer of the same epoch.
		src.waitWrites(t, ctx, map[string]int64{"vda": before["vda"].WrOperations + 50, "vdb": before["vdb"].WrOperations + 50})
		src.checkGuestHealthy(t, ctx)
		if w := f.writer(t, ctx); w != writer {
			t.Errorf("%s: writer %+v, want %+v as before the migration", how, w, writer)
		}
		f.checkAttachment(t, ctx, srcAtt, true, false, len(guestDisks))
	}
	sleep(ctx, time.Second)
	src.checkGuestHealthy(t, ctx)
	if err := src.qmp.execute(ctx, "stop", nil, nil); err != nil {
		t.Fatalf("src: %v", err)
	}
	srcStats := src.blockStats(t, ctx)
	src.quit(t, ctx)
	counts := f.verifyDisks(t, ctx, srcStats)
	for _, d := range guestDisks {
		t.Logf("disk %s: records 0..%d intact and in order, all written by the source", d, counts[d]-1)
	}
	checkConsoleClean(t, src)
	checkStderrClean(t, src)
	t.Logf("TestMigrationCancelled took %v", time.Since(start).Round(time.Millisecond))
}

// verifyDisks reads every disk back over NBD, through a read-only
// attachment that must refuse a write, and checks that it holds
// records 0..n-1 for that disk, intact, and nothing after them, where n is
// the number of writes the QEMUs (stats, one per QEMU that ran the guest)
// completed on it: the guest writes nothing else, and one O_DIRECT write
// of a record is one virtio-blk write request. The guest writes each
// record to vda, then vdb, so vdb has the records of vda or one fewer.
func (f *fixture) verifyDisks(t *testing.T, ctx context.Context, stats ...map[string]blockStats) map[string]int64 {
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

// migrationInfo is what the test reads of QMP query-migrate. Times are in
// milliseconds.
type migrationInfo struct {
	Status    string   `json:"status"`
	TotalTime int64    `json:"total-time"`
	Downtime  int64    `json:"downtime"`
	SetupTime int64    `json:"setup-time"`
	ErrorDesc string   `json:"error-desc"`
	RAM       *ramInfo `json:"ram"`
}

type ramInfo struct {
	Transferred int64 `json:"transferred"`
	Total       int64 `json:"total"`
	Duplicate   int64 `json:"duplicate"` // zero pages, sent as a flag
	Normal      int64 `json:"normal"`    // pages sent in full
}

func (r *ramInfo) String() string {
	if r == nil {
		return "no RAM transferred"
	}
	return fmt.Sprintf("%.1f MiB of RAM transferred (%d pages in full, %d zero pages) of %d MiB",
		float64(r.Transferred)/(1<<20), r.Normal, r.Duplicate, r.Total>>20)
}

func (m migrationInfo) finished() bool {
	switch m.Status {
	case "completed", "failed", "cancelled":
		return true
	}
	return false
}

// startMigration has dst listen on uri and src migrate to it at most
// bandwidth bytes per second.
func startMigration(t *testing.T, ctx context.Context, src, dst *vm, uri string, bandwidth int64) {
	t.Helper()
	if err := dst.qmp.execute(ctx, "migrate-incoming", map[string]any{"uri": uri}, nil); err != nil {
		t.Fatalf("%s: %v", dst.name, err)
	}
	if err := src.qmp.execute(ctx, "migrate-set-parameters", map[string]any{"max-bandwidth": bandwidth}, nil); err != nil {
		t.Fatalf("%s: %v", src.name, err)
	}
	if err := src.qmp.execute(ctx, "migrate", map[string]any{"uri": uri}, nil); err != nil {
		t.Fatalf("%s: %v", src.name, err)
	}
}

// waitMigration polls query-migrate on the source until done says so.
func (v *vm) waitMigration(t *testing.T, ctx context.Context, done func(migrationInfo) bool) migrationInfo {
	t.Helper()
	for {
		var m migrationInfo
		if err := v.qmp.execute(ctx, "query-migrate", nil, &m); err != nil {
			t.Fatalf("%s: %v", v.name, err)
		}
		if done(m) {
			return m
		}
		select {
		case <-ctx.Done():
			t.Fatalf("%s: migration still %q: %v", v.name, m.Status, ctx.Err())
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// waitStatus waits for the VM's run state.
func (v *vm) waitStatus(t *testing.T, ctx context.Context, want string) {
	t.Helper()
	for {
		st := v.status(t, ctx)
		if st == want {
			return
		}
		select {
		case <-ctx.Done():
			t.Fatalf("%s: VM status %q, want %q: %v", v.name, st, want, ctx.Err())
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// waitWrites waits until the VM has completed at least want[disk] writes
// to each disk.
func (v *vm) waitWrites(t *testing.T, ctx context.Context, want map[string]int64) {
	t.Helper()
	for {
		stats := v.blockStats(t, ctx)
		done := true
		for d, n := range want {
			if stats[d].WrOperations < n {
				done = false
			}
		}
		if done {
			return
		}
		select {
		case <-ctx.Done():
			t.Fatalf("%s: waiting for %v writes, have %+v: %v", v.name, want, stats, ctx.Err())
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// sleep waits for d or until ctx ends.
func sleep(ctx context.Context, d time.Duration) {
	select {
	case <-ctx.Done():
	case <-time.After(d):
	}
}
