package poolopen

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/quiverstorage/quiver/internal/api"
	"github.com/quiverstorage/quiver/internal/client"
	"github.com/quiverstorage/quiver/internal/testfs"
	"github.com/quiverstorage/quiver/internal/testserver"
)

const mib = 1 << 20

// runServer runs `quiver server` with args expecting it to fail at start,
// and returns its output.
func runServer(t *testing.T, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, quiverBin, append([]string{"server"}, args...)...).CombinedOutput()
	if err == nil {
		t.Fatalf("quiver server %s exited 0; want a refusal:\n%s", strings.Join(args, " "), out)
	}
	if ctx.Err() != nil {
		t.Fatalf("quiver server %s still ran after 30s; want a refusal:\n%s", strings.Join(args, " "), out)
	}
	return string(out)
}

func createVolume(t *testing.T, c *client.Client, name string) {
	t.Helper()
	_, err := c.CreateVolume(t.Context(), api.VolumeSpec{Name: name, Capacity: 16 * mib,
		Disks: []api.DiskSpec{{Name: "root", Size: 8 * mib}}})
	if err != nil {
		t.Fatal(err)
	}
}

// TestSecondServerIsRefused (issue 14, bug 1): a second server on the same
// pool fails before it touches the pool, naming the first one's PID, both on
// the first one's ports and on others; the first keeps serving and its work
// in progress in staging/ survives.
func TestSecondServerIsRefused(t *testing.T) {
	pool := filepath.Join(t.TempDir(), "pool")
	first := testserver.StartT(t, quiverBin, testserver.Options{Pool: pool, NBDTCP: true})
	createVolume(t, first.API, "web")
	inflight := filepath.Join(pool, "staging", "vol-0123456789abcdef")
	if err := os.MkdirAll(filepath.Join(inflight, "disks"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(inflight, "disks", "root.img"), []byte("a clone in progress"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ name, api, nbd string }{
		{"same ports", first.APIAddr, first.NBDAddr},
		{"other ports", "127.0.0.1:0", "127.0.0.1:0"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out := runServer(t, "--pool", pool, "--listen", tc.api, "--nbd-listen", tc.nbd)
			if want := fmt.Sprintf("process %d", first.PID()); !strings.Contains(out, want) {
				t.Fatalf("the refusal does not name the first server (%s):\n%s", want, out)
			}
			if _, err := os.Stat(filepath.Join(inflight, "disks", "root.img")); err != nil {
				t.Fatalf("the second server touched the first one's staging: %v", err)
			}
			if _, err := first.API.GetVolume(t.Context(), "web"); err != nil {
				t.Fatalf("the first server stopped serving: %v", err)
			}
		})
	}
}

// TestAbsentPoolIsRefused: a pool whose filesystem is not mounted
// (--expect-mount on a plain directory) or that lost pool.json does not
// become a new, empty pool.
func TestAbsentPoolIsRefused(t *testing.T) {
	plain := t.TempDir()
	out := runServer(t, "--pool", plain, "--expect-mount", "--listen", "127.0.0.1:0", "--nbd-listen=")
	if !strings.Contains(out, "not a mount point") {
		t.Fatalf("--expect-mount on a plain directory:\n%s", out)
	}
	if es, _ := os.ReadDir(plain); len(es) != 0 {
		t.Fatalf("the refused server wrote into the directory: %v", es)
	}

	pool := filepath.Join(t.TempDir(), "pool")
	srv := testserver.StartT(t, quiverBin, testserver.Options{Pool: pool})
	createVolume(t, srv.API, "web")
	if err := srv.Stop(20 * time.Second); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(filepath.Join(pool, "pool.json")); err != nil {
		t.Fatal(err)
	}
	out = runServer(t, "--pool", pool, "--listen", "127.0.0.1:0", "--nbd-listen=")
	if !strings.Contains(out, "no pool.json") {
		t.Fatalf("a pool without pool.json:\n%s", out)
	}
	if _, err := os.Stat(filepath.Join(pool, "pool.json")); err == nil {
		t.Fatal("the refused server made a new pool identity")
	}
}

// TestQuarantinedVolume: a volume whose disk image is a link to a file
// outside the pool is listed as broken and refused, the file is not
// touched, and the other volume is served.
func TestQuarantinedVolume(t *testing.T) {
	base := t.TempDir()
	pool, victim := filepath.Join(base, "pool"), filepath.Join(base, "victim")
	if err := os.WriteFile(victim, []byte("not a disk"), 0o644); err != nil {
		t.Fatal(err)
	}
	srv, err := testserver.Start(t.Context(), quiverBin, testserver.Options{Pool: pool})
	if err != nil {
		t.Fatal(err)
	}
	createVolume(t, srv.API, "good")
	createVolume(t, srv.API, "bad")
	if err := srv.Stop(20 * time.Second); err != nil {
		t.Fatal(err)
	}
	img := filepath.Join(pool, "volumes", "bad", "disks", "root.img")
	if err := os.Remove(img); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(victim, img); err != nil {
		t.Fatal(err)
	}
	srv = testserver.StartT(t, quiverBin, testserver.Options{Pool: pool})
	ctx := t.Context()
	vols, err := srv.API.ListVolumes(ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	states := map[string]string{}
	for _, v := range vols {
		states[v.Name] = v.State
	}
	if states["bad"] != api.VolumeBroken || states["good"] != "" || len(states) != 2 {
		t.Fatalf("states %v: want bad broken, good healthy", states)
	}
	if _, err := srv.API.DeleteVolume(ctx, "bad"); client.Code(err) != api.CodeBroken {
		t.Fatalf("delete of a broken volume: %v, want code %s", err, api.CodeBroken)
	}
	if _, err := srv.API.CreateSnapshot(ctx, "good", "s1"); err != nil {
		t.Fatalf("the healthy volume: %v", err)
	}
	if b, _ := os.ReadFile(victim); !bytes.Equal(b, []byte("not a disk")) {
		t.Fatalf("the file outside the pool changed: %q", b)
	}
	if !strings.Contains(srv.Log.String(), "level=ERROR") {
		t.Fatal("the quarantine was not logged at error level")
	}
}

// TestReadOnlyPool: a pool without write permission is served read-only:
// NBD exports are read-only (nbdinfo), changes are refused with ReadOnly,
// and nothing in the pool changes.
func TestReadOnlyPool(t *testing.T) {
	testfs.RequireTool(t, "nbdinfo")
	pool := filepath.Join(t.TempDir(), "pool")
	srv, err := testserver.Start(t.Context(), quiverBin, testserver.Options{Pool: pool})
	if err != nil {
		t.Fatal(err)
	}
	createVolume(t, srv.API, "web")
	if err := srv.Stop(20 * time.Second); err != nil {
		t.Fatal(err)
	}
	testfs.ReadOnlyTree(t, pool)
	before := testfs.TreeSum(t, pool)
	srv = testserver.StartT(t, quiverBin, testserver.Options{Pool: pool, NBDTCP: true})
	info, err := srv.API.Pool(t.Context())
	if err != nil || !info.ReadOnly {
		t.Fatalf("pool info %+v, %v: want readOnly", info, err)
	}
	out, err := exec.Command("nbdinfo", srv.URI("web/root")).CombinedOutput()
	if err != nil {
		t.Fatalf("nbdinfo: %v\n%s", err, out)
	}
	if !strings.Contains(string(out), "is_read_only: true") {
		t.Fatalf("the export is not read-only:\n%s", out)
	}
	if _, err := srv.API.CreateSnapshot(t.Context(), "web", "s1"); client.Code(err) != api.CodeReadOnly {
		t.Fatalf("snapshot on a read-only pool: %v, want code %s", err, api.CodeReadOnly)
	}
	if err := srv.Stop(20 * time.Second); err != nil {
		t.Fatal(err)
	}
	if after := testfs.TreeSum(t, pool); after != before {
		t.Fatal("the read-only pool changed")
	}
}

// TestJobHistorySurvivesRestart: `quiver job list` after a restart shows
// the jobs of the last run, with their outcome.
func TestJobHistorySurvivesRestart(t *testing.T) {
	pool := filepath.Join(t.TempDir(), "pool")
	srv, err := testserver.Start(t.Context(), quiverBin, testserver.Options{Pool: pool})
	if err != nil {
		t.Fatal(err)
	}
	createVolume(t, srv.API, "web01")
	j, err := srv.API.StartSnapshot(t.Context(), "web01", "nightly")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := srv.API.WaitJob(t.Context(), j.ID, 10*time.Millisecond, nil); err != nil {
		t.Fatal(err)
	}
	if err := srv.Stop(20 * time.Second); err != nil {
		t.Fatal(err)
	}
	srv = testserver.StartT(t, quiverBin, testserver.Options{Pool: pool})
	got, err := srv.API.GetJob(t.Context(), j.ID)
	if err != nil {
		t.Fatalf("the snapshot job is gone after a restart: %v", err)
	}
	if got.State != api.JobSucceeded || got.Kind != "snapshot" || got.Target != j.Target {
		t.Fatalf("after a restart: %+v, want the succeeded snapshot %+v", got, j)
	}
}
