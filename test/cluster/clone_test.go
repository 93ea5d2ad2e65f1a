package clustertest

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/quiverstorage/quiver/internal/api"
	"github.com/quiverstorage/quiver/internal/client"
	"github.com/quiverstorage/quiver/internal/nbdclient"
	"github.com/quiverstorage/quiver/internal/testfs"
)

// TestReplicatedClone is issue 15's "clones apply to all copies at the same
// cut", with real processes: a clone of a 2-copy, 2-disk volume (of the
// live disks, and of a snapshot) is placed on the source's nodes, its
// primary the source's, every copy in sync, each disk byte-identical on
// both copies and equal to the source at the cut (the snapshot's images);
// a write through the clone's primary reaches both copies and leaves the
// source unchanged; the clone of the live disks is asked of the node
// without a copy, which carries it to the primary.
// A copy that cannot make the clone (its filesystem full) fails the
// request and leaves nothing behind, on any node or in etcd; a source with
// a copy out of sync is refused (Degraded).
func TestReplicatedClone(t *testing.T) {
	testfs.RequireTool(t, "qemu-io")
	testfs.RequireTool(t, "mkfs.ext4")
	// n3's pool on a small ext4, filled in the last subtest so that its
	// clone fails.
	mnt := testfs.MountExt4(t, 96*mib)
	etcdDir := t.TempDir()
	c := startClusterWith(t, func(i int, nd *node) {
		if i == 2 {
			nd.pool = filepath.Join(mnt, "pool")
			nd.args = append(nd.args, "--etcd-data-dir", filepath.Join(etcdDir, "etcd3"))
		}
	})
	ctx := context.Background()
	const diskSize = 4 * mib
	disks := []string{"d0", "d1"}
	prim, cp, token := c.placeAndAttach(t, api.VolumeSpec{Name: "src", Capacity: 32 * mib, Replicas: 2,
		Disks: []api.DiskSpec{{Name: "d0", Size: diskSize}, {Name: "d1", Size: diskSize}}})
	if cp != c.nodes[2] {
		t.Fatalf("copies on %v: want the second on n3 (the only node of zone-b)", []string{prim.name, cp.name})
	}
	other := c.other(prim, cp)
	uri := func(volume, disk, token string) string {
		return fmt.Sprintf("nbd://%s:10809/%s/%s/%s", prim.ip, volume, disk, token)
	}
	// sums checks that every disk of volume is byte-identical on both
	// copies and returns their SHA-256 by disk.
	sums := func(volume string) map[string]string {
		t.Helper()
		out := map[string]string{}
		for _, d := range disks {
			a, b := diskSum(t, prim, volume, d), diskSum(t, cp, volume, d)
			if a != b {
				t.Fatalf("%s disk %s: SHA-256 %s on %s, %s on %s: the copies differ", volume, d, a, prim.name, b, cp.name)
			}
			out[d] = a
		}
		return out
	}
	// placedLike checks that the clone is placed on the source's nodes,
	// its primary the source's, every copy in sync, as a node without a
	// copy sees it.
	placedLike := func(name string) {
		t.Helper()
		got, err := other.api().GetVolume(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		nodes := copyNodes(got)
		slices.Sort(nodes)
		want := []string{prim.name, cp.name}
		slices.Sort(want)
		if !slices.Equal(nodes, want) || got.Primary != prim.name || got.Replicas != 2 {
			t.Errorf("clone %s placed on %v, primary %s, replicas %d: want %v, primary %s, 2", name, nodes, got.Primary,
				got.Replicas, want, prim.name)
		}
		for _, cc := range got.Copies {
			if cc.State != api.CopyInSync {
				t.Errorf("clone %s: copy on %s is %s (%s), want in sync", name, cc.Node, cc.State, cc.Reason)
			}
		}
	}

	t.Run("clone", func(t *testing.T) {
		start := time.Now()
		c.qemuIO(t, uri("src", "d0", token), "write -P 0x0a 0 1M", "flush")
		c.qemuIO(t, uri("src", "d1", token), "write -P 0x1a 512k 1M", "flush")
		if _, err := prim.api().CreateSnapshot(ctx, "src", "a"); err != nil {
			t.Fatal(err)
		}
		snapSum := map[string]string{}
		for _, d := range disks {
			snapSum[d] = fileSum(t, filepath.Join(prim.pool, "volumes", "src", "snapshots", "a", d+".img"))
		}
		c.qemuIO(t, uri("src", "d0", token), "write -P 0x0b 1M 2M", "flush")
		c.qemuIO(t, uri("src", "d1", token), "write -P 0x1b 0 3M", "flush")
		live := sums("src")

		// Asked of the node without a copy: carried to the primary.
		ct := time.Now()
		made, err := other.api().Clone(ctx, api.CloneSpec{Source: api.Source{Volume: "src"}, Names: []string{"cl-live"}})
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("clone of the live volume on both copies took %v", time.Since(ct).Round(time.Millisecond))
		if len(made) != 1 || made[0].Primary != prim.name || len(made[0].Copies) != 2 {
			t.Errorf("clone answer: %+v", made)
		}
		placedLike("cl-live")
		got := sums("cl-live")
		for _, d := range disks {
			if got[d] != live[d] {
				t.Errorf("cl-live disk %s: %s on both copies, want the source's %s at the cut", d, got[d], live[d])
			}
		}

		if _, err := prim.api().Clone(ctx, api.CloneSpec{Source: api.Source{Volume: "src", Snapshot: "a"},
			Names: []string{"cl-snap"}}); err != nil {
			t.Fatal(err)
		}
		placedLike("cl-snap")
		got = sums("cl-snap")
		for _, d := range disks {
			if got[d] != snapSum[d] {
				t.Errorf("cl-snap disk %s: %s on both copies, want the snapshot's %s", d, got[d], snapSum[d])
			}
		}

		// A retry with the same idempotency key answers the clone made.
		keyed := api.CloneSpec{Source: api.Source{Volume: "src", Snapshot: "a"}, Names: []string{"cl-key"}}
		first, err := prim.api().Clone(ctx, keyed, client.IdempotencyKey("clone-key-1"))
		if err != nil {
			t.Fatal(err)
		}
		again, err := prim.api().Clone(ctx, keyed, client.IdempotencyKey("clone-key-1"))
		if err != nil || len(again) != 1 || again[0].UID != first[0].UID {
			t.Fatalf("retry of a clone with its key: %+v (%v), want the clone %s", again, err, first[0].UID)
		}
		placedLike("cl-key")
		sums("cl-key")

		// A client writing the source across the clone: it pauses at the
		// cut, so both copies of the clone hold the same writes.
		busy, err := nbdclient.Dial(ctx, prim.ip+":10809", "src/d0/"+token,
			nbdclient.Options{Dial: c.net.Dial, Timeout: 30 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		stop, done := make(chan struct{}), make(chan int)
		go func() {
			block := make([]byte, 64<<10)
			n := 0
			defer func() { done <- n }()
			for {
				select {
				case <-stop:
					return
				default:
				}
				for i := range block {
					block[i] = byte(n)
				}
				if err := busy.WriteAt(block, int64(n%64)*int64(len(block)), false); err != nil {
					t.Errorf("write %d across the clone: %v", n, err)
					return
				}
				n++
			}
		}()
		time.Sleep(200 * time.Millisecond) // let some writes in before the cut
		if _, err := prim.api().Clone(ctx, api.CloneSpec{Source: api.Source{Volume: "src"}, Names: []string{"cl-busy"}}); err != nil {
			t.Fatal(err)
		}
		close(stop)
		t.Logf("%d writes of the source around the clone", <-done)
		busy.Close()
		sums("cl-busy") // fails unless both copies are the same
		placedLike("cl-busy")
		live = sums("src")

		// The clone is a volume of its own: written through its primary,
		// both copies change and the source does not.
		catt, err := prim.api().Attach(ctx, "cl-live", api.AttachmentSpec{Node: "worker-2"})
		if err != nil {
			t.Fatal(err)
		}
		c.qemuIO(t, uri("cl-live", "d0", catt.Token), "write -P 0xcc 2M 1M", "flush")
		for _, nd := range []*node{prim, cp} {
			if !allBytes(fileBytes(t, nd, "cl-live", "d0", 2*mib, mib), 0xcc) {
				t.Errorf("%s's copy of cl-live lacks the write acknowledged through its primary", nd.name)
			}
		}
		if after := sums("cl-live"); after["d0"] == live["d0"] {
			t.Error("the write to cl-live did not change its d0")
		}
		if after := sums("src"); after["d0"] != live["d0"] || after["d1"] != live["d1"] {
			t.Error("a write to the clone changed the source")
		}
		copyStates(t, prim, "src", api.CopyInSync)
		copyStates(t, prim, "cl-live", api.CopyInSync)

		// Deleted through the cluster, the clone goes from both nodes.
		if _, err := prim.api().DeleteVolume(ctx, "cl-snap"); err != nil {
			t.Fatal(err)
		}
		for _, nd := range []*node{prim, cp} {
			if _, err := os.Stat(filepath.Join(nd.pool, "volumes", "cl-snap")); !os.IsNotExist(err) {
				t.Errorf("%s still holds the deleted clone: %v", nd.name, err)
			}
		}
		t.Logf("clone subtest: %v", time.Since(start).Round(time.Millisecond))
	})

	t.Run("copy fails", func(t *testing.T) {
		// n3's filesystem is full: its clone fails (ext4 has no reflink,
		// so the clone copies the images). The request fails, and no
		// clone is left on any node or in etcd.
		start := time.Now()
		ballast := fillFS(t, mnt)
		_, err := prim.api().Clone(ctx, api.CloneSpec{Source: api.Source{Volume: "src"}, Names: []string{"cl-full"}})
		if err == nil || !strings.Contains(err.Error(), cp.name) {
			t.Fatalf("clone with the copy's filesystem full: %v, want an error naming %s", err, cp.name)
		}
		t.Logf("refused: %v", err)
		for _, nd := range c.nodes {
			if _, err := nd.api().GetVolume(ctx, "cl-full"); client.Code(err) != api.CodeNotFound {
				t.Errorf("the failed clone on %s: %v, want NotFound", nd.name, err)
			}
			if _, err := os.Stat(filepath.Join(nd.pool, "volumes", "cl-full")); !os.IsNotExist(err) {
				t.Errorf("%s holds a part of the failed clone: %v", nd.name, err)
			}
		}
		copyStates(t, prim, "src", api.CopyInSync)

		// A write the full copy cannot take takes it out of sync: a clone
		// is refused until it is back.
		// (d1's last MiB was never written: the copy needs new blocks.)
		c.qemuIO(t, uri("src", "d1", token), "write -P 0x2a 3M 1M", "flush")
		if st, _, err := copyState(ctx, prim, "src", cp.name); err != nil || st.State == api.CopyInSync {
			t.Fatalf("copy on the full filesystem after a write: %+v (%v)", st, err)
		}
		_, err = prim.api().Clone(ctx, api.CloneSpec{Source: api.Source{Volume: "src"}, Names: []string{"cl-deg"}})
		if client.Code(err) != api.CodeDegraded {
			t.Fatalf("clone of a degraded volume: %v, want Degraded", err)
		}
		t.Logf("refused: %v", err)
		if _, err := other.api().GetVolume(ctx, "cl-deg"); client.Code(err) != api.CodeNotFound {
			t.Errorf("the refused clone: %v, want NotFound", err)
		}
		if err := os.Remove(ballast); err != nil {
			t.Fatal(err)
		}
		c.waitInSync(t, prim, "src", cp.name, 2*time.Minute)
		live := sums("src")
		// Two clones in one request, both at the same cut.
		made, err := prim.api().Clone(ctx, api.CloneSpec{Source: api.Source{Volume: "src"}, Names: []string{"cl-after", "cl-after2"}})
		if err != nil {
			t.Fatal(err)
		}
		if len(made) != 2 {
			t.Fatalf("clones made: %d, want 2", len(made))
		}
		for _, name := range []string{"cl-after", "cl-after2"} {
			placedLike(name)
			if got := sums(name); got["d0"] != live["d0"] || got["d1"] != live["d1"] {
				t.Errorf("%s: %v, want the source's %v", name, got, live)
			}
		}
		t.Logf("copy fails subtest: %v", time.Since(start).Round(time.Millisecond))
	})
}
