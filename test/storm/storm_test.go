package storm

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"

	quivercsi "github.com/quiverstorage/quiver/internal/csi"
	"github.com/quiverstorage/quiver/internal/csi/csitest"
	"github.com/quiverstorage/quiver/internal/testserver"
)

func TestMain(m *testing.M) { os.Exit(testserver.Main(m)) }

func envInt(t *testing.T, key string, def int) int {
	t.Helper()
	v := os.Getenv(key)
	if v == "" {
		return def
	}
	n, err := strconv.Atoi(v)
	if err != nil || n <= 0 {
		t.Fatalf("%s=%q: want a whole number above 0", key, v)
	}
	return n
}

// model is one way of provisioning the VMs.
type model struct {
	name string
	// volumes are the CreateVolume requests, one per PVC.
	volumes []*csi.CreateVolumeRequest
}

// phase is what one storm of calls measured.
type phase struct {
	done, failed int64
	wall         time.Duration
	stopped      bool // the budget ran out before every call was made
}

func (p phase) String() string {
	s := fmt.Sprintf("%d in %v", p.done, p.wall.Round(time.Millisecond))
	if p.stopped {
		s += " (budget out)"
	}
	if p.failed > 0 {
		s += fmt.Sprintf(", %d failed", p.failed)
	}
	return s
}

func (p phase) rate() float64 { return float64(p.done) / p.wall.Seconds() }

// result is what one model measured.
type result struct {
	model          string
	volumes, disks int
	create         phase
	csiSnap        phase // CreateSnapshot through the CSI controller
	apiSnap        phase // the same snapshots through the quiver API alone
}

const diskSize = 1 << 30

var mountCap = []*csi.VolumeCapability{{
	AccessType: &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{}},
	AccessMode: &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_MULTI_NODE_MULTI_WRITER},
}}

func perVM(vms, disks int) model {
	names := []string{"disk"}
	for i := 1; i < disks; i++ {
		names = append(names, fmt.Sprintf("data%d", i))
	}
	var layout []string
	for _, n := range names {
		layout = append(layout, n+"=1Gi")
	}
	m := model{name: "per VM (quiver)"}
	for i := range vms {
		m.volumes = append(m.volumes, &csi.CreateVolumeRequest{
			Name:               fmt.Sprintf("pvc-vm-%05d", i),
			CapacityRange:      &csi.CapacityRange{RequiredBytes: int64(disks) * diskSize},
			VolumeCapabilities: mountCap,
			Parameters:         map[string]string{quivercsi.ParamDisks: strings.Join(layout, ",")},
		})
	}
	return m
}

func perDisk(vms, disks int) model {
	m := model{name: "per disk (today's drivers)"}
	for i := range vms {
		for d := range disks {
			m.volumes = append(m.volumes, &csi.CreateVolumeRequest{
				Name:               fmt.Sprintf("pvc-vm-%05d-disk-%d", i, d),
				CapacityRange:      &csi.CapacityRange{RequiredBytes: diskSize},
				VolumeCapabilities: mountCap,
			})
		}
	}
	return m
}

// TestProvisioningStorm is the benchmark of the package comment.
func TestProvisioningStorm(t *testing.T) {
	if os.Getenv("QUIVER_BENCH") != "1" {
		t.Skip("a benchmark: set QUIVER_BENCH=1 (make bench-storm)")
	}
	vms := envInt(t, "QUIVER_STORM_VMS", 1000)
	disks := envInt(t, "QUIVER_STORM_DISKS", 4)
	workers := envInt(t, "QUIVER_STORM_WORKERS", 10)
	budget := time.Duration(envInt(t, "QUIVER_STORM_BUDGET", 600)) * time.Second
	rounds := envInt(t, "QUIVER_STORM_ROUNDS", 1)
	createOnly := false
	switch v := os.Getenv("QUIVER_STORM_PHASES"); v {
	case "", "all":
	case "create":
		createOnly = true
	default:
		t.Fatalf("QUIVER_STORM_PHASES=%q: want all or create", v)
	}
	bin := testserver.Binary(t, false)
	var ratios []float64
	for round := range rounds {
		results := stormRound(t, bin, vms, disks, workers, budget, createOnly)
		if rounds > 1 {
			fmt.Printf("\nround %d of %d, load average %s", round+1, rounds, loadavg())
		}
		ratios = append(ratios, printResults(results, vms, disks, workers, budget, createOnly))
	}
	if rounds > 1 {
		sorted := slices.Clone(ratios)
		slices.Sort(sorted)
		fmt.Printf("\nCreateVolume, per disk / per VM, %d rounds: %s; median %.2fx\n", rounds,
			strings.Trim(fmt.Sprintf("%.2f", ratios), "[]"), sorted[len(sorted)/2])
	}
}

