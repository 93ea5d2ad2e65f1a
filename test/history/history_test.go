package historytest

import (
	"bytes"
	"context"
	"crypto/sha256"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/quiverstorage/quiver/internal/api"
	"github.com/quiverstorage/quiver/internal/history"
	"github.com/quiverstorage/quiver/internal/testfs"
)

const (
	volName  = "hist"
	diskSize = 8 << 20
	disks    = 2
)

// envInt reads a positive count from env, else def.
func envInt(t *testing.T, env string, def int) int {
	t.Helper()
	s := os.Getenv(env)
	if s == "" {
		return def
	}
	n, err := strconv.Atoi(s)
	if err != nil || n < 1 {
		t.Fatalf("%s=%q: want a positive count", env, s)
	}
	return n
}

// TestHistory is acceptance 2 of issue 29: a history checker over a fault
// schedule. Three nodes, a replicas=2 volume of two disks, the writers of
// writer_test.go logging every request into a history.Log, and cycles that
// each draw a fault (faults_test.go) with a seeded generator, every fault
// once per round of len(faults) cycles, in a shuffled order. After each
// cycle the writers pause (every acknowledged write then FLUSHed), the
// cluster settles (every node up and both copies in sync, or a bounded
// wait), and:
//
//   - every block of every disk on every copy marked in sync holds what the
//     history allows (history.Log.CheckImage: no acknowledged write lost, no
//     older write come back, nothing torn or misplaced);
//   - every in-sync copy's disks have the primary's SHA-256;
//   - after a partition, the old primary acknowledged nothing sent past its
//     lease or after the promotion;
//   - the clients saw no error, and the writers went on after the fault.
//
// A failed cycle prints the seed, the cycle, the fault, and per block what
// was found against what the history allows, and on which node.
// QUIVER_HISTORY_CYCLES (default 30), QUIVER_HISTORY_SEED (default: the
// time), QUIVER_HISTORY_FAULTS (a comma-separated subset of the faults'
// names) and QUIVER_HISTORY_MAX_FAILED (failed cycles before it stops,
// default 3) steer it.
func TestHistory(t *testing.T) {
	testfs.RequireTool(t, "iptables")
	testfs.RequireTool(t, "mkfs.xfs")
	cycles := envInt(t, "QUIVER_HISTORY_CYCLES", 30)
	maxFailed := envInt(t, "QUIVER_HISTORY_MAX_FAILED", 3)
	seed := uint64(time.Now().UnixNano())
	if s := os.Getenv("QUIVER_HISTORY_SEED"); s != "" {
		n, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			t.Fatalf("QUIVER_HISTORY_SEED=%q: %v", s, err)
		}
		seed = n
	}
	kinds := pickFaults(t)
	t.Logf("seed %d (QUIVER_HISTORY_SEED=%d draws the same faults); %d cycles of %v", seed, seed, cycles, kindNames(kinds))
	rng := rand.New(rand.NewPCG(seed, 0x686973746f7279))

	began := time.Now()
	c := startCluster(t)
	if !c.waitAllUp(60 * time.Second) {
		t.Fatal("the three nodes are not up")
	}
	ctx := context.Background()
	spec := api.VolumeSpec{Name: volName, Capacity: disks * diskSize, Replicas: 2}
	for i := range disks {
		spec.Disks = append(spec.Disks, api.DiskSpec{Name: fmt.Sprintf("d%d", i), Size: diskSize})
	}
	v, err := c.nodes[0].api().CreateVolume(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	att, err := c.byName(v.Primary).api().Attach(ctx, volName, api.AttachmentSpec{Node: "worker-1"})
	if err != nil {
		t.Fatal(err)
	}
	var exports []string
	for _, d := range spec.Disks {
		exports = append(exports, volName+"/"+d.Name+"/"+att.Token)
	}
	log := history.NewLog()
	w := newWriter(c, log, exports, diskSize, seed)
	defer w.stop()
	t.Logf("cluster and volume ready in %v: %s", time.Since(began).Round(time.Millisecond), formatCopies(v))

	var order []int
	failed := 0
	tally := map[string][2]int{} // fault: cycles, failed
	for i := range cycles {
		if len(order) == 0 {
			order = rng.Perm(len(kinds))
		}
		kind := kinds[order[0]]
		order = order[1:]
		cy := runCycle(t, c, w, log, i, kind, rand.New(rand.NewPCG(seed, uint64(i))))
		n := tally[kind.name]
		n[0]++
		if len(cy.fails) > 0 {
			n[1]++
			failed++
			t.Errorf("cycle %d FAILED (seed %d, fault %s): %s\n  %s", i, seed, kind.name, strings.Join(cy.what, "; "),
				strings.Join(cy.fails, "\n  "))
		}
		tally[kind.name] = n
		if failed >= maxFailed {
			t.Logf("stopping after %d failed cycles (QUIVER_HISTORY_MAX_FAILED)", failed)
			break
		}
	}
	st := log.Stats()
	var parts []string
	for _, k := range kinds {
		parts = append(parts, fmt.Sprintf("%s %d (failed %d)", k.name, tally[k.name][0], tally[k.name][1]))
	}
	t.Logf("seed %d: %s; history: %d blocks, %d writes sent, every block's last acknowledged write checked after each cycle; %v in all",
		seed, strings.Join(parts, ", "), st.Blocks, st.Attempts, time.Since(began).Round(time.Second))
}

type faultKind = struct {
	name string
	run  func(cy *cycle)
}

