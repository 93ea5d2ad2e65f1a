package clustertest

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/quiverstorage/quiver/internal/api"
	"github.com/quiverstorage/quiver/internal/client"
)

// TestDrain (issue 15, `quiver node drain`): with the writer of the
// failover tests running (every acknowledged write and FLUSH logged),
//
//   - the node of a volume's primary is drained: its copy moves to the one
//     eligible node (rebuilt there), the primary is handed over to an
//     in-sync copy at term+1, and the client, sent elsewhere, goes on
//     without an error;
//   - after an undrain, the node of the other, non-primary, copy is drained
//     the same way (the copy leaves the placement and is deleted there).
//
// Each time the drain job succeeds with its bytes counted, the node is
// shown drained and holds no copy (none placed in etcd, none in its pool),
// every slot holds its last acknowledged write on the new primary, and the
// copies of every disk have the same SHA-256. A drain with nowhere to put a
// copy (a replicas=3 volume on three nodes) is refused with nothing
// changed, a drain sent to another node than the drained one is refused
// naming it, and a drained node gets no new copy.
func TestDrain(t *testing.T) {
	c := startCluster(t)
	ctx := context.Background()
	c.waitNodes(c.nodes[0], "n1 n2 n3 up", allUp("n1", "n2", "n3"))

	// Refused: a copy with nowhere to go; nothing changed.
	if _, err := c.nodes[0].api().CreateVolume(ctx, api.VolumeSpec{Name: "wide", Capacity: 4 << 20, Replicas: 3,
		Disks: []api.DiskSpec{{Name: "d0", Size: 4 << 20}}}); err != nil {
		t.Fatal(err)
	}
	_, err := c.nodes[0].api().StartDrain(ctx, "n1")
	if client.Code(err) != api.CodeNotEnoughNodes || !strings.Contains(err.Error(), `volume "wide"`) {
		t.Fatalf("drain with a replicas=3 volume on three nodes: %v, want %s naming the volume", err, api.CodeNotEnoughNodes)
	}
	t.Logf("refused: %v", err)
	for _, n := range c.waitNodes(c.nodes[0], "n1 n2 n3 up", allUp("n1", "n2", "n3")) {
		if n.Drain != "" {
			t.Fatalf("refused drain left %s %s", n.Name, n.Drain)
		}
	}
	if v, err := c.nodes[0].api().GetVolume(ctx, "wide"); err != nil || len(v.Copies) != 3 {
		t.Fatalf("refused drain changed volume wide: %+v (%v)", v, err)
	}
	if _, err := c.nodes[0].api().DeleteVolume(ctx, "wide"); err != nil {
		t.Fatal(err)
	}
	// Refused: sent to another node than the one drained.
	if _, err := c.nodes[1].api().StartDrain(ctx, "n1"); client.Code(err) != api.CodeWrongNode ||
		!strings.Contains(err.Error(), c.nodes[0].ip+":7480") {
		t.Fatalf("drain of n1 sent to n2: %v, want %s naming n1's address", err, api.CodeWrongNode)
	}

	v, exports := c.failoverVolume(t, c.nodes[0], "dr", 3)
	prim := c.byName(v.Primary)
	c.drainUnderWrites(t, prim, "dr", exports, v)
	other := c.waitVolume(t, prim, "dr", "in sync", func(v api.Volume) bool { return len(v.Copies) == 2 })

	// A drained node gets no new copy.
	nv, err := c.nodes[2].api().CreateVolume(ctx, api.VolumeSpec{Name: "after", Capacity: 4 << 20, Replicas: 2,
		Disks: []api.DiskSpec{{Name: "d0", Size: 4 << 20}}})
	if err != nil {
		t.Fatal(err)
	}
	if slices.Contains(copyNodes(nv), prim.name) {
		t.Fatalf("volume placed on drained node %s: %s", prim.name, formatCopies(nv))
	}
	_, err = c.nodes[2].api().CreateVolume(ctx, api.VolumeSpec{Name: "wide2", Capacity: 4 << 20, Replicas: 3,
		Disks: []api.DiskSpec{{Name: "d0", Size: 4 << 20}}})
	if client.Code(err) != api.CodeNotEnoughNodes || !strings.Contains(err.Error(), "drained, so not used: "+prim.name) {
		t.Fatalf("replicas=3 with a node drained: %v, want %s naming the drained node", err, api.CodeNotEnoughNodes)
	}
	if _, err := c.nodes[2].api().DeleteVolume(ctx, "after"); err != nil {
		t.Fatal(err)
	}
	out := c.cli(c.nodes[2], "node", "undrain", prim.name)
	t.Logf("%s", strings.TrimSpace(out))
	for _, n := range c.waitNodes(c.nodes[2], "n1 n2 n3 up", allUp("n1", "n2", "n3")) {
		if n.Drain != "" {
			t.Fatalf("after undrain: %s %s", n.Name, n.Drain)
		}
	}

	// The node of the copy that is not the primary.
	var cp *node
	for _, n := range copyNodes(other) {
		if n != other.Primary {
			cp = c.byName(n)
		}
	}
	// The same exports: the attachment moved with the volume.
	c.drainUnderWrites(t, cp, "dr", exports, other)
}

