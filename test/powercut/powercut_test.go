package powercut

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/quiverstorage/quiver/internal/testguest"
)

// Knobs, from the environment.
const (
	cutsEnv   = "QUIVER_POWERCUT_CUTS"   // power cuts in all (default defaultCuts)
	lanesEnv  = "QUIVER_POWERCUT_LANES"  // guests running at once, each with its own pool (default 2)
	seedEnv   = "QUIVER_POWERCUT_SEED"   // seed of the run, to reproduce one
	windowEnv = "QUIVER_POWERCUT_WINDOW" // the longest workload before a cut, in ms (default 2000)
	opsEnv    = "QUIVER_POWERCUT_OPS"    // percent of the workload's steps that are pool operations, not write bursts (default 30)
)

const defaultCuts = 100

func envInt(t *testing.T, name string, def int) int {
	s := os.Getenv(name)
	if s == "" {
		return def
	}
	n, err := strconv.Atoi(s)
	if err != nil || n < 0 {
		t.Fatalf("%s=%q: want a number >= 0", name, s)
	}
	return n
}

// laneStats count what a lane did, for the log.
type laneStats struct {
	cuts, writes, fua, flushes, ops, opsDone int
	pendingHappened, laterLanded             int
	blocksChecked                            int
	flushesChecked, flushesNotReachingDisk   int
	dirtyAtCut, keptAtCut                    int
	deltasChecked, deltasWithChanges         int   // change-tracking deltas from a snapshot (delta_test.go)
	deltaBlocksDiffering                     int   // blocks they had to cover
	deltaBytesReported                       int64 // bytes they reported
	cutsWithDeltaChanges                     int   // boots after a cut where a delta had a block to cover
	rekeysStarted, rekeysResumed             int   // deep rekeys (rekey_test.go)
	rekeysFinished, shallowRekeys            int
	refusedInRekey                           int // operations refused (409 Busy) during a deep rekey
	volsInRekey, volsMixedKeys               int // volumes found in a deep rekey at a boot, and of them with blocks under both keys
	cutsInRekey, cutsMixedKeys               int // cuts after which a volume was in a deep rekey, and with blocks under both keys
	boot, work, check                        time.Duration
	qemuCPU                                  time.Duration
}

// lane is one guest's sequence of boots and cuts on its own pool disk.
type lane struct {
	t         *testing.T
	g         *guest
	token     string
	dir       string
	medium    *medium
	model     *model
	rng       *rand.Rand // the workload's
	cutRng    *rand.Rand // the cuts': when and what the cache keeps
	window    time.Duration
	opsPct    int // percent of steps that are pool operations
	mc        *machine
	conns     map[string]*nbdClient
	unflushed map[string]bool // disks written without FUA since their last FLUSH
	stats     laneStats
	total     *runTotals
}

// runTotals sum the lanes' stats for the checks over the whole run.
type runTotals struct {
	mu                sync.Mutex
	cuts, cutsInRekey int
}

func (r *runTotals) add(s laneStats) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.cuts += s.cuts
	r.cutsInRekey += s.cutsInRekey
}

// minCutsForRekey: a run of at least this many cuts must have cut the
// power during a deep rekey at least once, or it no longer covers them
// (a default run of 100 cuts lands a good part of them in one).
const minCutsForRekey = 20

