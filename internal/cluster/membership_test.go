package cluster

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/etcdserverpb"

	"github.com/quiverstorage/quiver/internal/api"
)

// embeddedConfig is a node with an embedded member at loopback ports of
// its own, joining the running cluster of initial (ClusterStateExisting).
func (tc *testCluster) embeddedConfig(t *testing.T, name, peerURL, initial string) Config {
	cfg := tc.config(t, name)
	cfg.EtcdEndpoints = nil
	cfg.InitialCluster, cfg.InitialClusterState = initial, ClusterStateExisting
	cfg.EtcdClientURLs = []string{fmt.Sprintf("http://127.0.0.1:%d", freePort(t))}
	cfg.EtcdDataDir = filepath.Join(tc.dir, name+"-etcd-"+newID())
	cfg.StartTimeout = 30 * time.Second
	return cfg
}

func etcdMembers(t *testing.T, n *Node) []*etcdserverpb.Member {
	t.Helper()
	resp, err := n.cli.MemberList(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return resp.Members
}

// TestAddMember: a node added through AddMember joins as an etcd learner
// and promotes itself once caught up; the refusals of AddMember (a taken
// name, a bad URL, a second learner pending, a node on external etcd);
// asked again for a member not started yet (its peer URLs), the same
// answer; a node that
// starts as joining a running cluster without having been added is
// refused.
func TestAddMember(t *testing.T) {
	tc := startCluster(t)
	n1 := tc.first
	ctx := context.Background()
	ext := tc.join(t, tc.config(t, "ext"), newMemStore()) // a node on external etcd, no member

	peer2 := fmt.Sprintf("http://127.0.0.1:%d", freePort(t))
	added, err := n1.AddMember(ctx, "n2", []string{peer2})
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(added.InitialCluster, "n2="+peer2) || !strings.Contains(added.InitialCluster, "n1=http://127.0.0.1:") {
		t.Fatalf("initial cluster %q: want n1 and n2=%s", added.InitialCluster, peer2)
	}
	ms := etcdMembers(t, n1)
	if i := slices.IndexFunc(ms, func(m *etcdserverpb.Member) bool { return m.ID == added.MemberID }); len(ms) != 2 || i < 0 || !ms[i].IsLearner {
		t.Fatalf("members after the add: %v, want n1 and a learner %x", ms, added.MemberID)
	}
	again, err := n1.AddMember(ctx, "n2", []string{peer2})
	if err != nil || again.MemberID != added.MemberID || again.InitialCluster != added.InitialCluster {
		t.Fatalf("add again before the node started: %+v, %v; want %+v", again, err, added)
	}
	for _, c := range []struct {
		name, node string
		peers      []string
		want       error
	}{
		{"the name of an etcd member", "n1", []string{fmt.Sprintf("http://127.0.0.1:%d", freePort(t))}, ErrNameTaken},
		{"the name of a node", "ext", []string{fmt.Sprintf("http://127.0.0.1:%d", freePort(t))}, ErrNameTaken},
		{"a second learner", "n3", []string{fmt.Sprintf("http://127.0.0.1:%d", freePort(t))}, ErrMemberPending},
		{"no peer URL", "n3", nil, ErrInvalidMember},
		{"a URL without a port", "n3", []string{"http://127.0.0.1"}, ErrInvalidMember},
		{"a name that is no DNS label", "N3", []string{fmt.Sprintf("http://127.0.0.1:%d", freePort(t))}, ErrInvalidMember},
	} {
		if _, err := n1.AddMember(ctx, c.node, c.peers); !errors.Is(err, c.want) {
			t.Errorf("add %s: %v, want %v", c.name, err, c.want)
		} else {
			t.Logf("add %s refused: %v", c.name, err)
		}
	}
	if _, err := ext.AddMember(ctx, "n3", []string{fmt.Sprintf("http://127.0.0.1:%d", freePort(t))}); !errors.Is(err, ErrNotSupported) {
		t.Errorf("add through a node on external etcd: %v, want %v", err, ErrNotSupported)
	}

	n2 := tc.join(t, tc.embeddedConfig(t, "n2", peer2, added.InitialCluster), newMemStore())
	ms = etcdMembers(t, n1)
	if len(ms) != 2 || slices.ContainsFunc(ms, func(m *etcdserverpb.Member) bool { return m.IsLearner }) {
		t.Fatalf("members after n2 joined: %v, want two voting members", ms)
	}
	if n2.etcd.Server.IsLearner() {
		t.Fatal("n2's member is still a learner")
	}
	nodes, err := n1.Nodes(ctx)
	if err != nil || !slices.ContainsFunc(nodes, func(ni NodeInfo) bool { return ni.Name == "n2" && ni.Up }) {
		t.Fatalf("nodes: %+v, %v; want n2 up", nodes, err)
	}

	// Joining a running cluster without having been added.
	peer3 := fmt.Sprintf("http://127.0.0.1:%d", freePort(t))
	cfg := tc.embeddedConfig(t, "n3", peer3, added.InitialCluster+",n3="+peer3)
	cfg.StartTimeout = 5 * time.Second
	if n, err := Join(ctx, cfg, newMemStore()); err == nil {
		_ = n.Close()
		t.Fatal("a member that was never added joined")
	} else {
		t.Logf("refused: %v", err)
	}
}

// TestRemoveNode: the refusals of RemoveNode, each changing nothing (a
// node not drained, one holding a copy, a removal that would leave too few
// etcd members), then a removal: the node's records are gone, the running
// node stops (Done, ErrNodeRemoved), and its pool is refused when it starts
// again.
func TestRemoveNode(t *testing.T) {
	tc := startCluster(t)
	n1 := tc.first
	ctx := context.Background()
	peer2 := fmt.Sprintf("http://127.0.0.1:%d", freePort(t))
	added, err := n1.AddMember(ctx, "n2", []string{peer2})
	if err != nil {
		t.Fatal(err)
	}
	tc.join(t, tc.embeddedConfig(t, "n2", peer2, added.InitialCluster), newMemStore())
	cfg3, store3 := tc.config(t, "n3"), newMemStore()
	n3 := tc.join(t, cfg3, store3)
	never := func(bool, string) bool { return false }
	if _, _, err := n1.Volumes().CreateVolume(ctx, api.VolumeSpec{Name: "a", Capacity: 1 << 30, Replicas: 3}, "", never); err != nil {
		t.Fatal(err)
	}

	members := func() []string {
		t.Helper()
		nodes, err := n1.Nodes(ctx)
		if err != nil {
			t.Fatal(err)
		}
		var names []string
		for _, ni := range nodes {
			names = append(names, ni.Name)
		}
		return names
	}
	refused := func(what, node string, want error, says string) {
		t.Helper()
		_, err := n1.RemoveNode(ctx, node)
		if !errors.Is(err, want) || !strings.Contains(err.Error(), says) {
			t.Fatalf("remove %s: %v, want %v saying %q", what, err, want, says)
		}
		t.Logf("remove %s refused: %v", what, err)
		if got := members(); !slices.Equal(got, []string{"n1", "n2", "n3"}) {
			t.Fatalf("after the refusal the nodes are %v", got)
		}
		if len(etcdMembers(t, n1)) != 2 {
			t.Fatalf("after the refusal etcd has %d members", len(etcdMembers(t, n1)))
		}
	}
	refused("an unknown node", "n9", ErrNodeNotFound, "no such node")
	refused("a node not drained", "n3", ErrNodeInUse, "not drained")
	if err := n1.SetDrain(ctx, "n3", DrainRunning); err != nil {
		t.Fatal(err)
	}
	refused("a node still draining", "n3", ErrNodeInUse, "still draining")
	// Marked drained by hand: its copy of "a" is still placed.
	if err := n1.SetDrain(ctx, "n3", DrainDone); err != nil {
		t.Fatal(err)
	}
	refused("a node holding a copy", "n3", ErrNodeInUse, "copy of a")
	if err := n1.SetDrain(ctx, "n2", DrainDone); err != nil {
		t.Fatal(err)
	}
	if err := n1.Volumes().DeleteVolume(ctx, "a"); err != nil {
		t.Fatal(err)
	}
	refused("the member of a two-member etcd", "n2", ErrQuorum, "would leave 1 etcd member")

	// n3 has no etcd member (external etcd): removed, it stops, and its
	// pool is refused from then on.
	got, err := n1.RemoveNode(ctx, "n3")
	if err != nil {
		t.Fatal(err)
	}
	if got.NodeID == "" || got.MemberID != 0 || got.EtcdMembers != 2 {
		t.Fatalf("removed %+v: want n3's node id, no member, 2 etcd members", got)
	}
	if names := members(); !slices.Equal(names, []string{"n1", "n2"}) {
		t.Fatalf("nodes after the removal: %v", names)
	}
	select {
	case <-n3.Done():
		if !errors.Is(n3.Err(), ErrNodeRemoved) {
			t.Fatalf("n3 stopped with %v, want %v", n3.Err(), ErrNodeRemoved)
		}
		t.Logf("n3 stopped: %v", n3.Err())
	case <-time.After(10 * time.Second):
		t.Fatal("the removed node n3 did not stop")
	}
	_ = n3.Close()
	if n, err := Join(ctx, cfg3, store3); !errors.Is(err, ErrNodeRemoved) {
		if err == nil {
			_ = n.Close()
		}
		t.Fatalf("the removed node's pool joins again: %v, want %v", err, ErrNodeRemoved)
	} else {
		t.Logf("restart refused: %v", err)
	}
	if names := members(); !slices.Equal(names, []string{"n1", "n2"}) {
		t.Fatalf("nodes after the refused restart: %v", names)
	}
	// A new pool under the removed node's name is another node: it joins.
	tc.join(t, tc.config(t, "n3"), newMemStore())
}

// TestQuorumAfterRemoval: removing a voting member must leave at least
// three voting members, a quorum of them up.
func TestQuorumAfterRemoval(t *testing.T) {
	m := func(id uint64, name string, learner bool) *etcdserverpb.Member {
		return &etcdserverpb.Member{ID: id, Name: name, IsLearner: learner}
	}
	five := []*etcdserverpb.Member{m(1, "n1", false), m(2, "n2", false), m(3, "n3", false), m(4, "n4", false), m(5, "n5", false)}
	allUp := map[string]bool{"n1": true, "n2": true, "n3": true, "n4": true, "n5": true}
	for _, c := range []struct {
		name    string
		members []*etcdserverpb.Member
		remove  uint64
		up      map[string]bool
		ok      bool
	}{
		{"five to four, all up", five, 5, allUp, true},
		{"four to three, all up", five[:4], 4, allUp, true},
		{"three to two", five[:3], 3, allUp, false},
		{"four to three with a learner beside", append(five[:4:4], m(9, "", true)), 4, allUp, true},
		{"three voters and a learner to two voters", append(five[:3:3], m(9, "", true)), 3, allUp, false},
		{"five to four, two of them down", five, 5, map[string]bool{"n1": true, "n2": true}, false},
		{"five to four, one of them down", five, 5, map[string]bool{"n1": true, "n2": true, "n3": true}, true},
		{"the node removed is the one down", five, 5, map[string]bool{"n1": true, "n2": true, "n3": true, "n4": true}, true},
		{"a member without a node counts as down", []*etcdserverpb.Member{m(1, "n1", false), m(2, "n2", false),
			m(3, "", false), m(4, "x", false), m(5, "n5", false)}, 5, map[string]bool{"n1": true, "n2": true}, false},
	} {
		err := quorumAfterRemoval(c.members, c.remove, c.up)
		if (err == nil) != c.ok || (err != nil && !errors.Is(err, ErrQuorum)) {
			t.Errorf("%s: %v, want ok %v", c.name, err, c.ok)
		}
	}
}
