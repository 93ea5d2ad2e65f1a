package crash

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/quiverstorage/quiver/internal/testfs"
	"github.com/quiverstorage/quiver/internal/testserver"
)

var cyclesFlag = flag.Int("crash.cycles", 0, "kill/restart cycles (default 200, 20 with -short; env QUIVER_CRASH_CYCLES)")

const (
	// startupKillChance is how often the server is also killed while it
	// starts, in the middle of its crash recovery.
	startupKillChance = 0.15
	workers           = 2
)

// TestCrash is the crash-safety acceptance test; see the package doc.
func TestCrash(t *testing.T) {
	cycles := cycleCount(t)
	seed := seedFromEnv(t)
	t.Logf("seed %d (QUIVER_CRASH_SEED=%d reproduces the workload; kill timing still varies), %d cycles, race=%v",
		seed, seed, cycles, testserver.RaceEnabled)
	h := &harness{
		t:     t,
		bin:   buildServer(t),
		dir:   poolDir(t),
		seed:  seed,
		rng:   rand.New(rand.NewPCG(seed, 0)),
		model: model{},
		stats: stats{acked: map[string]int{}, uncertain: map[string]int{}, took: map[string]time.Duration{}, aimedKills: map[string]int{}},
	}
	for i := range workers {
		h.workers = append(h.workers, &worker{prefix: string(rune('a'+i)) + "-", rng: rand.New(rand.NewPCG(seed, uint64(i+1)))})
	}
	h.uncertain = make([]*op, workers)
	t.Cleanup(func() {
		if h.srv != nil {
			h.srv.Kill()
		}
	})
	start := time.Now()
	for cycle := range cycles {
		h.cycle(cycle)
	}
	h.finish()
	h.stats.log(t, cycles, time.Since(start))
}

func cycleCount(t *testing.T) int {
	n := 200
	if testing.Short() {
		n = 20
	}
	if s := os.Getenv("QUIVER_CRASH_CYCLES"); s != "" {
		v, err := strconv.Atoi(s)
		if err != nil || v < 1 {
			t.Fatalf("QUIVER_CRASH_CYCLES=%q: want a positive integer", s)
		}
		n = v
	}
	if *cyclesFlag > 0 {
		n = *cyclesFlag
	}
	return n
}

func seedFromEnv(t *testing.T) uint64 {
	s := os.Getenv("QUIVER_CRASH_SEED")
	if s == "" {
		return uint64(time.Now().UnixNano())
	}
	v, err := strconv.ParseUint(s, 10, 64)
	if err != nil {
		t.Fatalf("QUIVER_CRASH_SEED=%q: want an unsigned integer", s)
	}
	return v
}

// poolDir returns a pool directory that does not exist yet, on the
// filesystem QUIVER_CRASH_FS names.
func poolDir(t *testing.T) string {
	var base string
	switch fs := os.Getenv("QUIVER_CRASH_FS"); fs {
	case "":
		base = t.TempDir()
	case "xfs":
		base = testfs.MountXFS(t, 512<<20)
	case "btrfs":
		base = testfs.MountBtrfs(t, 256<<20)
	case "ext4":
		base = testfs.MountExt4(t, 256<<20)
	case "tmpfs":
		base = testfs.MountTmpfs(t, 256<<20)
	default:
		t.Fatalf("QUIVER_CRASH_FS=%q: want empty, xfs, btrfs, ext4 or tmpfs", fs)
	}
	return filepath.Join(base, "pool")
}

// harness runs the cycles. Only the test goroutine touches its fields,
// except model, which the workers change under mu.
type harness struct {
	t        *testing.T
	bin, dir string
	seed     uint64
	rng      *rand.Rand
	workers  []*worker

	mu    sync.Mutex
	model model

	// uncertain holds, per worker, the operation the last kill interrupted.
	uncertain []*op
	// retry holds, per worker, an interrupted operation to send again first
	// in the next workload.
	retry  []*op
	stamps int // stamps written so far, to make each unique
	poolID string
	srv    *testserver.Process // the running server, if any
	prev   *testserver.Process // the server killed last, for its log
	stats  stats
}

// cycle restarts the server (sometimes killing it during recovery first),
// verifies the pool, runs a workload, kills the server in the middle, and
// writes new data into the disks no interrupted operation touched.
func (h *harness) cycle(n int) {
	t := h.t
	ctx := t.Context()
	if n > 0 && h.rng.Float64() < startupKillChance {
		h.killDuringStartup(n)
	}
	began := time.Now()
	srv, err := startServer(ctx, h.bin, h.dir)
	h.srv = srv
	if err != nil {
		h.fatalf(n, "start server: %v", err)
	}
	h.stats.starts++
	h.stats.startTook += time.Since(began)
	h.verify(ctx, n)
	h.workload(ctx, n)
	h.prev, h.srv = h.srv, nil
	if err := errors.Join(h.prev.EndedByItself(), h.prev.CheckLog()); err != nil {
		h.fatalf(n, "%v", err)
	}
	h.stamp(n)
	h.stats.cycles++
}