// TestPowerCut runs quiver in a guest whose pool disk has a volatile write
// cache and cuts the power again and again while a client writes through
// NBD and changes the pool through the API; after each cut it boots again
// and checks the pool against everything quiver acknowledged (doc.go).
func TestPowerCut(t *testing.T) {
	g, token := requireGuest(t)
	cuts := envInt(t, cutsEnv, defaultCuts)
	lanes := max(envInt(t, lanesEnv, 2), 1)
	window := time.Duration(envInt(t, windowEnv, 2000)) * time.Millisecond
	ops := min(max(envInt(t, opsEnv, 30), 0), 100)
	seed := uint64(time.Now().UnixNano())
	if s := os.Getenv(seedEnv); s != "" {
		var err error
		if seed, err = strconv.ParseUint(s, 10, 64); err != nil {
			t.Fatalf("%s=%q: %v", seedEnv, s, err)
		}
	}
	t.Logf("%d cuts over %d lanes, workload window %v, seed %d (%s=%d reproduces the workloads)", cuts, lanes, window, seed, seedEnv, seed)
	ctx := testguest.Context(t, 0)
	total := &runTotals{}
	t.Cleanup(func() { // after every lane
		if t.Failed() {
			return
		}
		t.Logf("%d of %d cuts landed in a deep rekey of an encrypted volume", total.cutsInRekey, total.cuts)
		if total.cuts >= minCutsForRekey && total.cutsInRekey == 0 {
			t.Errorf("none of %d cuts landed in a deep rekey: the test no longer covers a power cut during one", total.cuts)
		}
	})
	for i := range lanes {
		n := cuts / lanes
		if i < cuts%lanes {
			n++
		}
		t.Run(fmt.Sprintf("lane%d", i), func(t *testing.T) {
			t.Parallel()
			dir := testguest.ShortDir(t, "qpc")
			l := &lane{t: t, g: g, token: token, dir: dir, medium: newMedium(t, dir),
				model: newModel(seed + uint64(i)), rng: rand.New(rand.NewPCG(seed, uint64(i))), cutRng: rand.New(rand.NewPCG(seed, uint64(i)+1<<32)),
				window: window, opsPct: ops, total: total}
			l.run(ctx, n)
		})
	}
}

func (l *lane) run(ctx context.Context, cuts int) {
	t := l.t
	start := time.Now()
	for cycle := 0; ; cycle++ {
		l.bootAndVerify(ctx, cycle)
		if cycle == cuts {
			break
		}
		l.workAndCut(ctx, cycle)
	}
	l.mc.cutPower(0, nil)
	s := l.stats
	t.Logf("%d cuts in %v (%.1f s per cut; QEMU CPU %.1f s per boot): boot %v, check %v, workload %v in all",
		s.cuts, time.Since(start).Round(time.Second), time.Since(start).Seconds()/float64(max(s.cuts, 1)),
		s.qemuCPU.Seconds()/float64(s.cuts+1), s.boot.Round(time.Second), s.check.Round(time.Second), s.work.Round(time.Second))
	t.Logf("acknowledged: %d writes (%d FUA), %d flushes, %d of %d operations; at the cuts %d of %d dirty cache blocks kept; "+
		"after the cuts %d in-flight operations had happened, %d blocks held a write newer than the durable one; %d blocks checked",
		s.writes, s.fua, s.flushes, s.opsDone, s.ops, s.keptAtCut, s.dirtyAtCut, s.pendingHappened, s.laterLanded, s.blocksChecked)
	t.Logf("change tracking: %d deltas checked, %d with blocks that differ (%d blocks of %d KiB, %d KiB reported); after %d of %d cuts a delta had a block to cover",
		s.deltasChecked, s.deltasWithChanges, s.deltaBlocksDiffering, blockSize>>10, s.deltaBytesReported>>10, s.cutsWithDeltaChanges, s.cuts)
	t.Logf("encryption: %d deep rekeys started, %d resumed after a cut, %d seen finished (before a cut or after it), %d shallow rekeys, %d operations refused during a deep rekey; "+
		"%d of %d cuts landed in a deep rekey (%d volumes), %d with part of a volume under each key (%d volumes)",
		s.rekeysStarted, s.rekeysResumed, s.rekeysFinished, s.shallowRekeys, s.refusedInRekey,
		s.cutsInRekey, s.cuts, s.volsInRekey, s.cutsMixedKeys, s.volsMixedKeys)
	l.total.add(s)
	t.Logf("%d of %d acknowledged NBD FLUSHes after plain writes sent a FLUSH to the pool's disk",
		s.flushesChecked-s.flushesNotReachingDisk, s.flushesChecked)
	if s.flushesNotReachingDisk > 0 {
		t.Errorf("%d acknowledged NBD FLUSHes after plain writes sent no FLUSH to the pool's disk", s.flushesNotReachingDisk)
	}
}

