package migration

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/quiverstorage/quiver/internal/testguest"
	"github.com/quiverstorage/quiver/internal/testserver"
	"github.com/quiverstorage/quiver/test/migration/record"
)

// kernelTrouble matches the console of a guest whose kernel oopsed,
// panicked or killed a program: what a migration that corrupted the guest's
// memory shows.
var kernelTrouble = regexp.MustCompile(`kernel BUG at|BUG: |list_add corruption|list_del corruption|Oops|general protection fault|Kernel panic|segfault|invalid opcode|Call Trace|WARNING: `)

// TestMigrationPingPong boots one guest and migrates it to a fresh QEMU
// again and again, QUIVER_MIGRATION_PINGPONG times in all, against the
// backend QUIVER_MIGRATION_BACKEND names (quiver, quiver-tokenless,
// nbdkit-file, nbdkit-memory, qemu-nbd). After each migration it watches the
// destination's console for QUIVER_MIGRATION_SETTLE (default 6 s) for a
// kernel crash and checks that the guest still writes. A boot ends after
// QUIVER_MIGRATION_PERBOOT migrations (default 10) or a crash; then both
// disks must hold every record the QEMUs completed, in order, and the next
// boot starts on fresh disks. Every migration is logged on a line starting
// "pingpong:", with a summary at the end; every crash, hang or lost record
// fails the test. QUIVER_MIGRATION_MEMCHECK=1 compares the RAM of both sides
// of each migration (compareRAM); a difference fails the test too.
// QUIVER_MIGRATION_TRACE=event,event... records those QEMU trace events
// (e.g. virtio_blk_*,nbd_*,migration_*) in QUIVER_MIGRATION_KEEP (a
// directory), and checks their NBD traffic (checkNBDTrace); the directory
// also keeps the consoles of crashed runs and the RAM images that differed.
func TestMigrationPingPong(t *testing.T) {
	total, _ := strconv.Atoi(os.Getenv("QUIVER_MIGRATION_PINGPONG"))
	if total <= 0 {
		t.Skip("set QUIVER_MIGRATION_PINGPONG=N to migrate a guest N times")
	}
	perBoot := envInt("QUIVER_MIGRATION_PERBOOT", 10)
	settle := time.Duration(envInt("QUIVER_MIGRATION_SETTLE", 6)) * time.Second
	keep := os.Getenv("QUIVER_MIGRATION_KEEP")
	if keep != "" {
		if err := os.MkdirAll(keep, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	name := ppBackendName(t)
	ctx := testguest.Context(t, 24*time.Hour)
	g := requireGuest(t)
	dir := testguest.ShortDir(t, "qvm")
	backend := ppBackends[name](t, dir)
	run := time.Now().UTC().Format("150405")

	var res ppResults
	for boot := 1; res.migrations < total; boot++ {
		pp := &pingPong{t: t, ctx: ctx, g: g, dir: dir, name: name, keep: keep, settle: settle,
			memcheck: os.Getenv("QUIVER_MIGRATION_MEMCHECK") != "",
			tag:      fmt.Sprintf("%s-%s-b%d", name, run, boot)}
		pp.boot = backend.boot(t, ctx, boot)
		n := min(perBoot, total-res.migrations)
		pp.run(n, &res)
		pp.boot.end()
	}
	t.Logf("pingpong summary: backend=%s migrations=%d crashes=%d stalls=%d failed=%d lost=%d ram_differs=%d downtime_ms=%s",
		name, res.migrations, res.crashes, res.stalls, res.failed, res.lost, res.memDiffs, res.downtimes())
	for _, c := range res.signatures {
		t.Logf("pingpong fault: %s", c)
	}
}

func envInt(name string, def int) int {
	if n, err := strconv.Atoi(os.Getenv(name)); err == nil && n > 0 {
		return n
	}
	return def
}

type ppResults struct {
	migrations, crashes, stalls, failed, lost int
	memDiffs                                  int // migrations whose RAM differed
	downtime                                  []int64
	signatures                                []string
}

func (r *ppResults) downtimes() string {
	if len(r.downtime) == 0 {
		return "-"
	}
	d := slices.Clone(r.downtime)
	slices.Sort(d)
	return fmt.Sprintf("min %d median %d max %d", d[0], d[len(d)/2], d[len(d)-1])
}

// pingPong is one boot of the guest and its migrations.
type pingPong struct {
	t      *testing.T
	ctx    context.Context
	g      *guest
	dir    string
	name   string
	keep   string
	tag    string
	settle time.Duration
	// memcheck compares the guest RAM of source and destination after
	// each migration (QUIVER_MIGRATION_MEMCHECK).
	memcheck bool
	boot     ppBoot
	stats    []map[string]testguest.BlockStats // of every QEMU that has quit
	traces   []string                          // QEMU trace logs of this boot
	vms      []*vm                             // the boot's QEMUs, in order
}

func (p *pingPong) start(gen int) *vm {
	cfg := vmConfig{name: fmt.Sprintf("%s-g%d", p.tag, gen), dir: p.dir, guest: p.g, incoming: gen > 0}
	cfg.paused = p.memcheck && gen > 0 // until compareRAM has run
	if ev := os.Getenv("QUIVER_MIGRATION_TRACE"); ev != "" && p.keep != "" {
		for e := range strings.SplitSeq(ev, ",") {
			cfg.extra = append(cfg.extra, "-trace", "enable="+e)
		}
		cfg.extra = append(cfg.extra, "-D", filepath.Join(p.keep, cfg.name+".trace"))
		p.traces = append(p.traces, filepath.Join(p.keep, cfg.name+".trace"))
	}
	v := startVM(p.t, p.ctx, p.boot.config(p.t, p.ctx, gen, cfg))
	p.vms = append(p.vms, v)
	return v
}

// run boots the guest and migrates it up to n times.
func (p *pingPong) run(n int, res *ppResults) {
	t, ctx := p.t, p.ctx
	start := time.Now()
	cur := p.start(0)
	cur.waitConsole(t, ctx, "guestwriter: seq ")
	t.Logf("pingpong: %s booted and writing after %v", p.tag, time.Since(start).Round(time.Millisecond))
	gen := 0
	for i := 0; i < n; i++ {
		gen++
		dst := p.start(gen)
		startMigration(t, ctx, cur, dst, "unix:"+filepath.Join(p.dir, fmt.Sprintf("%s-g%d.mig", p.tag, gen)), fastMigration)
		info := cur.waitMigration(t, ctx, func(m migrationInfo) bool { return m.finished() })
		res.migrations++
		if info.Status != "completed" {
			res.failed++
			t.Errorf("pingpong: %s migration %d ended %q: %s", p.tag, gen, info.Status, info.ErrorDesc)
			dst.Shutdown()
			break
		}
		res.downtime = append(res.downtime, info.Downtime)
		srcStats := cur.blockStats(t, ctx)
		memDiff := ""
		if p.memcheck {
			dst.waitStatus(t, ctx, "paused")
			if d := compareRAM(t, ctx, cur, dst, p.keep); d != "" {
				memDiff = "; " + d
			}
			if err := dst.QMP.Execute(ctx, "cont", nil, nil); err != nil {
				t.Fatalf("%s: %v", dst.name, err)
			}
		}
		for st := ""; st != "running" && dst.Running(); st = dst.status(t, ctx) {
			sleep(ctx, 50*time.Millisecond)
		}
		cur.quit(t, ctx)
		p.boot.released(t, ctx, gen-1)
		p.stats = append(p.stats, srcStats)
		cur = dst

		outcome, detail := p.watch(dst)
		t.Logf("pingpong: %s migration %d: total %d ms, downtime %d ms, %s: %s%s",
			p.tag, gen, info.TotalTime, info.Downtime, outcome, detail, memDiff)
		if memDiff != "" {
			res.memDiffs++
			t.Errorf("pingpong: %s migration %d: QEMU's migration changed the guest's RAM%s", p.tag, gen, memDiff)
		}
		if outcome == "full" {
			break // not a fault: the next boot starts on empty disks
		}
		if outcome != "ok" {
			if outcome == "crash" {
				res.crashes++
			} else {
				res.stalls++
			}
			sig := fmt.Sprintf("%s migration %d (downtime %d ms): %s", p.tag, gen, info.Downtime, detail)
			res.signatures = append(res.signatures, sig)
			t.Errorf("pingpong: guest %s after migration: %s\n%s", outcome, sig, testserver.Tail(dst.ConsoleText(), 60))
			p.keepFile(dst.Console)
			break
		}
	}
	// The last QEMU stops; its counters are final. Every record any QEMU
	// completed must be on the disks, whether the guest crashed or not.
	// A guest that panicked has ended its QEMU (-no-reboot): then the
	// records must still be intact and in order, but their number is
	// not known.
	counted := cur.Running()
	if counted {
		if err := cur.QMP.Execute(ctx, "stop", nil, nil); err != nil {
			t.Fatalf("%s: %v", cur.name, err)
		}
		p.stats = append(p.stats, cur.blockStats(t, ctx))
	}
	cur.Shutdown()
	p.boot.released(t, ctx, gen)
	var sum nbdTraceSummary
	for _, tr := range p.traces {
		s, err := checkNBDTrace(tr)
		if err != nil {
			t.Errorf("pingpong: %s: NBD traffic: %v", p.tag, err)
		}
		sum.Requests, sum.Replies, sum.Writes, sum.Flushes = sum.Requests+s.Requests, sum.Replies+s.Replies, sum.Writes+s.Writes, sum.Flushes+s.Flushes
	}
	if len(p.traces) > 0 {
		t.Logf("pingpong: %s: NBD traces of %d QEMUs checked: %d requests (%d writes, %d flushes), %d replies",
			p.tag, len(p.traces), sum.Requests, sum.Writes, sum.Flushes, sum.Replies)
	}
	for i, d := range guestDisks {
		var want int64
		for _, s := range p.stats {
			want += s[d].WrOperations
		}
		got, err := record.Count(p.boot.read(t, ctx, d), uint64(i))
		if err == nil && !counted && got >= want {
			t.Logf("pingpong: %s disk %s: records 0..%d intact and in order; the QEMUs before the crashed one completed %d",
				p.tag, d, got-1, want)
			continue
		}
		if err != nil || got != want {
			res.lost++
			t.Errorf("pingpong: %s disk %s: %d records (%v), the QEMUs completed %d writes", p.tag, d, got, err, want)
			continue
		}
		t.Logf("pingpong: %s disk %s: records 0..%d intact and in order, as many as the %d QEMUs completed",
			p.tag, d, got-1, len(p.stats))
	}
}

// watch follows a resumed destination for the settle time: "crash" if its
// console shows a kernel crash or QEMU exits, "stall" if the guest wrote
// nothing, else "ok". detail is the first crash line, or the writes made.
func (p *pingPong) watch(v *vm) (outcome, detail string) {
	// A guest that panics ends its QEMU (-no-reboot), maybe before the
	// first query: the console says why.
	gone := func() (string, string) {
		time.Sleep(time.Second) // let the oops finish printing
		return "crash", crashSignature(v.ConsoleText()) + fmt.Sprintf(" (QEMU exited: %v)", v.Err())
	}
	before, err := v.tryBlockStats(p.ctx)
	if err != nil {
		return gone()
	}
	deadline := time.Now().Add(p.settle)
	for time.Now().Before(deadline) {
		if line := kernelTrouble.FindString(v.ConsoleText()); line != "" {
			time.Sleep(time.Second) // let the oops finish printing
			return "crash", crashSignature(v.ConsoleText())
		}
		if !v.Running() {
			return gone()
		}
		sleep(p.ctx, 200*time.Millisecond)
	}
	after, err := v.tryBlockStats(p.ctx)
	if err != nil {
		return gone()
	}
	w := after["vda"].WrOperations - before["vda"].WrOperations
	if w > 0 {
		return "ok", fmt.Sprintf("%d writes to vda", w)
	}
	// No write at all: the guest filled its disks (it said so on the
	// console of the QEMU it ran on then), a slow guest on a loaded
	// machine, or a guest that hangs. Give it 30 s more, then say what the
	// virtqueues hold and where the vCPU is.
	for _, old := range p.vms {
		if strings.Contains(old.ConsoleText(), "guestwriter: disks full") {
			return "full", "the guest writer filled its disks and idles"
		}
	}
	for range 150 {
		if line := kernelTrouble.FindString(v.ConsoleText()); line != "" {
			time.Sleep(time.Second)
			return "crash", crashSignature(v.ConsoleText())
		}
		s, err := v.tryBlockStats(p.ctx)
		if err != nil {
			return gone()
		}
		if s["vda"].WrOperations > before["vda"].WrOperations {
			return "ok", fmt.Sprintf("no write for %v, then %d", p.settle, s["vda"].WrOperations-before["vda"].WrOperations)
		}
		sleep(p.ctx, 200*time.Millisecond)
	}
	return "stall", fmt.Sprintf("no write in %v; stats %+v; %s; vCPU: %s", p.settle+30*time.Second,
		v.blockStats(p.t, p.ctx), v.queueStatus(p.ctx), v.cpuState(p.ctx))
}

// queueStatus is QMP x-query-virtio-queue-status of each disk's queue 0:
// what the device popped from the ring and has not completed (inuse), and
// the ring indexes.
func (v *vm) queueStatus(ctx context.Context) string {
	var b strings.Builder
	for _, d := range guestDisks {
		var st map[string]any
		err := v.QMP.Execute(ctx, "x-query-virtio-queue-status",
			map[string]any{"path": "/machine/peripheral/" + d + "/virtio-backend", "queue": 0}, &st)
		fmt.Fprintf(&b, "%s queue 0: inuse=%v last-avail-idx=%v used-idx=%v shadow-avail-idx=%v signalled-used=%v err=%v; ",
			d, st["inuse"], st["last-avail-idx"], st["used-idx"], st["shadow-avail-idx"], st["signalled-used"], err)
	}
	return b.String()
}

// crashSignature is the console's first trouble line and the lines after it
// that name where it happened (RIP, the first frames), on one line.
func crashSignature(console string) string {
	lines := strings.Split(console, "\n")
	for i, l := range lines {
		if !kernelTrouble.MatchString(l) {
			continue
		}
		sig := []string{strings.TrimSpace(l)}
		for _, m := range lines[i+1 : min(len(lines), i+40)] {
			m = strings.TrimSpace(m)
			if strings.Contains(m, "RIP:") || strings.Contains(m, "Kernel panic") || !strings.HasPrefix(m, "? ") && strings.Contains(m, "+0x") && len(sig) < 6 {
				sig = append(sig, m)
			}
		}
		return strings.Join(sig, " | ")
	}
	return "?"
}

func (p *pingPong) keepFile(path string) {
	if p.keep == "" {
		return
	}
	if b, err := os.ReadFile(path); err == nil {
		_ = os.WriteFile(filepath.Join(p.keep, filepath.Base(path)), b, 0o644)
	}
}

// cpuState is where the guest's vCPU is (HMP info registers: RIP, flags,
// halted) and its local APIC timer (info lapic), on one line: what a guest
// that stopped making progress was doing.
func (v *vm) cpuState(ctx context.Context) string {
	var parts []string
	for _, cmd := range []string{"info registers", "info lapic"} {
		var out string
		if err := v.QMP.Execute(ctx, "human-monitor-command", map[string]any{"command-line": cmd}, &out); err != nil {
			parts = append(parts, err.Error())
			continue
		}
		for l := range strings.Lines(out) {
			l = strings.TrimSpace(l)
			if strings.HasPrefix(l, "RIP=") || strings.Contains(l, "HLT=") || strings.HasPrefix(l, "LVT0") ||
				strings.HasPrefix(l, "LVTT") || strings.HasPrefix(l, "Timer") || strings.HasPrefix(l, "ISR") || strings.HasPrefix(l, "IRR") {
				parts = append(parts, l)
			}
		}
	}
	return strings.Join(parts, " | ")
}