// stormRound measures each model on a fresh server, phase by phase, the
// two models one after the other: creates, snapshots through CSI,
// snapshots through the API (the snapshot phases unless createOnly). The
// servers stop and their pools go before it returns.
func stormRound(t *testing.T, bin string, vms, disks, workers int, budget time.Duration, createOnly bool) []result {
	models := []model{perVM(vms, disks), perDisk(vms, disks)}
	envs := make([]*env, len(models))
	results := make([]result, len(models))
	for i, m := range models {
		envs[i] = newEnv(t, bin)
		defer envs[i].close(t)
		results[i] = result{model: m.name, volumes: len(m.volumes), disks: vms * disks}
	}
	for i, m := range models {
		results[i].create = envs[i].createAll(m, workers, budget)
		t.Logf("%s: CreateVolume %v", m.name, results[i].create)
	}
	if createOnly {
		return results
	}
	for i, m := range models {
		results[i].csiSnap = envs[i].snapshotCSI(m, workers, budget)
		t.Logf("%s: CreateSnapshot %v", m.name, results[i].csiSnap)
	}
	for i, m := range models {
		results[i].apiSnap = envs[i].snapshotAPI(t, m, workers, budget)
		t.Logf("%s: API snapshots %v", m.name, results[i].apiSnap)
	}
	return results
}

// printResults prints one round's table and ratios, and returns the
// CreateVolume ratio (per disk / per VM, the time to provision every disk).
func printResults(results []result, vms, disks, workers int, budget time.Duration, createOnly bool) float64 {
	fs, _ := exec.Command("stat", "-f", "-c", "%T", poolParent()).Output()
	fmt.Printf("\nprovisioning storm: %d VMs x %d disks, %d workers, pool on %s, %d CPUs, budget %v per phase\n",
		vms, disks, workers, strings.TrimSpace(string(fs)), nproc(), budget)
	if createOnly {
		fmt.Printf("%-27s %7s %7s | %-24s %8s\n", "model", "PVC+PV", "disks", "CreateVolume", "/s")
		for _, r := range results {
			fmt.Printf("%-27s %7d %7d | %-24v %8.1f\n", r.model, 2*r.volumes, r.disks, r.create, r.create.rate())
		}
	} else {
		fmt.Printf("%-27s %7s %6s %7s | %-24s %8s | %-24s %8s | %-22s %8s\n", "model", "PVC+PV", "VS+VSC", "disks",
			"CreateVolume", "/s", "CreateSnapshot (CSI)", "/s", "snapshot (quiver API)", "/s")
		for _, r := range results {
			fmt.Printf("%-27s %7d %6d %7d | %-24v %8.1f | %-24v %8.1f | %-22v %8.1f\n", r.model, 2*r.volumes, 2*r.volumes, r.disks,
				r.create, r.create.rate(), r.csiSnap, r.csiSnap.rate(), r.apiSnap, r.apiSnap.rate())
		}
	}
	a, b := results[0], results[1]
	ratio := (b.create.wall.Seconds() / float64(max(b.create.done, 1)) * float64(b.volumes)) / a.create.wall.Seconds()
	fmt.Printf("time to provision all %d disks: per disk / per VM = %.2fx (CreateVolume)\n", a.disks, ratio)
	if !createOnly {
		fmt.Printf("time to snapshot all %d disks: per disk / per VM = %.2fx through CSI, %.2fx through the quiver API\n", a.disks,
			(b.csiSnap.wall.Seconds()/float64(max(b.csiSnap.done, 1))*float64(b.volumes))/(a.csiSnap.wall.Seconds()/float64(max(a.csiSnap.done, 1))*float64(a.volumes)),
			(b.apiSnap.wall.Seconds()/float64(max(b.apiSnap.done, 1))*float64(b.volumes))/(a.apiSnap.wall.Seconds()/float64(max(a.apiSnap.done, 1))*float64(a.volumes)))
	}
	fmt.Println("(a phase stopped by the budget is extrapolated at its average rate, which only understates a rate that falls)")
	return ratio
}