// bootAndVerify boots the guest on the lane's disk, waits for quiver and
// checks the pool against the model.
func (l *lane) bootAndVerify(ctx context.Context, cycle int) {
	t := l.t
	start := time.Now()
	mc, err := boot(ctx, l.g, l.medium, l.dir, l.token, cycle)
	if err != nil {
		t.Fatalf("cycle %d: %v", cycle, err)
	}
	l.mc = mc
	l.conns = map[string]*nbdClient{}
	l.unflushed = map[string]bool{}
	rctx, cancel := context.WithTimeout(ctx, 3*time.Minute)
	defer cancel()
	if err := mc.waitReady(rctx); err != nil {
		l.fail(cycle, "after the cut, boot: %v", err)
	}
	l.stats.boot += time.Since(start)
	start = time.Now()
	withChanges, inRekey, mixed := l.stats.deltasWithChanges, l.stats.volsInRekey, l.stats.volsMixedKeys
	if err := l.verify(rctx); err != nil {
		l.fail(cycle, "after the cut: %v", err)
	}
	if cycle > 0 && l.stats.deltasWithChanges > withChanges {
		l.stats.cutsWithDeltaChanges++
	}
	if l.stats.volsInRekey > inRekey {
		l.stats.cutsInRekey++
	}
	if l.stats.volsMixedKeys > mixed {
		l.stats.cutsMixedKeys++
	}
	l.stats.check += time.Since(start)
}

// workAndCut runs the workload and cuts the power after a random time.
func (l *lane) workAndCut(ctx context.Context, cycle int) {
	start := time.Now()
	var cut atomic.Bool
	done := make(chan error, 1)
	go func() { done <- l.workload(ctx, &cut) }()
	delay := time.Duration(l.cutRng.Int64N(int64(l.window) + 1))
	var werr error
	select {
	case <-time.After(delay):
	case werr = <-done: // a failure before the cut
		l.fail(cycle, "workload: %v", werr)
	}
	cut.Store(true)
	keep := 0.0
	switch r := l.cutRng.IntN(6); {
	case r == 0:
		keep = 1
	case r >= 3:
		keep = l.cutRng.Float64()
	}
	dirty, kept, err := l.mc.cutPower(keep, l.cutRng)
	if err != nil {
		l.t.Fatalf("cycle %d: cut: %v", cycle, err)
	}
	if werr = <-done; werr != nil {
		l.fail(cycle, "workload: %v", werr)
	}
	// Only now: the workload's goroutine notes its own events until it ends.
	l.model.note("power cut %d: %d dirty cache blocks, %d kept", cycle, dirty, kept)
	if os.Getenv(fsckEnv) == "1" {
		if err := fsckMedium(l.medium.f.Name()); err != nil {
			l.t.Fatalf("cycle %d: %v\n%s\n--- the lane's last events ---\n%s", cycle, err,
				keepMedium(l.medium, fmt.Sprintf("%s-cycle%d", strings.ReplaceAll(l.t.Name(), "/", "-"), cycle)),
				strings.Join(l.model.history, "\n"))
		}
	}
	l.closeConns("")
	l.stats.cuts++
	l.stats.dirtyAtCut += dirty
	l.stats.keptAtCut += kept
	l.stats.work += time.Since(start)
	if ps := l.mc.vm.Cmd.ProcessState; ps != nil {
		l.stats.qemuCPU += ps.UserTime() + ps.SystemTime()
	}
}

// fail ends the lane with the guest's console.
func (l *lane) fail(cycle int, format string, args ...any) {
	l.t.Helper()
	msg := fmt.Sprintf(format, args...)
	diag := l.mc.diagnostics()
	l.mc.cutPower(0, nil)
	kept := keepMedium(l.medium, fmt.Sprintf("%s-cycle%d", strings.ReplaceAll(l.t.Name(), "/", "-"), cycle))
	hist := "--- the lane's last events ---\n" + strings.Join(l.model.history, "\n")
	l.t.Fatalf("cycle %d: %s\n%s\n%s\n%s", cycle, redact(msg), redact(diag), kept, hist)
}