// drainUnderWrites drains nd, which holds a copy of volume v (exports: its
// disks'), with the writer running through nd first, and checks what
// TestDrain says.
func (c *cluster) drainUnderWrites(t *testing.T, nd *node, volume string, exports []string, v api.Volume) {
	t.Helper()
	ctx := context.Background()
	w, err := startWriter(ctx, c, exports, c.nbdAddrs(c.byName(v.Primary)), 2, 32)
	if err != nil {
		t.Fatal(err)
	}
	if err := w.waitFlushes(10, 60*time.Second); err != nil {
		w.halt()
		t.Fatalf("before the drain: %v", err)
	}
	start := time.Now()
	full := append([]string{"netns", "exec", c.net.Hub, quiverBin, "--server", "http://" + nd.ip + ":7480",
		"--token-file", c.tokenFile(apiToken)}, "node", "drain", nd.name, "-o", "json")
	raw, cerr := exec.Command("ip", full...).Output()
	took := time.Since(start)
	if cerr == nil {
		cerr = w.waitFlushes(20, 90*time.Second)
	}
	w.halt()
	if cerr != nil {
		t.Fatalf("drain of %s (primary %s): %v\n%s", nd.name, v.Primary, cerr, raw)
	}
	if err := w.err(); err != nil {
		t.Fatalf("drain of %s: the client failed: %v", nd.name, err)
	}
	var job api.Job
	if err := json.Unmarshal(raw, &job); err != nil {
		t.Fatalf("quiver node drain -o json: %v\n%s", err, raw)
	}
	var size int64
	for _, d := range v.Disks {
		size += d.Size
	}
	t.Logf("drain of %s (primary %s at term %d): job %s %s in %v, %d of %d bytes, %d volume(s)", nd.name, v.Primary, v.Term,
		job.ID, job.State, took.Round(time.Millisecond), job.BytesDone, job.BytesTotal, job.ItemsDone)
	if job.Kind != "drain" || job.State != api.JobSucceeded || job.ItemsDone != 1 || job.BytesTotal != size || job.BytesDone != size {
		t.Errorf("drain job %+v: want drain succeeded, 1 volume, %d of %d bytes", job, size, size)
	}

	via := c.other(nd)
	got := c.waitVolume(t, via, volume, "two copies in sync, none on "+nd.name, func(got api.Volume) bool {
		if len(got.Copies) != 2 || slices.Contains(copyNodes(got), nd.name) {
			return false
		}
		for _, cc := range got.Copies {
			if cc.State != api.CopyInSync {
				return false
			}
		}
		return true
	})
	t.Logf("after: %s", formatCopies(got))
	wantTerm := v.Term
	if v.Primary == nd.name {
		wantTerm++
	}
	if got.Primary == nd.name || got.Term != wantTerm {
		t.Fatalf("after the drain of %s: primary %s at term %d, want another at term %d", nd.name, got.Primary, got.Term, wantTerm)
	}
	c.waitNodes(via, nd.name+" drained with no copy", func(ns []api.Node) bool {
		for _, n := range ns {
			if n.Name == nd.name {
				return n.Drain == api.NodeDrained && n.Volumes == 0
			}
		}
		return false
	})
	table := c.cli(via, "node", "list")
	if !strings.Contains(table, "up, drained") {
		t.Errorf("quiver node list does not show %s drained:\n%s", nd.name, table)
	}
	if _, err := os.Stat(filepath.Join(nd.pool, "volumes", volume)); !os.IsNotExist(err) {
		t.Errorf("the drained node's pool still holds volume %s (%v)", volume, err)
	}
	now := c.byName(got.Primary)
	checked, flushed, err := w.check(readImage(t, now, volume))
	if err != nil {
		t.Fatalf("after the drain of %s, on %s: %v", nd.name, now.name, err)
	}
	for _, d := range v.Disks {
		var sums []string
		for _, n := range copyNodes(got) {
			sums = append(sums, diskSum(t, c.byName(n), volume, d.Name))
		}
		if sums[0] != sums[1] {
			t.Errorf("disk %s differs between the copies %v: %v", d.Name, copyNodes(got), sums)
		}
	}
	t.Logf("%d slots hold their last acknowledged write (%d flushed); the copies' disks are identical; connections of d0: %s",
		checked, flushed, w.connects(0))
}