// loadavg is the first three fields of /proc/loadavg.
func loadavg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "unknown"
	}
	return strings.Join(strings.Fields(string(b))[:3], " ")
}

func nproc() int {
	out, err := exec.Command("nproc").Output()
	if err != nil {
		return 0
	}
	n, _ := strconv.Atoi(strings.TrimSpace(string(out)))
	return n
}

func poolParent() string {
	if dir := os.Getenv("QUIVER_BENCH_DIR"); dir != "" {
		return dir
	}
	return os.TempDir()
}

// env is one model's server and CSI controller, and the IDs it created.
type env struct {
	srv    *testserver.Process
	pool   string
	plugin *csitest.Plugin
	ctrl   csi.ControllerClient
	ids    []string
}

func newEnv(t *testing.T, bin string) *env {
	t.Helper()
	pool, err := os.MkdirTemp(poolParent(), "quiver-storm-")
	if err != nil {
		t.Fatal(err)
	}
	srv, err := testserver.Start(context.Background(), bin, testserver.Options{Pool: pool, LogLevel: "warn"})
	if err != nil {
		os.RemoveAll(pool)
		t.Fatal(err)
	}
	e := &env{srv: srv, pool: pool}
	// The CSI plugin in controller mode, in process.
	e.plugin = csitest.Start(t, quivercsi.Config{Mode: quivercsi.ModeController, Server: "http://" + srv.APIAddr})
	e.ctrl = e.plugin.Controller()
	return e
}

// close stops the controller and the server and removes the pool.
func (e *env) close(t *testing.T) {
	t.Helper()
	e.plugin.Stop()
	if err := e.srv.Stop(time.Minute); err != nil {
		t.Error(err)
	}
	os.RemoveAll(e.pool)
}

func (e *env) createAll(m model, workers int, budget time.Duration) phase {
	e.ids = make([]string, len(m.volumes))
	return storm(len(m.volumes), workers, budget, func(ctx context.Context, i int) error {
		resp, err := e.ctrl.CreateVolume(ctx, m.volumes[i])
		e.ids[i] = resp.GetVolume().GetVolumeId()
		return err
	})
}

func (e *env) snapshotCSI(m model, workers int, budget time.Duration) phase {
	return storm(len(m.volumes), workers, budget, func(ctx context.Context, i int) error {
		if e.ids[i] == "" {
			return fmt.Errorf("no volume %s", m.volumes[i].Name)
		}
		_, err := e.ctrl.CreateSnapshot(ctx, &csi.CreateSnapshotRequest{Name: "snap-" + m.volumes[i].Name, SourceVolumeId: e.ids[i]})
		return err
	})
}

// snapshotAPI takes a second snapshot of every volume through the quiver API
// directly: the storage's cost without the CSI driver's name lookups.
func (e *env) snapshotAPI(t *testing.T, m model, workers int, budget time.Duration) phase {
	return storm(len(m.volumes), workers, budget, func(ctx context.Context, i int) error {
		if e.ids[i] == "" {
			return fmt.Errorf("no volume %s", m.volumes[i].Name)
		}
		_, err := e.srv.API.CreateSnapshot(ctx, e.ids[i], "api")
		return err
	})
}

// storm runs call(0..n-1) from workers goroutines, starting no new call
// once budget has passed, and returns what it measured; failures are
// counted (the first few printed). Progress goes to stderr every 30 s.
func storm(n, workers int, budget time.Duration, call func(context.Context, int) error) phase {
	var next, done, failed atomic.Int64
	var wg sync.WaitGroup
	start := time.Now()
	deadline := start.Add(budget)
	stop := make(chan struct{})
	go func() {
		tick := time.NewTicker(30 * time.Second)
		defer tick.Stop()
		for {
			select {
			case <-stop:
				return
			case <-tick.C:
				fmt.Fprintf(os.Stderr, "  ... %d of %d after %v\n", done.Load(), n, time.Since(start).Round(time.Second))
			}
		}
	}()
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for time.Now().Before(deadline) {
				i := int(next.Add(1) - 1)
				if i >= n {
					return
				}
				if err := call(context.Background(), i); err != nil {
					if failed.Add(1) <= 3 {
						fmt.Fprintf(os.Stderr, "call %d: %v\n", i, err)
					}
				}
				done.Add(1)
			}
		}()
	}
	wg.Wait()
	close(stop)
	p := phase{wall: time.Since(start), done: done.Load(), failed: failed.Load()}
	p.stopped = p.done < int64(n)
	return p
}
