package clustertest

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/quiverstorage/quiver/internal/api"
	"github.com/quiverstorage/quiver/internal/client"
	"github.com/quiverstorage/quiver/internal/nbdclient"
	"github.com/quiverstorage/quiver/internal/testfs"
)

// TestReplicatedCut is issue 15's "rollback and disk changes apply to all
// copies at the same cut", with real processes: a rollback of a 2-copy,
// 2-disk volume leaves both copies of every disk byte-identical and equal
// to the snapshot, I/O of a client connected across it goes on to both
// copies, and a copy lacking the snapshot refuses the rollback with nothing
// changed; disk grow, add and remove change every copy (each copy's disks,
// its images and the spec in etcd the same), with a client connected across
// the grow; a copy that fails a rollback (its filesystem full) is recorded
// degraded and later resynced whole, back to the snapshot.
func TestReplicatedCut(t *testing.T) {
	testfs.RequireTool(t, "qemu-io")
	testfs.RequireTool(t, "mkfs.ext4")
	// n3's pool on a small ext4 (no reflink: a rollback copies the
	// images), filled in the last subtest so that its rollback fails.
	mnt := testfs.MountExt4(t, 96*mib)
	etcdDir := t.TempDir() // off the small filesystem
	c := startClusterWith(t, func(i int, nd *node) {
		if i == 2 {
			nd.pool = filepath.Join(mnt, "pool")
			nd.args = append(nd.args, "--etcd-data-dir", filepath.Join(etcdDir, "etcd3"))
		}
	})
	ctx := context.Background()
	const diskSize = 4 * mib
	prim, cp, token := c.placeAndAttach(t, api.VolumeSpec{Name: "cut", Capacity: 32 * mib, Replicas: 2,
		Disks: []api.DiskSpec{{Name: "d0", Size: diskSize}, {Name: "d1", Size: diskSize}}})
	if cp != c.nodes[2] {
		t.Fatalf("copies on %v: want the second on n3 (the only node of zone-b)", []string{prim.name, cp.name})
	}
	copies := []*node{prim, cp}
	uri := func(disk string) string { return fmt.Sprintf("nbd://%s:10809/cut/%s/%s", prim.ip, disk, token) }
	// sums checks that every disk's copies are byte-identical and returns
	// their SHA-256 by disk.
	sums := func(disks ...string) map[string]string {
		t.Helper()
		out := map[string]string{}
		for _, d := range disks {
			a, b := diskSum(t, prim, "cut", d), diskSum(t, cp, "cut", d)
			if a != b {
				t.Fatalf("disk %s: SHA-256 %s on %s, %s on %s: the copies differ", d, a, prim.name, b, cp.name)
			}
			out[d] = a
		}
		return out
	}

	t.Run("rollback", func(t *testing.T) {
		start := time.Now()
		// A, the snapshot (no client connected: the Sets are made for it).
		c.qemuIO(t, uri("d0"), "write -P 0x0a 0 1M", "flush")
		c.qemuIO(t, uri("d1"), "write -P 0x1a 512k 1M", "flush")
		if _, err := prim.api().CreateSnapshot(ctx, "cut", "a"); err != nil {
			t.Fatal(err)
		}
		snapSum := map[string]string{}
		for _, d := range []string{"d0", "d1"} {
			snapSum[d] = fileSum(t, filepath.Join(prim.pool, "volumes", "cut", "snapshots", "a", d+".img"))
		}
		a := sums("d0", "d1")
		// B, then a client that stays connected.
		c.qemuIO(t, uri("d0"), "write -P 0x0b 0 3M", "flush")
		c.qemuIO(t, uri("d1"), "write -P 0x1b 0 4M", "flush")
		b := sums("d0", "d1")
		if b["d0"] == a["d0"] || b["d1"] == a["d1"] {
			t.Fatal("B did not change the disks")
		}
		cl, err := nbdclient.Dial(ctx, prim.ip+":10809", "cut/d0/"+token, nbdclient.Options{Dial: c.net.Dial, Timeout: 30 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		defer cl.Close()

		// Through the copy's node: carried to the primary, whose refusal
		// comes back as it is.
		if _, err := cp.api().Rollback(ctx, "cut", "a"); client.Code(err) != api.CodeInUse {
			t.Fatalf("rollback with a writer connected, without force, through the copy's node: %v", err)
		}
		rb := time.Now()
		if _, err := prim.api().Rollback(ctx, "cut", "a", client.Force()); err != nil {
			t.Fatal(err)
		}
		t.Logf("rollback of both copies took %v", time.Since(rb).Round(time.Millisecond))
		got := sums("d0", "d1")
		for _, d := range []string{"d0", "d1"} {
			if got[d] != a[d] || got[d] != snapSum[d] {
				t.Errorf("disk %s after the rollback: %s on both copies, want A %s (snapshot image %s)", d, got[d], a[d], snapSum[d])
			}
		}
		if !allBytes(fileBytes(t, cp, "cut", "d0", 0, mib), 0x0a) || !allBytes(fileBytes(t, cp, "cut", "d0", mib, 2*mib), 0) {
			t.Errorf("the copy's d0 is not A")
		}
		copyStates(t, prim, "cut", api.CopyInSync)

		// I/O resumes: the connected client's write reaches both copies.
		block := make([]byte, 64<<10)
		for i := range block {
			block[i] = 0xcc
		}
		if err := cl.WriteAt(block, 2*mib, true); err != nil {
			t.Fatalf("write after the rollback: %v", err)
		}
		for _, nd := range copies {
			if !allBytes(fileBytes(t, nd, "cut", "d0", 2*mib, int64(len(block))), 0xcc) {
				t.Errorf("%s lacks the write acknowledged after the rollback", nd.name)
			}
		}
		cl.Close()
		sums("d0", "d1")

		// A copy that lacks the snapshot refuses the rollback; nothing
		// changes on either copy.
		if _, err := prim.api().CreateSnapshot(ctx, "cut", "b"); err != nil {
			t.Fatal(err)
		}
		c.qemuIO(t, uri("d1"), "write -P 0x1c 0 1M", "flush")
		before := sums("d0", "d1")
		cp.proc.Kill()
		if err := os.RemoveAll(filepath.Join(cp.pool, "volumes", "cut", "snapshots", "b")); err != nil {
			t.Fatal(err)
		}
		c.spawn(cp)
		c.waitReady(cp)
		c.waitInSync(t, prim, "cut", cp.name, 60*time.Second)
		_, err = prim.api().Rollback(ctx, "cut", "b")
		if client.Code(err) != api.CodeCopyMismatch || !strings.Contains(err.Error(), cp.name) {
			t.Fatalf("rollback to a snapshot the copy on %s lacks: %v", cp.name, err)
		}
		t.Logf("refused: %v", err)
		after := sums("d0", "d1")
		if after["d0"] != before["d0"] || after["d1"] != before["d1"] {
			t.Error("the refused rollback changed a disk")
		}
		copyStates(t, prim, "cut", api.CopyInSync)
		t.Logf("rollback subtest: %v", time.Since(start).Round(time.Millisecond))
	})

	t.Run("disks", func(t *testing.T) {
		start := time.Now()
		cl, err := nbdclient.Dial(ctx, prim.ip+":10809", "cut/d0/"+token, nbdclient.Options{Dial: c.net.Dial, Timeout: 30 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		defer cl.Close()
		// Through the copy's node, which carries it to the primary.
		if _, err := cp.api().GrowDisk(ctx, "cut", "d0", 8*mib); err != nil {
			t.Fatal(err)
		}
		disksEqual(t, c, "cut", copies, map[string]int64{"d0": 8 * mib, "d1": diskSize})
		// The client connected before the grow keeps the size it was
		// given at its handshake (NBD has no resize notice) and writes on;
		// a new connection sees the new size and writes beyond the old end.
		if cl.Size() != diskSize {
			t.Errorf("connected client: size %d, want the old %d", cl.Size(), diskSize)
		}
		block := make([]byte, 64<<10)
		for i := range block {
			block[i] = 0xdd
		}
		if err := cl.WriteAt(block, diskSize-int64(len(block)), true); err != nil {
			t.Fatalf("write of the client connected across the grow: %v", err)
		}
		c.qemuIO(t, uri("d0"), "write -P 0xee 6M 1M", "flush")
		for _, nd := range copies {
			if !allBytes(fileBytes(t, nd, "cut", "d0", diskSize-int64(len(block)), int64(len(block))), 0xdd) ||
				!allBytes(fileBytes(t, nd, "cut", "d0", 6*mib, mib), 0xee) {
				t.Errorf("%s lacks a write acknowledged after the grow", nd.name)
			}
		}

		if _, err := prim.api().AddDisk(ctx, "cut", api.DiskSpec{Name: "d2", Size: 2 * mib}); err != nil {
			t.Fatal(err)
		}
		disksEqual(t, c, "cut", copies, map[string]int64{"d0": 8 * mib, "d1": diskSize, "d2": 2 * mib})
		c.qemuIO(t, uri("d2"), "write -P 0x2a 0 2M", "flush")

		if _, err := prim.api().RemoveDisk(ctx, "cut", "d1"); client.Code(err) != api.CodeInUse {
			t.Errorf("remove with a writer connected, without force: %v", err)
		}
		cl.Close()
		if _, err := prim.api().RemoveDisk(ctx, "cut", "d1"); err != nil {
			t.Fatal(err)
		}
		disksEqual(t, c, "cut", copies, map[string]int64{"d0": 8 * mib, "d2": 2 * mib})
		for _, nd := range copies {
			if _, err := os.Stat(filepath.Join(nd.pool, "volumes", "cut", "disks", "d1.img")); err == nil {
				t.Errorf("%s still holds the removed disk's image", nd.name)
			}
		}
		sums("d0", "d2")
		copyStates(t, prim, "cut", api.CopyInSync)
		// Clones of a replicated volume are made by its primary
		// (TestReplicatedClone), wherever they are asked: placed on the
		// source's nodes, never made unplaced from one copy.
		for _, nd := range c.nodes {
			if nd == prim {
				continue
			}
			name := "cl-" + nd.name
			made, err := nd.api().Clone(ctx, api.CloneSpec{Source: api.Source{Volume: "cut", Snapshot: "a"}, Names: []string{name}})
			if err != nil || len(made) != 1 || made[0].Primary != prim.name || len(made[0].Copies) != len(copies) {
				t.Errorf("clone of a replicated volume through %s, not its primary: %+v, %v", nd.name, made, err)
			}
			if _, err := nd.api().DeleteVolume(ctx, name); err != nil {
				t.Errorf("delete %s: %v", name, err)
			}
		}
		t.Logf("disks subtest: %v", time.Since(start).Round(time.Millisecond))
	})

	t.Run("copy fails", func(t *testing.T) {
		// A copy that fails the rollback (its filesystem is full) is
		// recorded degraded, never left in sync and divergent; once it
		// can, its resync copies it whole, back to the snapshot's data.
		start := time.Now()
		vol, err := prim.api().GetVolume(ctx, "cut")
		if err != nil {
			t.Fatal(err)
		}
		var disks []string
		for _, d := range vol.Disks {
			disks = append(disks, d.Name)
		}
		c.qemuIO(t, uri("d0"), "write -P 0x3a 0 2M", "flush")
		if _, err := prim.api().CreateSnapshot(ctx, "cut", "c"); err != nil {
			t.Fatal(err)
		}
		want := sums(disks...)
		c.qemuIO(t, uri("d0"), "write -P 0x3b 1M 3M", "flush")
		c.qemuIO(t, uri(disks[len(disks)-1]), "write -P 0x3c 0 1M", "flush")
		ballast := fillFS(t, mnt)
		if _, err := prim.api().Rollback(ctx, "cut", "c"); err != nil {
			t.Fatalf("rollback with one copy failing: %v", err)
		}
		st, got, err := copyState(ctx, prim, "cut", cp.name)
		if err != nil || st.State != api.CopyDegraded {
			t.Fatalf("the copy that failed the rollback: %+v (%v)", st, err)
		}
		t.Logf("after the rollback: %s", formatCopies(got))
		for _, d := range disks {
			if s := diskSum(t, prim, "cut", d); s != want[d] {
				t.Errorf("primary's %s after the rollback: %s, want the snapshot's %s", d, s, want[d])
			}
		}
		if err := os.Remove(ballast); err != nil {
			t.Fatal(err)
		}
		seen := c.waitInSync(t, prim, "cut", cp.name, 2*time.Minute)
		t.Logf("states after the space came back: %v", seen)
		got2 := sums(disks...)
		for _, d := range disks {
			if got2[d] != want[d] {
				t.Errorf("disk %s after the resync: %s on both copies, want the snapshot's %s", d, got2[d], want[d])
			}
		}
		t.Logf("copy fails subtest: %v", time.Since(start).Round(time.Millisecond))
	})
}

// fileSum is the SHA-256 of a file.
func fileSum(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}

// copyStates fails unless every copy of volume is in state, as its primary
// shows it.
func copyStates(t *testing.T, prim *node, volume, state string) {
	t.Helper()
	v, err := prim.api().GetVolume(context.Background(), volume)
	if err != nil {
		t.Fatal(err)
	}
	for _, cc := range v.Copies {
		if cc.State != state {
			t.Errorf("copy on %s: %s (%s), want %s", cc.Node, cc.State, cc.Reason, state)
		}
	}
}

// disksEqual checks that each copy's volume (as its own node shows it), its
// images and the placement's spec (as the node without a copy shows it)
// hold exactly want.
func disksEqual(t *testing.T, c *cluster, volume string, copies []*node, want map[string]int64) {
	t.Helper()
	ctx := context.Background()
	check := func(who string, disks []api.Disk) {
		got := map[string]int64{}
		for _, d := range disks {
			got[d.Name] = d.Size
		}
		if len(got) != len(want) {
			t.Errorf("%s: disks %v, want %v", who, got, want)
			return
		}
		for n, s := range want {
			if got[n] != s {
				t.Errorf("%s: disks %v, want %v", who, got, want)
				return
			}
		}
	}
	for _, nd := range copies {
		v, err := nd.api().GetVolume(ctx, volume)
		if err != nil {
			t.Fatal(err)
		}
		check(nd.name+"'s copy", v.Disks)
		for n, s := range want {
			fi, err := os.Stat(filepath.Join(nd.pool, "volumes", volume, "disks", n+".img"))
			if err != nil {
				t.Errorf("%s: image of %s: %v", nd.name, n, err)
			} else if fi.Size() != s {
				t.Errorf("%s: image of %s: %d bytes, want %d", nd.name, n, fi.Size(), s)
			}
		}
	}
	other := c.other(copies...)
	v, err := other.api().GetVolume(ctx, volume)
	if err != nil {
		t.Fatal(err)
	}
	check("the placement's spec (on "+other.name+")", v.Disks)
}
