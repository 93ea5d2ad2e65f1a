package migration

import (
	"context"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/quiverstorage/quiver/internal/api"
	"github.com/quiverstorage/quiver/internal/testguest"
)

const (
	volumeName = "vm"
	// diskSize holds 16,384 records per disk: under TCG the guest writes a
	// few hundred a second, so the disks never fill within a test.
	diskSize = 64 << 20
	// fastMigration lets QEMU send RAM as fast as it can; slowMigration
	// keeps a migration of the guest's RAM (about 70 MiB that are not
	// zero) going for several seconds, and the test cancels it once
	// cancelAfter bytes have gone, while it is active.
	fastMigration = 1 << 30 // bytes per second
	slowMigration = 8 << 20
	cancelAfter   = 2 << 20
	// destinationRun is how long the guest writes on the destination
	// after the migration.
	destinationRun = 3 * time.Second
)

// TestLiveMigration migrates the writing guest from one QEMU to another
// and checks, from the disks read back over NBD, that every record the
// guest wrote on either side is there, intact and in order, and that the
// guest went on writing on the destination. It also checks that QEMU
// carried the guest's RAM over unchanged (compareRAM), so that a guest crash
// caused by the emulator is told from one caused by the disks. It runs
// once: a crash of the guest fails it.
func TestLiveMigration(t *testing.T) { liveMigration(t) }

func liveMigration(t *testing.T) {
	ctx := testguest.Context(t, 3*time.Minute)
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
	dstCfg := f.config("dst", dstAtt, true)
	dstCfg.paused = true // until its RAM is compared with the source's
	dst := startVM(t, ctx, dstCfg)
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
	dst.waitStatus(t, ctx, "paused")
	if d := compareRAM(t, ctx, src, dst, ""); d != "" {
		t.Errorf("QEMU's migration changed the guest's RAM (a fault of the emulator, not of the disks): %s", d)
	}
	if err := dst.QMP.Execute(ctx, "cont", nil, nil); err != nil {
		t.Fatalf("dst: %v", err)
	}
	dst.waitStatus(t, ctx, "running")
	// A guest resumed on the destination writes within seconds; give it a
	// minute on a loaded machine. If it never does, the server's goroutines
	// tell a write stuck in quiver from a guest that issued none.
	wctx, wcancel := context.WithTimeout(ctx, time.Minute)
	dst.waitWrites(t, wctx, map[string]int64{"vda": 1, "vdb": 1}, func() {
		t.Logf("the destination made no write; quiver's goroutines:\n%s", f.srv.Dump())
	})
	wcancel()

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
	if err := dst.QMP.Execute(ctx, "stop", nil, nil); err != nil {
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
	ctx := testguest.Context(t, 3*time.Minute)
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
			return m.finished() || m.Status == "active" && m.RAM != nil && m.RAM.Transferred >= cancelAfter
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
			if err := src.QMP.Execute(ctx, "migrate_cancel", nil, nil); err != nil {
				t.Fatalf("src: %v", err)
			}
		} else {
			dst.Kill()
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
		dst.Shutdown()
		f.detach(t, ctx, dstAtt)

		// The source goes on writing, still the writer of the same epoch.
		src.waitWrites(t, ctx, map[string]int64{"vda": before["vda"].WrOperations + 50, "vdb": before["vdb"].WrOperations + 50}, nil)
		src.checkGuestHealthy(t, ctx)
		if w := f.writer(t, ctx); w != writer {
			t.Errorf("%s: writer %+v, want %+v as before the migration", how, w, writer)
		}
		f.checkAttachment(t, ctx, srcAtt, true, false, len(guestDisks))
	}
	sleep(ctx, time.Second)
	src.checkGuestHealthy(t, ctx)
	if err := src.QMP.Execute(ctx, "stop", nil, nil); err != nil {
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