func pickFaults(t *testing.T) []faultKind {
	s := os.Getenv("QUIVER_HISTORY_FAULTS")
	if s == "" {
		return faults
	}
	var out []faultKind
	for _, name := range strings.Split(s, ",") {
		i := slices.IndexFunc(faults, func(f faultKind) bool { return f.name == strings.TrimSpace(name) })
		if i < 0 {
			t.Fatalf("QUIVER_HISTORY_FAULTS: no fault %q; the faults are %v", name, kindNames(faults))
		}
		out = append(out, faults[i])
	}
	return out
}

func kindNames(ks []faultKind) []string {
	var out []string
	for _, k := range ks {
		out = append(out, k.name)
	}
	return out
}

// runCycle runs one fault under the writers and checks the cluster after
// it.
func runCycle(t *testing.T, c *cluster, w *writer, log *history.Log, i int, kind faultKind, rng *rand.Rand) *cycle {
	began := time.Now()
	v, err := c.volume(volName, nil)
	if err != nil {
		t.Fatalf("cycle %d: %v", i, err)
	}
	cy := &cycle{i: i, fault: kind.name, c: c, w: w, rng: rng, vol: volName, start: v, prim: c.byName(v.Primary)}
	for _, cp := range v.Copies {
		if cp.Node != v.Primary {
			cy.cp = c.byName(cp.Node)
		}
	}
	for _, nd := range c.nodes {
		if copyState(v, nd.name) == "" {
			cy.fwd = nd
		}
	}
	if cy.cp == nil || cy.fwd == nil {
		t.Fatalf("cycle %d: copies %s", i, formatCopies(v))
	}
	err = w.resume(func(di int) []string {
		if di == 0 {
			return []string{cy.fwd.ip + ":10809", cy.prim.ip + ":10809", cy.cp.ip + ":10809"}
		}
		return []string{cy.prim.ip + ":10809", cy.cp.ip + ":10809", cy.fwd.ip + ":10809"}
	})
	if err != nil {
		t.Fatalf("cycle %d: %v", i, err)
	}
	cy.writesGoOn(6, "before the fault")
	kind.run(cy)
	w.pause()
	if err := w.err(); err != nil {
		cy.failf("the clients saw errors: %v", err)
	}
	settled := time.Now()
	if !c.waitAllUp(60 * time.Second) {
		cy.failf("not every node is up 60 s after the fault")
	}
	v, ok := c.waitVolume(volName, 120*time.Second, func(v api.Volume) bool {
		for _, cp := range v.Copies {
			if cp.State != api.CopyInSync {
				return false
			}
		}
		return len(v.Copies) == 2
	})
	if !ok {
		cy.failf("the copies are not in sync 120 s after the writers paused: %s", formatCopies(v))
	} else {
		cy.note("settled in %v: %s", time.Since(settled).Round(time.Millisecond), formatCopies(v))
	}
	cy.check(log, v)
	t.Logf("cycle %d (%s) in %v: %s", i, kind.name, time.Since(began).Round(time.Millisecond), strings.Join(cy.what, "; "))
	return cy
}

// check compares every in-sync copy's disks with the history and with the
// primary's.
func (cy *cycle) check(log *history.Log, v api.Volume) {
	type img struct {
		nd   *node
		data [][]byte
		sums [][32]byte
	}
	var prim *img
	var others []*img
	for _, cp := range v.Copies {
		if cp.State != api.CopyInSync {
			continue
		}
		x := &img{nd: cy.c.byName(cp.Node)}
		role := "copy"
		if cp.Node == v.Primary {
			role, prim = "primary", x
		} else {
			others = append(others, x)
		}
		for di := range disks {
			data, err := image(x.nd, volName, fmt.Sprintf("d%d", di))
			if err != nil {
				cy.failf("%s (%s): %v", x.nd.name, role, err)
				return
			}
			x.data = append(x.data, data)
			x.sums = append(x.sums, sha256.Sum256(data))
			vs := log.CheckImage(uint32(di), data)
			for k, viol := range vs {
				if k == 10 {
					cy.failf("%s (%s, in sync, term %d) disk d%d: %d more blocks", x.nd.name, role, v.Term, di, len(vs)-k)
					break
				}
				cy.failf("%s (%s, in sync, term %d): %v", x.nd.name, role, v.Term, viol)
			}
		}
	}
	if prim == nil {
		cy.failf("the primary %s is not among the in-sync copies: %s", v.Primary, formatCopies(v))
		return
	}
	for _, o := range others {
		for di := range disks {
			if o.sums[di] == prim.sums[di] {
				continue
			}
			cy.failf("disk d%d: in-sync copy %s has SHA-256 %x, the primary %s %x; %s", di, o.nd.name, o.sums[di][:8],
				prim.nd.name, prim.sums[di][:8], differing(prim.data[di], o.data[di], uint32(di)))
		}
	}
}

// differing names the first blocks where two images differ, with what
// each holds.
func differing(a, b []byte, disk uint32) string {
	var parts []string
	n := 0
	for off := 0; off+history.BlockSize <= len(a) && off+history.BlockSize <= len(b); off += history.BlockSize {
		x, y := a[off:off+history.BlockSize], b[off:off+history.BlockSize]
		if bytes.Equal(x, y) {
			continue
		}
		n++
		if len(parts) < 5 {
			parts = append(parts, fmt.Sprintf("block %d: primary %s, copy %s", off/history.BlockSize,
				describe(x, disk, int64(off)), describe(y, disk, int64(off))))
		}
	}
	return fmt.Sprintf("%d blocks differ: %s", n, strings.Join(parts, "; "))
}

func describe(b []byte, disk uint32, off int64) string {
	v, err := history.Parse(b, disk, off)
	if err != nil {
		return err.Error()
	}
	return v.String()
}