// killDuringStartup starts the server and kills it at a random point of its
// usual start time, often while it recovers what the last kill left; the
// next start must still find a consistent pool.
func (h *harness) killDuringStartup(n int) {
	srv, err := spawn(h.bin, h.dir)
	if err != nil {
		h.fatalf(n, "spawn server: %v", err)
	}
	usual := h.stats.startTook / time.Duration(h.stats.starts)
	time.Sleep(time.Duration(h.rng.Int64N(int64(usual) + 1)))
	srv.Kill()
	h.prev = srv
	if err := errors.Join(srv.EndedByItself(), srv.CheckLog()); err != nil {
		h.fatalf(n, "killed during start-up: %v", err)
	}
	h.stats.startupKills++
}

// verify checks the restarted pool and adopts what it found as the model.
func (h *harness) verify(ctx context.Context, n int) {
	info, err := h.srv.API.Pool(ctx)
	if err != nil {
		h.fatalf(n, "get pool: %v", err)
	}
	if h.poolID == "" {
		h.poolID = info.ID
	} else if info.ID != h.poolID {
		h.fatalf(n, "pool id changed from %s to %s", h.poolID, info.ID)
	}
	var uncertain []*op
	for _, o := range h.uncertain {
		if o != nil {
			uncertain = append(uncertain, o)
		}
	}
	next, res, probs := verify(ctx, h.srv.API, h.dir, h.model, uncertain)
	if len(probs) > 0 {
		h.fatalf(n, "after restart:\n%s", strings.Join(probs, "\n"))
	}
	h.stats.applied += res.applied
	h.stats.notApplied += res.notApplied
	h.model = next
	h.retry = make([]*op, workers)
	for i, o := range h.uncertain {
		if o != nil && o.retry {
			h.retry[i] = o
		}
	}
	h.uncertain = make([]*op, workers)
	h.stats.maxVolumes = max(h.stats.maxVolumes, len(next))
}

// finish restarts the server once more, verifies, and stops it gracefully.
func (h *harness) finish() {
	t := h.t
	ctx := t.Context()
	srv, err := startServer(ctx, h.bin, h.dir)
	h.srv = srv
	if err != nil {
		h.fatalf(-1, "start server: %v", err)
	}
	h.verify(ctx, -1)
	if err := srv.Stop(30 * time.Second); err != nil {
		t.Errorf("%v\n%s", err, tail(srv.Log.String(), 40))
	}
	h.srv = nil
}

func (h *harness) fatalf(cycle int, format string, args ...any) {
	h.t.Helper()
	var b strings.Builder
	fmt.Fprintf(&b, "cycle %d (seed %d): %s", cycle, h.seed, fmt.Sprintf(format, args...))
	for _, o := range h.uncertain {
		if o != nil {
			fmt.Fprintf(&b, "\ninterrupted by the kill: %s", o.desc)
		}
	}
	if h.prev != nil {
		fmt.Fprintf(&b, "\n--- log of the server killed last:\n%s", tail(h.prev.Log.String(), 60))
	}
	if h.srv != nil {
		fmt.Fprintf(&b, "\n--- log of the current server:\n%s", tail(h.srv.Log.String(), 60))
	}
	h.t.Fatal(b.String())
}

func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// stats summarises a run.
type stats struct {
	cycles, startupKills, inflightKills int
	retries, starts                     int
	startTook                           time.Duration  // total time from spawn to ready of starts
	aimedKills                          map[string]int // by target
	acked, uncertain                    map[string]int
	took                                map[string]time.Duration // total run time of acknowledged operations
	applied, notApplied                 int                      // volumes an interrupted operation did or did not change
	maxVolumes                          int
}

func (s *stats) log(t *testing.T, cycles int, d time.Duration) {
	sum := func(m map[string]int) int {
		n := 0
		for _, v := range m {
			n += v
		}
		return n
	}
	t.Logf("%d cycles in %v: %d SIGKILLs during a workload (%d with an operation in flight), %d during start-up (a start takes %v)",
		s.cycles, d.Round(time.Millisecond), cycles, s.inflightKills, s.startupKills,
		(s.startTook / time.Duration(max(s.starts, 1))).Round(time.Millisecond))
	t.Logf("kills aimed at an operation or an on-disk state: %d %v", sum(s.aimedKills), s.aimedKills)
	t.Logf("acknowledged operations: %d %v", sum(s.acked), s.acked)
	t.Logf("operations interrupted by a kill: %d %v; volumes they changed: %d, left unchanged: %d",
		sum(s.uncertain), s.uncertain, s.applied, s.notApplied)
	t.Logf("interrupted operations sent again after the restart: %d; largest pool: %d volumes", s.retries, s.maxVolumes)
}
