package migration

import (
	"context"
	"fmt"
	"path/filepath"
	"testing"
	"time"

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

// config is the QEMU configuration of one side of the migration.
func (f *fixture) config(name string, incoming bool) vmConfig {
	exports := map[string]string{}
	for _, d := range guestDisks {
		exports[d] = volumeName + "/" + d
	}
	return vmConfig{name: name, dir: f.dir, guest: f.guest, nbdSocket: f.srv.socket, exports: exports, incoming: incoming}
}

// TestLiveMigration migrates the writing guest from one QEMU to another
// and checks, from the disks read back over NBD, that every record the
// guest wrote on either side is there, intact and in order, and that the
// guest went on writing on the destination.
func TestLiveMigration(t *testing.T) {
	ctx := testContext(t, 3*time.Minute)
	start := time.Now()
	f := newFixture(t, ctx)

	src := startVM(t, ctx, f.config("src", false))
	src.waitConsole(t, ctx, "guestwriter: seq ") // it has been writing for a second
	t.Logf("source booted and writing after %v", time.Since(start).Round(time.Millisecond))

	dst := startVM(t, ctx, f.config("dst", true))
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
	// As in a KubeVirt migration, the source quits after the destination
	// has started writing; QEMU flushes its disks when it quits.
	src.quit(t, ctx)
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

// TestMigrationCancelled starts two migrations of the writing guest that
// never complete, one cancelled with migrate_cancel and one whose
// destination is killed, and checks that the source goes on writing
// without an error and that every record it wrote is on the disks.
func TestMigrationCancelled(t *testing.T) {
	ctx := testContext(t, 3*time.Minute)
	start := time.Now()
	f := newFixture(t, ctx)

	src := startVM(t, ctx, f.config("src", false))
	src.waitConsole(t, ctx, "guestwriter: seq ")
	t.Logf("source booted and writing after %v", time.Since(start).Round(time.Millisecond))

	for i, how := range []string{"migrate_cancel", "kill the destination"} {
		dst := startVM(t, ctx, f.config(fmt.Sprintf("dst%d", i+1), true))
		uri := fmt.Sprintf("unix:%s", filepath.Join(f.dir, fmt.Sprintf("migrate%d.sock", i+1)))
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
		// An incoming migration that fails ends the destination QEMU.
		dst.shutdown()

		src.waitWrites(t, ctx, map[string]int64{"vda": before["vda"].WrOperations + 50, "vdb": before["vdb"].WrOperations + 50})
		src.checkGuestHealthy(t, ctx)
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
	t.Logf("TestMigrationCancelled took %v", time.Since(start).Round(time.Millisecond))
}

// verifyDisks reads every disk back over NBD and checks that it holds
// records 0..n-1 for that disk, intact, and nothing after them, where n is
// the number of writes the QEMUs (stats, one per QEMU that ran the guest)
// completed on it: the guest writes nothing else, and one O_DIRECT write
// of a record is one virtio-blk write request. The guest writes each
// record to vda, then vdb, so vdb has the records of vda or one fewer.
func (f *fixture) verifyDisks(t *testing.T, ctx context.Context, stats ...map[string]blockStats) map[string]int64 {
	t.Helper()
	dir := t.TempDir()
	counts := map[string]int64{}
	for i, d := range guestDisks {
		img := f.srv.readDisk(t, ctx, volumeName+"/"+d, dir)
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
