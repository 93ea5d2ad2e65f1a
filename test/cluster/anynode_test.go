package clustertest

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/quiverstorage/quiver/internal/api"
	"github.com/quiverstorage/quiver/internal/client"
)

// TestAnyNodeServes (docs/cluster.md, "Any node's API"): a snapshot, a
// clone, a rollback and a disk change of a replicated volume, asked of a
// node that is not its primary (the other copy's node, and the node
// without a copy, through the client and the CLI), are carried to the
// primary and made on every copy at one cut; the async jobs are read
// through the node asked. A hop with a forged signature is refused.
func TestAnyNodeServes(t *testing.T) {
	c := startCluster(t)
	ctx := context.Background()
	prim, other, token := c.placeAndAttach(t, api.VolumeSpec{Name: "any", Capacity: 8 * mib, Replicas: 2,
		Disks: []api.DiskSpec{{Name: "root", Size: 4 * mib}}})
	spare := c.other(prim, other)
	uri := fmt.Sprintf("nbd://%s:10809/any/root/%s", prim.ip, token)
	c.qemuIO(t, uri, "write -P 0x11 0 1M", "flush")

	// The client (async, its job polled through spare).
	s1, err := spare.api().CreateSnapshot(ctx, "any", "s1", client.IdempotencyKey("key-s1"))
	if err != nil {
		t.Fatalf("snapshot through %s, which holds no copy: %v", spare.name, err)
	}
	if s1.Name != "s1" || s1.Volume != "any" {
		t.Fatalf("snapshot answer: %+v", s1)
	}
	// The CLI, through the other copy's node.
	c.cli(other, "snapshot", "create", "any", "s2")
	for _, nd := range []*node{prim, other} {
		for _, s := range []string{"s1", "s2"} {
			if _, err := os.Stat(filepath.Join(nd.pool, "volumes", "any", "snapshots", s, "root.img")); err != nil {
				t.Errorf("snapshot %s on %s's copy: %v", s, nd.name, err)
			}
		}
	}
	// Async: the job is the primary's, read through the node asked.
	j, err := spare.api().StartSnapshot(ctx, "any", "s3")
	if err != nil {
		t.Fatalf("async snapshot through %s: %v", spare.name, err)
	}
	if j, err = spare.api().WaitJob(ctx, j.ID, 50*time.Millisecond, nil); err != nil || j.State != api.JobSucceeded {
		t.Fatalf("its job read through %s: %+v, %v", spare.name, j, err)
	}
	if _, err := prim.api().GetJob(ctx, j.ID); err != nil {
		t.Errorf("the job is not the primary's: %v", err)
	}
	// Read through any node: the primary's list.
	if l, err := spare.api().ListSnapshots(ctx, "any"); err != nil || len(l) != 3 {
		t.Fatalf("snapshots listed through %s: %v, %v", spare.name, l, err)
	}
	// A retry with its key through yet another node: the same snapshot.
	if again, err := other.api().CreateSnapshot(ctx, "any", "s1", client.IdempotencyKey("key-s1")); err != nil || again.UID != s1.UID {
		t.Fatalf("snapshot s1 again through %s: %+v, %v; want UID %s", other.name, again, err, s1.UID)
	}

	c.qemuIO(t, uri, "write -P 0x22 0 1M", "flush")
	made, err := other.api().Clone(ctx, api.CloneSpec{Source: api.Source{Volume: "any", Snapshot: "s1"}, Names: []string{"any-cl"}})
	if err != nil {
		t.Fatalf("clone through %s: %v", other.name, err)
	}
	if len(made) != 1 || made[0].Primary != prim.name || len(made[0].Copies) != 2 {
		t.Fatalf("clone answer: %+v", made)
	}
	for _, nd := range []*node{prim, other} {
		if !allBytes(fileBytes(t, nd, "any-cl", "root", 0, mib), 0x11) {
			t.Errorf("the clone on %s's copy is not the snapshot", nd.name)
		}
	}
	c.cli(spare, "clone", "any@s2", "any-cl2")
	if v, err := spare.api().GetVolume(ctx, "any-cl2"); err != nil || v.Primary != prim.name || len(v.Copies) != 2 {
		t.Fatalf("the CLI's clone through %s: %+v, %v", spare.name, v, err)
	}

	if _, err := spare.api().Rollback(ctx, "any", "s1", client.Force()); err != nil {
		t.Fatalf("rollback through %s: %v", spare.name, err)
	}
	for _, nd := range []*node{prim, other} {
		if !allBytes(fileBytes(t, nd, "any", "root", 0, mib), 0x11) {
			t.Errorf("%s's copy is not rolled back", nd.name)
		}
	}
	c.cli(other, "rollback", "any", "s2", "--force")

	if _, err := spare.api().GrowDisk(ctx, "any", "root", 8*mib); err != nil {
		t.Fatalf("grow through %s: %v", spare.name, err)
	}
	for _, nd := range []*node{prim, other} {
		fi, err := os.Stat(filepath.Join(nd.pool, "volumes", "any", "disks", "root.img"))
		if err != nil || fi.Size() != 8*mib {
			t.Errorf("%s's disk after the grow through %s: %v, %v", nd.name, spare.name, fi, err)
		}
	}
	// The primary's refusals come back as they are.
	if _, err := other.api().GrowDisk(ctx, "any", "root", 16*mib); client.Code(err) != api.CodeCapacity {
		t.Errorf("grow past the capacity through %s: %v, want %s", other.name, err, api.CodeCapacity)
	}
	if err := other.api().DeleteSnapshot(ctx, "any", "s3"); err != nil {
		t.Fatalf("delete snapshot through %s: %v", other.name, err)
	}
	if _, err := spare.api().Rollback(ctx, "any", "nope"); client.Code(err) != api.CodeNotFound {
		t.Errorf("rollback to a missing snapshot through %s: %v, want %s", spare.name, err, api.CodeNotFound)
	}
	if _, err := other.api().CreateSnapshot(ctx, "any", "s1", client.IdempotencyKey("another-key")); client.Code(err) != api.CodeConflict {
		t.Errorf("snapshot s1 again with another key through %s: %v, want %s", other.name, err, api.CodeConflict)
	}
	if err := spare.api().DeleteSnapshot(ctx, "any", "s2"); err != nil {
		t.Fatalf("delete snapshot through %s: %v", spare.name, err)
	}
	if _, err := os.Stat(filepath.Join(other.pool, "volumes", "any", "snapshots", "s2")); err == nil {
		t.Errorf("s2 deleted through %s is still on %s's copy", spare.name, other.name)
	}

	// A hop only a node can sign: a forged one is refused, and changes
	// nothing.
	hc := &http.Client{Transport: &http.Transport{DialContext: c.net.Dial}, Timeout: 30 * time.Second}
	req, _ := http.NewRequest(http.MethodPost, "http://"+prim.ip+":7480/v1/volumes/any/snapshots",
		strings.NewReader(`{"name":"forged"}`))
	req.Header.Set("Quiver-Hop-Principal", "eyJyb2xlIjoiYWRtaW4iLCJieSI6Im4xIiwiYXQiOjB9")
	req.Header.Set("Quiver-Hop-Signature", strings.Repeat("00", 32))
	resp, err := hc.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusUnauthorized {
		t.Errorf("a forged hop: %s, want 401", resp.Status)
	}
	if _, err := prim.api().GetSnapshot(ctx, "any", "forged"); client.Code(err) != api.CodeNotFound {
		t.Errorf("the forged hop's snapshot: %v, want NotFound", err)
	}
}
