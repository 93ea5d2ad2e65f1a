package cluster

import (
	"bytes"
	"context"
	"fmt"
	"testing"

	"google.golang.org/grpc"

	"github.com/quiverstorage/quiver/internal/api"
)

// TestCreateUnknownOutcomeLearnt: a create whose first try's answer is
// lost (applied or not) is learnt by the same Txn again, which finds the
// record this call wrote, by its UID, and takes it as created, never as
// ErrVolumeExists.
func TestCreateUnknownOutcomeLearnt(t *testing.T) {
	tc := startCluster(t)
	fault := &txnFault{}
	cfg := tc.config(t, "n2")
	cfg.EtcdDialOptions = []grpc.DialOption{fault.option()}
	n2 := tc.join(t, cfg, newMemStore())
	ctx := context.Background()
	never := func(bool, string) bool { return false }
	for _, applied := range []bool{true, false} {
		t.Run(fmt.Sprintf("first try applied: %v", applied), func(t *testing.T) {
			name := fmt.Sprintf("v-%v", applied)
			hits := fault.hit()
			fault.armPut(n2.key("volumes", name), applied, nil) // the connection lost: an unknown outcome
			_, created, err := n2.Volumes().CreateVolume(ctx, api.VolumeSpec{Name: name, Capacity: 1 << 30}, "", never)
			if fault.hit() != hits+1 {
				t.Fatalf("the fault did not fire: %v", err)
			}
			if err != nil || !created {
				t.Fatalf("create after an unknown outcome: created %v, %v; want created", created, err)
			}
			if r := tc.first.record(t, name); r.Spec.Name != name {
				t.Fatalf("record %+v", r)
			}
		})
	}
}

// TestTokenCommitUnknownOutcomeLearnt: a compare-and-swap of the token
// store whose first try's answer is lost is learnt: the document this call
// wrote is its success (at the revision that stored it), not a conflict
// the caller would make its change again on.
func TestTokenCommitUnknownOutcomeLearnt(t *testing.T) {
	tc := startCluster(t)
	fault := &txnFault{}
	cfg := tc.config(t, "n2")
	cfg.EtcdDialOptions = []grpc.DialOption{fault.option()}
	n2 := tc.join(t, cfg, newMemStore())
	ctx := context.Background()
	ts := n2.TokenStore()
	for i, applied := range []bool{true, false} {
		t.Run(fmt.Sprintf("first try applied: %v", applied), func(t *testing.T) {
			_, version, err := ts.Load(ctx)
			if err != nil {
				t.Fatal(err)
			}
			data := []byte(fmt.Sprintf(`{"tokens":[],"n":%d}`, i))
			hits := fault.hit()
			fault.armPut(ts.key(), applied, nil)
			rev, ok, err := ts.Commit(ctx, data, version)
			if fault.hit() != hits+1 {
				t.Fatalf("the fault did not fire: %v", err)
			}
			if err != nil || !ok {
				t.Fatalf("commit after an unknown outcome: ok %v, %v; want ok", ok, err)
			}
			have, hrev, err := ts.Load(ctx)
			if err != nil || !bytes.Equal(have, data) || hrev != rev {
				t.Fatalf("etcd holds %s at %d (%v), want %s at %d", have, hrev, err, data, rev)
			}
		})
	}
}
