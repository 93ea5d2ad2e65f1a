package cluster

import (
	"errors"
	"slices"
	"strings"
	"testing"
)

func TestChoose(t *testing.T) {
	// free in GiB (placement compares free space in steps of freeStep).
	up := func(name, domain string, free int64) NodeInfo {
		return NodeInfo{Name: name, FailureDomain: domain, FreeBytes: free * freeStep, Up: true}
	}
	holding := func(ni NodeInfo, volumes int, extra int64) NodeInfo {
		ni.Volumes, ni.FreeBytes = volumes, ni.FreeBytes+extra
		return ni
	}
	for _, tc := range []struct {
		name     string
		nodes    []NodeInfo
		replicas int
		want     []string
		err      error
	}{
		{"most free first", []NodeInfo{up("a", "", 10), up("b", "", 30), up("c", "", 20)}, 2, []string{"b", "c"}, nil},
		{"ties by name", []NodeInfo{up("c", "", 5), up("a", "", 5), up("b", "", 5)}, 3, []string{"a", "b", "c"}, nil},
		// One filesystem under every node (reports a moment apart): the
		// bytes differ within a step, and the volumes spread.
		{"ties by fewer copies", []NodeInfo{holding(up("a", "", 5), 2, 4096), holding(up("b", "", 5), 1, 8192),
			holding(up("c", "", 5), 1, 0)}, 2, []string{"b", "c"}, nil},
		{"a step more free space outranks fewer copies", []NodeInfo{holding(up("a", "", 6), 9, 0), holding(up("b", "", 5), 0, 0)},
			1, []string{"a"}, nil},
		{"spreads failure domains", []NodeInfo{up("a", "z1", 30), up("b", "z1", 20), up("c", "z2", 10)}, 2, []string{"a", "c"}, nil},
		{"reuses a domain when none is left", []NodeInfo{up("a", "z1", 30), up("b", "z1", 20), up("c", "z2", 10)}, 3,
			[]string{"a", "c", "b"}, nil},
		{"no domain is a domain of its own", []NodeInfo{up("a", "z1", 30), up("b", "z1", 20), up("c", "", 10)}, 2,
			[]string{"a", "c"}, nil},
		{"down nodes are not eligible", []NodeInfo{up("a", "", 10), {Name: "b", FreeBytes: 99}, up("c", "", 5)}, 2,
			[]string{"a", "c"}, nil},
		{"more replicas than nodes up", []NodeInfo{up("a", "", 10), {Name: "b"}}, 2, nil, ErrNotEnoughNodes},
		{"one node", []NodeInfo{up("a", "", 10)}, 1, []string{"a"}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := choose(tc.nodes, tc.replicas)
			if !errors.Is(err, tc.err) {
				t.Fatalf("err = %v, want %v", err, tc.err)
			}
			if !slices.Equal(got, tc.want) {
				t.Fatalf("choose = %v, want %v", got, tc.want)
			}
		})
	}
}

func TestChooseSkipsDrainedNodes(t *testing.T) {
	nodes := []NodeInfo{{Name: "a", Up: true, FreeBytes: 30, Drain: DrainDone}, {Name: "b", Up: true, FreeBytes: 20},
		{Name: "c", Up: true, FreeBytes: 10, Drain: DrainRunning}, {Name: "d", Up: true, FreeBytes: 5}}
	got, err := choose(nodes, 2)
	if err != nil || !slices.Equal(got, []string{"b", "d"}) {
		t.Fatalf("choose = %v, %v; want [b d]: drained and draining nodes get no copy", got, err)
	}
	_, err = choose(nodes, 3)
	if !errors.Is(err, ErrNotEnoughNodes) || !strings.Contains(err.Error(), "(drained, so not used: a, c)") {
		t.Fatalf("err = %v, want ErrNotEnoughNodes naming the drained nodes", err)
	}
}

func TestChooseRefusalNamesDownNodes(t *testing.T) {
	_, err := choose([]NodeInfo{{Name: "a", Up: true}, {Name: "b"}}, 3)
	if err == nil || err.Error() != "replicas 3: the cluster has 1 node(s) up (down: b); each copy needs a node of its own: not enough nodes" {
		t.Fatalf("err = %v", err)
	}
}
