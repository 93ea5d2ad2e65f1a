package clustertest

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/quiverstorage/quiver/internal/api"
	"github.com/quiverstorage/quiver/internal/client"
	"github.com/quiverstorage/quiver/internal/testfs"
)

// TestCutIntent: a primary killed between its own change at the cut and
// its copies' (the hidden --test-crash-point-file) leaves an intent in
// etcd, which the volume's next primary settles before it serves: a grow
// and a rollback are finished on every copy when the old primary comes
// back and wins (its copy stopped meanwhile, so it cannot be promoted: the
// finish records it diverged, and its resync makes it the primary's); a
// snapshot is undone there; clones made on the copies but never placed are
// undone on every node when the copy is promoted (the old primary's own
// clone once it is back), so the name is free again. After each, every disk is byte-identical on both
// copies, what was acknowledged before is there, and the change in flight
// is complete everywhere or absent everywhere.
func TestCutIntent(t *testing.T) {
	testfs.RequireTool(t, "qemu-io")
	crashDir := t.TempDir()
	c := startClusterWith(t, func(_ int, nd *node) {
		nd.args = append(nd.args, "--test-crash-point-file", filepath.Join(crashDir, nd.name),
			"--cluster-op-timeout", "8s")
	})
	ctx := context.Background()
	const diskSize = 4 * mib
	disks := []string{"d0", "d1"}
	prim, cp, token := c.placeAndAttach(t, api.VolumeSpec{Name: "iv", Capacity: 32 * mib, Replicas: 2,
		Disks: []api.DiskSpec{{Name: "d0", Size: diskSize}, {Name: "d1", Size: diskSize}}})
	other := c.other(prim, cp)
	uri := func(disk string) string { return fmt.Sprintf("nbd://%s:10809/iv/%s/%s", prim.ip, disk, token) }
	crashAt := func(nd *node, point string) {
		t.Helper()
		if err := os.WriteFile(filepath.Join(crashDir, nd.name), []byte(point), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	// crashed waits for nd to kill itself at its crash point, and clears
	// the point for its restart.
	crashed := func(nd *node) {
		t.Helper()
		select {
		case <-nd.proc.Exited():
		case <-time.After(time.Minute):
			t.Fatalf("%s did not stop at its crash point", nd.name)
		}
		if err := os.Remove(filepath.Join(crashDir, nd.name)); err != nil {
			t.Fatal(err)
		}
	}
	restart := func(nd *node) {
		t.Helper()
		c.spawn(nd)
		c.waitReady(nd)
	}
	// agree checks that every disk of volume is byte-identical on both
	// copies and returns their SHA-256 by disk.
	agree := func(a, b *node, volume string) map[string]string {
		t.Helper()
		out := map[string]string{}
		for _, d := range disks {
			x, y := diskSum(t, a, volume, d), diskSum(t, b, volume, d)
			if x != y {
				t.Fatalf("%s disk %s: SHA-256 %s on %s, %s on %s: the copies differ", volume, d, x, a.name, y, b.name)
			}
			out[d] = x
		}
		return out
	}
	// primaryWith: p is the primary, and every copy is in sync (sync) or
	// another copy is not (!sync).
	primaryWith := func(p *node, sync bool) func(api.Volume) bool {
		return func(v api.Volume) bool {
			all := true
			for _, cc := range v.Copies {
				all = all && cc.State == api.CopyInSync
			}
			return v.Primary == p.name && all == sync
		}
	}
	// oldPrimaryWins crashes prim at point while change runs, stops the
	// copy's process at once (so it cannot be promoted) and restarts prim,
	// which takes the volume back at its term and must record the stopped
	// copy diverged (it lacks the change); the copy then comes back and is
	// resynced.
	oldPrimaryWins := func(point string, change func() error) {
		t.Helper()
		crashAt(prim, point)
		if err := change(); err == nil {
			t.Fatalf("the change answered although its primary crashed at %s", point)
		}
		crashed(prim)
		if err := cp.proc.Signal(syscall.SIGSTOP); err != nil {
			t.Fatal(err)
		}
		stopped := time.Now()
		restart(prim)
		v := c.waitVolume(t, other, "iv", "the old primary back, its stopped copy recorded out of sync",
			primaryWith(prim, false))
		t.Logf("the old primary %s serves again %v after its copy was stopped: %s", prim.name,
			time.Since(stopped).Round(time.Millisecond), formatCopies(v))
		if err := cp.proc.Signal(syscall.SIGCONT); err != nil {
			t.Fatal(err)
		}
		c.waitVolume(t, other, "iv", "both copies in sync again", primaryWith(prim, true))
	}

	c.qemuIO(t, uri("d0"), "write -P 0x0a 0 1M", "flush")
	c.qemuIO(t, uri("d1"), "write -P 0x1a 512k 1M", "flush")
	before := agree(prim, cp, "iv")

	t.Run("grow, the old primary wins", func(t *testing.T) {
		start := time.Now()
		oldPrimaryWins("grow-disk:after-local", func() error {
			_, err := prim.api().GrowDisk(ctx, "iv", "d1", 2*diskSize)
			return err
		})
		disksEqual(t, c, "iv", []*node{prim, cp}, map[string]int64{"d0": diskSize, "d1": 2 * diskSize})
		after := agree(prim, cp, "iv")
		if after["d0"] != before["d0"] {
			t.Error("d0 changed")
		}
		for _, nd := range []*node{prim, cp} {
			if !allBytes(fileBytes(t, nd, "iv", "d1", 512<<10, mib), 0x1a) || !allBytes(fileBytes(t, nd, "iv", "d1", diskSize, diskSize), 0) {
				t.Errorf("%s's d1 lost its data or has some in the grown range", nd.name)
			}
		}
		t.Logf("grow subtest: %v", time.Since(start).Round(time.Millisecond))
	})

	t.Run("rollback, the old primary wins", func(t *testing.T) {
		start := time.Now()
		if _, err := prim.api().CreateSnapshot(ctx, "iv", "a"); err != nil {
			t.Fatal(err)
		}
		snap := map[string]string{}
		for _, d := range disks {
			snap[d] = fileSum(t, filepath.Join(prim.pool, "volumes", "iv", "snapshots", "a", d+".img"))
		}
		c.qemuIO(t, uri("d0"), "write -P 0x0b 0 3M", "flush")
		c.qemuIO(t, uri("d1"), "write -P 0x1b 0 3M", "flush")
		b := agree(prim, cp, "iv")
		if b["d0"] == snap["d0"] || b["d1"] == snap["d1"] {
			t.Fatal("B did not change the disks")
		}
		oldPrimaryWins("rollback:after-local", func() error {
			_, err := prim.api().Rollback(ctx, "iv", "a")
			return err
		})
		got := agree(prim, cp, "iv")
		for _, d := range disks {
			if got[d] != snap[d] {
				t.Errorf("disk %s: %s on both copies, want the snapshot's %s: the rollback is not complete", d, got[d], snap[d])
			}
		}
		t.Logf("rollback subtest: %v", time.Since(start).Round(time.Millisecond))
	})

	t.Run("snapshot, the old primary wins", func(t *testing.T) {
		start := time.Now()
		snapDir := func(nd *node) string { return filepath.Join(nd.pool, "volumes", "iv", "snapshots", "s") }
		crashAt(prim, "snapshot:after-local")
		if _, err := prim.api().CreateSnapshot(ctx, "iv", "s"); err == nil {
			t.Fatal("the snapshot answered although its primary crashed")
		}
		crashed(prim)
		if _, err := os.Stat(snapDir(prim)); err != nil {
			t.Fatalf("%s has no snapshot of its own: the crash point was not after it: %v", prim.name, err)
		}
		if err := cp.proc.Signal(syscall.SIGSTOP); err != nil {
			t.Fatal(err)
		}
		restart(prim)
		c.waitVolume(t, other, "iv", "the old primary back", func(v api.Volume) bool { return v.Primary == prim.name })
		if err := cp.proc.Signal(syscall.SIGCONT); err != nil {
			t.Fatal(err)
		}
		// Undone: on neither copy (the copy never took it), then the name
		// is free on both once the copy answered the undo too.
		deadline := time.Now().Add(time.Minute)
		for {
			_, err := os.Stat(snapDir(prim))
			if os.IsNotExist(err) {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("the old primary still has the snapshot of the change in flight a minute after it came back: %v", err)
			}
			time.Sleep(200 * time.Millisecond)
		}
		if _, err := os.Stat(snapDir(cp)); !os.IsNotExist(err) {
			t.Fatalf("%s has the snapshot: %v", cp.name, err)
		}
		c.waitVolume(t, other, "iv", "both copies in sync", primaryWith(prim, true))
		var snap api.Snapshot
		for {
			var err error
			if snap, err = prim.api().CreateSnapshot(ctx, "iv", "s"); err == nil {
				break
			}
			if client.Code(err) != api.CodeBusy || time.Now().After(deadline) {
				t.Fatalf("a snapshot of the undone one's name: %v", err)
			}
			time.Sleep(200 * time.Millisecond)
		}
		for _, nd := range []*node{prim, cp} {
			if s, err := nd.api().GetSnapshot(ctx, "iv", "s"); err != nil || s.UID != snap.UID {
				t.Errorf("snapshot on %s: %+v (%v), want UID %s", nd.name, s, err, snap.UID)
			}
		}
		if err := prim.api().DeleteSnapshot(ctx, "iv", "s"); err != nil {
			t.Fatal(err)
		}
		t.Logf("snapshot subtest: %v", time.Since(start).Round(time.Millisecond))
	})

	t.Run("clone, the copy promoted", func(t *testing.T) {
		start := time.Now()
		src := agree(prim, cp, "iv")
		crashAt(prim, "clone:after-copies")
		if _, err := prim.api().Clone(ctx, api.CloneSpec{Source: api.Source{Volume: "iv"}, Names: []string{"ic"}}); err == nil {
			t.Fatal("the clone answered although its primary crashed before placing it")
		}
		crashed(prim)
		old := prim
		gone := func(nd *node) bool {
			_, err := os.Stat(filepath.Join(nd.pool, "volumes", "ic"))
			return os.IsNotExist(err)
		}
		if gone(cp) || gone(old) {
			t.Fatalf("clone on %s: %v, on %s: %v: the crash point was not after every copy's clone", cp.name, !gone(cp),
				old.name, !gone(old))
		}
		c.waitVolume(t, other, "iv", "the copy promoted", func(v api.Volume) bool { return v.Primary == cp.name })
		waitFor := func(what string, ok func() bool) {
			t.Helper()
			deadline := time.Now().Add(time.Minute)
			for !ok() {
				if time.Now().After(deadline) {
					t.Fatalf("%s: not within a minute", what)
				}
				time.Sleep(200 * time.Millisecond)
			}
		}
		waitFor("the promoted copy undoes its unplaced clone", func() bool { return gone(cp) })
		if gone(old) {
			t.Fatalf("%s's clone went while it was down", old.name)
		}
		restart(old)
		waitFor("the old primary's unplaced clone deleted once it is back", func() bool { return gone(old) })
		c.waitVolume(t, other, "iv", "both copies in sync, the promoted one primary", primaryWith(cp, true))
		prim, cp = cp, old
		for _, nd := range c.nodes {
			if _, err := nd.api().GetVolume(ctx, "ic"); client.Code(err) != api.CodeNotFound {
				t.Errorf("the unplaced clone on %s: %v, want NotFound", nd.name, err)
			}
			if !gone(nd) {
				t.Errorf("%s holds the unplaced clone", nd.name)
			}
		}
		if got := agree(prim, cp, "iv"); got["d0"] != src["d0"] || got["d1"] != src["d1"] {
			t.Error("the source changed")
		}
		// Nothing of it blocks the name: a clone of that name is made.
		made, err := prim.api().Clone(ctx, api.CloneSpec{Source: api.Source{Volume: "iv"}, Names: []string{"ic"}})
		if err != nil {
			t.Fatalf("a clone of the undone one's name: %v", err)
		}
		if len(made) != 1 || len(copyNodes(made[0])) != 2 {
			t.Fatalf("clone made: %+v", made)
		}
		if got := agree(prim, cp, "ic"); got["d0"] != src["d0"] || got["d1"] != src["d1"] {
			t.Error("the new clone is not the source")
		}
		if _, err := prim.api().DeleteVolume(ctx, "ic"); err != nil {
			t.Fatal(err)
		}
		t.Logf("clone subtest: %v", time.Since(start).Round(time.Millisecond))
	})
}
