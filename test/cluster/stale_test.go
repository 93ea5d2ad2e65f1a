package clustertest

import (
	"context"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/quiverstorage/quiver/internal/api"
	"github.com/quiverstorage/quiver/internal/pool"
	"github.com/quiverstorage/quiver/internal/replica"
	"github.com/quiverstorage/quiver/internal/testfs"
)

// TestStaleCopy: a copy's node is killed and stays down past
// --rebuild-after (4 s), so its copy is rebuilt on the third node. Meanwhile
// a volume that etcd does not know (made in the dead node's pool directly,
// with replicas 2 in its manifest like a copy) and a dirty bitmap of the
// stale copy's UID are put in its pool. When the node comes back it deletes
// its stale copy and that bitmap, leaves the unknown volume untouched, and
// the volume's data is intact on its two current copies.
func TestStaleCopy(t *testing.T) {
	testfs.RequireTool(t, "qemu-io")
	c := startClusterWith(t, func(_ int, nd *node) {
		nd.args = append(nd.args, "--rebuild-after", "4s")
	})
	ctx := context.Background()
	const diskSize = 16 * mib
	prim, gone, spare, uri := c.oneDiskReplicated(t, "st", diskSize)
	c.qemuIO(t, uri, "write -P 0x53 0 4M", "flush")

	gone.proc.Kill()
	killed := time.Now()
	// Written while the copy is down: on the primary and the rebuilt copy
	// only.
	c.qemuIO(t, uri, "write -P 0x54 8M 2M", "flush")
	deadline := time.Now().Add(3 * time.Minute)
	for {
		got, err := prim.api().GetVolume(ctx, "st")
		if err == nil && inSyncOnly(got, prim.name, spare.name) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no rebuilt copy on %s after 3 minutes (%v)", spare.name, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
	t.Logf("rebuilt on %s %v after %s was killed", spare.name, time.Since(killed).Round(time.Millisecond), gone.name)

	// The dead node's pool: its stale copy, a volume etcd does not know and
	// a bitmap kept for the stale copy.
	p, err := pool.Open(ctx, gone.pool, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	sv, err := p.Volume("st")
	if err != nil {
		t.Fatalf("the stale copy is not in %s's pool before its restart: %v", gone.name, err)
	}
	staleUID := sv.Info().UID
	local, _, err := p.Create(ctx, pool.VolumeSpec{Name: "local1", Capacity: 4 * mib, Replicas: 2,
		Disks: []pool.DiskSpec{{Name: "root", Size: 4 * mib}}})
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	bitmaps := filepath.Join(gone.pool, replica.BitmapDir(staleUID))
	if err := os.MkdirAll(bitmaps, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(bitmaps, "root."+spare.name), make([]byte, 64), 0o600); err != nil {
		t.Fatal(err)
	}

	restarted := time.Now()
	c.spawn(gone)
	c.waitReady(gone)
	// The deletion is logged once the copy, its bitmaps and its state are
	// gone.
	for !strings.Contains(gone.proc.Log.String(), "stale copy deleted") {
		if time.Since(restarted) > 90*time.Second {
			t.Fatalf("%s logged no stale copy deleted 90 s after its restart", gone.name)
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Logf("stale copy deleted %v after the restart", time.Since(restarted).Round(time.Millisecond))
	if _, err := os.Stat(filepath.Join(gone.pool, "volumes", "st")); !os.IsNotExist(err) {
		t.Errorf("%s still holds its stale copy (%v)", gone.name, err)
	}
	if _, err := os.Stat(bitmaps); !os.IsNotExist(err) {
		t.Errorf("the stale copy's bitmaps %s are still there (%v)", bitmaps, err)
	}
	log := gone.proc.Log.String()
	if !strings.Contains(log, staleUID) {
		t.Errorf("%s's log does not say which stale copy it deleted (uid %s)", gone.name, staleUID)
	}
	if !strings.Contains(log, "not in etcd") {
		t.Errorf("%s's log does not say it left local1 alone (not in etcd)", gone.name)
	}

	// The unknown volume is untouched: the same UID, served by the node.
	lv, err := gone.api().GetVolume(ctx, "local1")
	if err != nil {
		t.Fatalf("local1 on %s after the restart: %v", gone.name, err)
	}
	if lv.UID != local.UID {
		t.Errorf("local1 is %s, was %s", lv.UID, local.UID)
	}

	// The volume is on its two current copies, in sync, with its data.
	got, err := gone.api().GetVolume(ctx, "st")
	if err != nil {
		t.Fatal(err)
	}
	if !inSyncOnly(got, prim.name, spare.name) {
		t.Fatalf("copies after the restart: %s", formatCopies(got))
	}
	c.qemuIO(t, uri, "read -P 0x53 0 4M", "read -P 0x54 8M 2M")
	for _, nd := range []*node{prim, spare} {
		if !allBytes(fileBytes(t, nd, "st", "root", 0, 4*mib), 0x53) || !allBytes(fileBytes(t, nd, "st", "root", 8*mib, 2*mib), 0x54) {
			t.Errorf("the data of st is not on %s's copy", nd.name)
		}
	}
	if a, b := diskSum(t, prim, "st", "root"), diskSum(t, spare, "st", "root"); a != b {
		t.Errorf("copies differ: %s %s, %s %s", prim.name, a, spare.name, b)
	}
}

// inSyncOnly says whether v's copies are exactly on a and b, both in sync.
func inSyncOnly(v api.Volume, a, b string) bool {
	if len(v.Copies) != 2 {
		return false
	}
	for _, cp := range v.Copies {
		if (cp.Node != a && cp.Node != b) || cp.State != api.CopyInSync {
			return false
		}
	}
	return true
}
