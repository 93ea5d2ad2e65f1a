package cli

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/quiverstorage/quiver/internal/api"
)

// TestVolumeListMarksBroken: a quarantined volume is listed, marked BROKEN
// with its reason, beside healthy ones; `volume get` says so too.
func TestVolumeListMarksBroken(t *testing.T) {
	f, url := newFakeAPI(t)
	broken := api.Volume{Name: "v2", State: api.VolumeBroken, Reason: `disks/root.img: file in the pool leads outside it`}
	f.reply("GET /v1/volumes", 200, api.List[api.Volume]{Items: []api.Volume{testVolumes[0], broken}})
	f.reply("GET /v1/volumes/v2", 200, broken)
	got := run(t, context.Background(), url, nil, "volume", "list")
	want := `NAME    CAPACITY   DISKS                                                       SNAPSHOTS   LABELS           AGE
web01   200Gi      root=40Gi,data=100Gi                                        2           app=web,tier=1   3h
v2      -          BROKEN: disks/root.img: file in the pool leads outside it   -           -                -
`
	if got.code != 0 || got.stdout != want {
		t.Fatalf("exit %d, stderr %q, stdout:\n%s\nwant:\n%s", got.code, got.stderr, got.stdout, want)
	}
	got = run(t, context.Background(), url, nil, "volume", "get", "v2")
	if got.code != 0 || !strings.Contains(got.stdout, "BROKEN") || !strings.Contains(got.stdout, broken.Reason) {
		t.Fatalf("exit %d, stdout:\n%s", got.code, got.stdout)
	}
}

// TestPoolInit makes a pool in an empty directory and refuses a second one
// there, and a directory holding other files.
func TestPoolInit(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "pool")
	got := run(t, context.Background(), "http://127.0.0.1:1", nil, "pool", "init", dir)
	if got.code != 0 || !strings.Contains(got.stdout, "created in "+dir) {
		t.Fatalf("exit %d, stderr %q, stdout %q", got.code, got.stderr, got.stdout)
	}
	if _, err := os.Stat(filepath.Join(dir, "pool.json")); err != nil {
		t.Fatal(err)
	}
	got = run(t, context.Background(), "http://127.0.0.1:1", nil, "pool", "init", dir)
	if got.code == 0 || !strings.Contains(got.stderr, "already a pool") {
		t.Fatalf("second init: exit %d, stderr %q", got.code, got.stderr)
	}
	other := t.TempDir()
	if err := os.WriteFile(filepath.Join(other, "notes"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	got = run(t, context.Background(), "http://127.0.0.1:1", nil, "pool", "init", other)
	if got.code == 0 || !strings.Contains(got.stderr, "not empty") {
		t.Fatalf("init over other files: exit %d, stderr %q", got.code, got.stderr)
	}
}

// TestVolumeGetDeleting: `volume get` of a volume being deleted says so,
// with each copy's state as the server words it (a copy its node deleted
// is "deleted", never "being made").
func TestVolumeGetDeleting(t *testing.T) {
	f, url := newFakeAPI(t)
	v := testVolumes[0]
	v.State, v.Primary, v.Term, v.Replicas = api.VolumeDeleting, "n1", 2, 2
	v.Copies = []api.Copy{{Node: "n1", State: api.CopyDeleted}, {Node: "n2", State: api.CopyInSync}}
	f.reply("GET /v1/volumes/web01", 200, v)
	got := run(t, context.Background(), url, nil, "volume", "get", "web01")
	if got.code != 0 {
		t.Fatalf("exit %d, stderr %q", got.code, got.stderr)
	}
	for _, want := range []string{"State:", "deleting", "n1 (primary, deleted), n2 (in-sync); term 2"} {
		if !strings.Contains(got.stdout, want) {
			t.Errorf("volume get of a deleting volume lacks %q:\n%s", want, got.stdout)
		}
	}
	if strings.Contains(got.stdout, "being made") {
		t.Errorf("volume get of a deleting volume says a copy is being made:\n%s", got.stdout)
	}
}
