package storm

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	quivercsi "github.com/quiverstorage/quiver/internal/csi"
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

// result is what one model measured.
type result struct {
	model           string
	volumes, disks  int
	create, snap    time.Duration
	createFailed    int64
	snapshotsFailed int64
	poolFiles       int
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
	bin := testserver.Binary(t, false)
	var results []result
	for _, m := range []model{perVM(vms, disks), perDisk(vms, disks)} {
		results = append(results, run(t, bin, m, disks, workers))
	}
	fs, _ := exec.Command("stat", "-f", "-c", "%T", poolParent(t)).Output()
	fmt.Printf("\nprovisioning storm: %d VMs x %d disks, %d workers, pool on %s, %d CPUs\n",
		vms, disks, workers, strings.TrimSpace(string(fs)), nproc())
	fmt.Printf("%-28s %8s %8s %12s %10s %12s %10s %8s\n", "model", "PVC+PV", "disks", "create", "create/s", "snapshot", "snap/s", "VS+VSC")
	for _, r := range results {
		fmt.Printf("%-28s %8d %8d %12v %10.0f %12v %10.0f %8d\n", r.model, 2*r.volumes, r.disks,
			r.create.Round(time.Millisecond), float64(r.volumes)/r.create.Seconds(),
			r.snap.Round(time.Millisecond), float64(r.volumes)/r.snap.Seconds(), 2*r.volumes)
		if r.createFailed+r.snapshotsFailed > 0 {
			fmt.Printf("  %d CreateVolume and %d CreateSnapshot calls failed\n", r.createFailed, r.snapshotsFailed)
		}
	}
	a, b := results[0], results[1]
	fmt.Printf("per disk / per VM: create %.2fx the time, snapshot %.2fx the time, %.1fx the Kubernetes objects\n",
		b.create.Seconds()/a.create.Seconds(), b.snap.Seconds()/a.snap.Seconds(), float64(b.volumes)/float64(a.volumes))
}

func nproc() int {
	out, err := exec.Command("nproc").Output()
	if err != nil {
		return 0
	}
	n, _ := strconv.Atoi(strings.TrimSpace(string(out)))
	return n
}

func poolParent(t *testing.T) string {
	if dir := os.Getenv("QUIVER_BENCH_DIR"); dir != "" {
		return dir
	}
	return os.TempDir()
}

// run provisions one model on a fresh server and pool: every volume, then
// a snapshot of every volume.
func run(t *testing.T, bin string, m model, disks, workers int) result {
	t.Helper()
	pool, err := os.MkdirTemp(poolParent(t), "quiver-storm-")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(pool)
	srv, err := testserver.Start(context.Background(), bin, testserver.Options{Pool: pool, LogLevel: "warn"})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := srv.Stop(time.Minute); err != nil {
			t.Error(err)
		}
	}()
	ctrl := startController(t, "http://"+srv.APIAddr)

	r := result{model: m.name, volumes: len(m.volumes), disks: len(m.volumes)}
	if m.volumes[0].Parameters[quivercsi.ParamDisks] != "" {
		r.disks = len(m.volumes) * disks
	}
	ids := make([]string, len(m.volumes))
	r.create = storm(len(m.volumes), workers, &r.createFailed, func(ctx context.Context, i int) error {
		resp, err := ctrl.CreateVolume(ctx, m.volumes[i])
		ids[i] = resp.GetVolume().GetVolumeId()
		return err
	})
	r.snap = storm(len(m.volumes), workers, &r.snapshotsFailed, func(ctx context.Context, i int) error {
		if ids[i] == "" {
			return fmt.Errorf("no volume")
		}
		_, err := ctrl.CreateSnapshot(ctx, &csi.CreateSnapshotRequest{Name: "snap-" + m.volumes[i].Name, SourceVolumeId: ids[i]})
		return err
	})
	if n := r.createFailed + r.snapshotsFailed; n > 0 {
		t.Logf("%s: %d calls failed", m.name, n)
	}
	t.Logf("%s: %d volumes in %v, %d snapshots in %v", m.name, r.volumes, r.create, r.volumes, r.snap)
	return r
}

// storm runs call(0..n-1) from workers goroutines and returns the wall
// time; failures are counted (the first few logged).
func storm(n, workers int, failed *int64, call func(context.Context, int) error) time.Duration {
	var next atomic.Int64
	var wg sync.WaitGroup
	start := time.Now()
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1) - 1)
				if i >= n {
					return
				}
				if err := call(context.Background(), i); err != nil {
					if atomic.AddInt64(failed, 1) <= 3 {
						fmt.Fprintf(os.Stderr, "call %d: %v\n", i, err)
					}
				}
			}
		}()
	}
	wg.Wait()
	return time.Since(start)
}

// startController runs the CSI plugin in controller mode on a unix socket,
// in process, and returns a gRPC client of it.
func startController(t *testing.T, server string) csi.ControllerClient {
	t.Helper()
	dir, err := os.MkdirTemp("", "qstorm")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	sock := filepath.Join(dir, "csi.sock")
	d, err := quivercsi.New(quivercsi.Config{
		Mode: quivercsi.ModeController, Endpoint: "unix://" + sock, Server: server,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- d.ServeListener(ctx, ln) }()
	conn, err := grpc.NewClient("unix://"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		conn.Close()
		cancel()
		if err := <-done; err != nil {
			t.Errorf("plugin: %v", err)
		}
	})
	return csi.NewControllerClient(conn)
}
