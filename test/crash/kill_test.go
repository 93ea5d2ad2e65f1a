package crash

import (
	"os"
	"path/filepath"
	"strings"
	"time"
)

// When the SIGKILL comes. Kills at uniformly random times land mostly in
// the long phases of operations (copies, fsyncs); the aimed modes make the
// short windows between two steps, and the recovery paths they lead to,
// come up in every run.
const (
	// maxKillDelay bounds how long a workload runs before the kill.
	maxKillDelay = 120 * time.Millisecond
	// opKillChance is how often the kill is aimed at an operation of a
	// chosen kind: at a uniformly random point of its usual run time, so a
	// window is hit in proportion to its share of the operation.
	opKillChance = 0.4
	// stateKillChance is how often the kill is aimed at an on-disk state
	// instead: it comes as soon as the pool directory shows it (a
	// committed rollback record, work in staging, a temporary file).
	stateKillChance = 0.25
)

// waitToKill returns when the server is to be killed.
func (h *harness) waitToKill(f *flight) {
	h.mu.Lock()
	kinds := sortedKeys(h.stats.acked)
	h.mu.Unlock()
	switch r := h.rng.Float64(); {
	case r < opKillChance && len(kinds) > 0:
		h.killDuringOp(f, h.aimAt(kinds))
	case r < opKillChance+stateKillChance:
		h.killAtState(pick(h.rng, []string{"rollback.json", "staging", ".tmp-"}))
	default:
		time.Sleep(time.Duration(h.rng.Int64N(int64(maxKillDelay))))
	}
}

// killDuringOp waits for an operation of kind to be in flight, then for a
// random fraction of its usual run time.
func (h *harness) killDuringOp(f *flight, kind string) {
	h.mu.Lock()
	usual := h.stats.took[kind] / time.Duration(h.stats.acked[kind])
	h.mu.Unlock()
	frac := h.rng.Float64() * 1.2
	deadline := time.Now().Add(maxKillDelay)
	for time.Now().Before(deadline) {
		if since, ok := f.started(kind); ok {
			time.Sleep(time.Until(since.Add(time.Duration(frac * float64(usual)))))
			h.stats.aimedKills["op:"+kind]++
			return
		}
		time.Sleep(50 * time.Microsecond)
	}
}

// killAtState polls the pool directory until it shows state, then returns
// at once or after up to 200 µs.
func (h *harness) killAtState(state string) {
	deadline := time.Now().Add(maxKillDelay)
	for time.Now().Before(deadline) {
		if h.shows(state) {
			time.Sleep(time.Duration(h.rng.Int64N(int64(200 * time.Microsecond))))
			h.stats.aimedKills["state:"+state]++
			return
		}
		time.Sleep(20 * time.Microsecond)
	}
}

// shows reports whether the pool directory shows state right now.
func (h *harness) shows(state string) bool {
	switch state {
	case "staging":
		es, _ := os.ReadDir(filepath.Join(h.dir, "staging"))
		return len(es) > 0
	case "rollback.json", ".tmp-":
		vols, _ := os.ReadDir(filepath.Join(h.dir, "volumes"))
		for _, v := range vols {
			es, _ := os.ReadDir(filepath.Join(h.dir, "volumes", v.Name()))
			for _, e := range es {
				if e.Name() == state || (state == ".tmp-" && strings.HasPrefix(e.Name(), state)) {
					return true
				}
			}
		}
	}
	return false
}

// aimWeight favours the operations with many steps, whose every gap between
// two steps is a crash point of its own.
var aimWeight = map[string]int{"rollback": 4, "clone-bulk": 2, "clone-live": 2, "clone-snapshot": 2, "snapshot": 2}

// aimAt chooses the kind of operation to aim a kill at among kinds.
func (h *harness) aimAt(kinds []string) string {
	total := 0
	for _, k := range kinds {
		total += max(aimWeight[k], 1)
	}
	r := h.rng.IntN(total)
	for _, k := range kinds {
		if r -= max(aimWeight[k], 1); r < 0 {
			return k
		}
	}
	return kinds[len(kinds)-1]
}
