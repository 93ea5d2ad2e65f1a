package clustertest

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/quiverstorage/quiver/internal/api"
	"github.com/quiverstorage/quiver/internal/client"
	"github.com/quiverstorage/quiver/internal/consistency"
	"github.com/quiverstorage/quiver/internal/nbdclient"
)

// TestReplicatedSnapshot is acceptance 6 of issue 15: whole-VM snapshots of
// a 3-disk, 2-copy volume, taken through the primary while four writers
// stamp sequence numbers into every disk (internal/consistency), are a
// consistent cut on each copy, the same cut on both (the same writes), with
// the same name and UID. A snapshot is refused while a copy is out of
// sync, and deleting one deletes it on every copy.
func TestReplicatedSnapshot(t *testing.T) {
	c := startCluster(t)
	ctx := context.Background()
	const diskSize = 8 * mib
	disks := []string{"d0", "d1", "d2"}
	spec := api.VolumeSpec{Name: "vm", Capacity: 3 * diskSize, Replicas: 2}
	for _, d := range disks {
		spec.Disks = append(spec.Disks, api.DiskSpec{Name: d, Size: diskSize})
	}
	prim, cp, token := c.placeAndAttach(t, spec)
	clients := make([]*nbdclient.Conn, len(disks))
	for i, d := range disks {
		cl, err := nbdclient.Dial(ctx, prim.ip+":10809", "vm/"+d+"/"+token, nbdclient.Options{Dial: c.net.Dial, Timeout: 30 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		defer cl.Close()
		clients[i] = cl
	}
	log := consistency.NewLog()
	maxSeq := int64(len(disks)*diskSize/consistency.BlockSize - 1)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	errc := make(chan error, 4)
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			block := make([]byte, consistency.BlockSize)
			for {
				select {
				case <-stop:
					return
				default:
				}
				seq := log.Next()
				if seq > maxSeq {
					return
				}
				d, off := consistency.Place(seq, len(disks))
				consistency.Stamp(block, seq)
				if err := clients[d].WriteAt(block, off, false); err != nil {
					errc <- fmt.Errorf("write seq %d: %w", seq, err)
					return
				}
				log.Ack(seq)
			}
		}()
	}
	snaps := []string{"s1", "s2", "s3"}
	for _, s := range snaps {
		time.Sleep(700 * time.Millisecond)
		start := time.Now()
		if _, err := prim.api().CreateSnapshot(ctx, "vm", s); err != nil {
			close(stop)
			wg.Wait()
			t.Fatalf("snapshot %s: %v", s, err)
		}
		t.Logf("snapshot %s taken on both copies in %v under writes (%d acknowledged so far)", s,
			time.Since(start).Round(time.Millisecond), log.Acked())
	}
	close(stop)
	wg.Wait()
	select {
	case err := <-errc:
		t.Fatal(err)
	default:
	}
	for _, s := range snaps {
		var cuts []map[int64]bool
		var uids []string
		for _, nd := range []*node{prim, cp} {
			sn, err := nd.api().GetSnapshot(ctx, "vm", s)
			if err != nil {
				t.Fatalf("%s: snapshot %s: %v", nd.name, s, err)
			}
			uids = append(uids, sn.UID)
			present := map[int64]bool{}
			for i, d := range disks {
				img, err := os.ReadFile(filepath.Join(nd.pool, "volumes", "vm", "snapshots", s, d+".img"))
				if err != nil {
					t.Fatal(err)
				}
				if err := consistency.Scan(img, i, len(disks), present); err != nil {
					t.Fatalf("%s: snapshot %s: %v", nd.name, s, err)
				}
			}
			n, err := log.Check(present)
			if err != nil {
				t.Fatalf("%s: snapshot %s: %v", nd.name, s, err)
			}
			t.Logf("%s: snapshot %s (uid %s) is a consistent cut of %d writes", nd.name, s, sn.UID, n)
			cuts = append(cuts, present)
		}
		if uids[0] != uids[1] {
			t.Errorf("snapshot %s: UID %s on the primary, %s on the copy", s, uids[0], uids[1])
		}
		if len(cuts[0]) != len(cuts[1]) {
			t.Errorf("snapshot %s: %d writes on the primary, %d on the copy: not the same cut", s, len(cuts[0]), len(cuts[1]))
		}
		for seq := range cuts[0] {
			if !cuts[1][seq] {
				t.Errorf("snapshot %s: seq %d on the primary only", s, seq)
				break
			}
		}
	}

	if err := prim.api().DeleteSnapshot(ctx, "vm", "s1"); err != nil {
		t.Fatal(err)
	}
	for _, nd := range []*node{prim, cp} {
		if _, err := nd.api().GetSnapshot(ctx, "vm", "s1"); client.Code(err) != api.CodeNotFound {
			t.Errorf("%s: s1 after its delete: %v", nd.name, err)
		}
	}

	// A copy out of sync would lack a new snapshot: refused.
	cp.proc.Kill()
	block := make([]byte, consistency.BlockSize)
	if err := clients[0].WriteAt(block, 0, false); err != nil {
		t.Fatalf("write with the copy down: %v", err)
	}
	if _, err := prim.api().CreateSnapshot(ctx, "vm", "s4"); client.Code(err) != api.CodeDegraded {
		t.Errorf("snapshot with a copy out of sync: %v", err)
	} else {
		t.Logf("refused: %v", err)
	}
}
