package cluster

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"slices"
	"strings"
	"time"

	"go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// Nodes in and out (docs/cluster.md, "Adding and removing nodes"): a node
// with an embedded etcd member joins a running cluster through etcd's
// member API (AddMember here, then the new node promotes its own learner
// once it has caught up: embed.go), and a drained node that holds no copy
// leaves it (RemoveNode): its records are forgotten, its identity is
// recorded removed so that its pool never joins again, and its etcd member
// is removed while the members left keep a quorum.

// ClusterStateExisting is Config.InitialClusterState for a node that joins
// a running cluster (`quiver node add` says so): its embedded member
// fetches the cluster from the peers instead of bootstrapping a new one.
const ClusterStateExisting = "existing"

// minEtcdMembers is the fewest voting etcd members a removal may leave: two
// members lose their quorum when either is down, as one member does.
const minEtcdMembers = 3

// removedRecord is "removed/<node id>": the identity of a node that was
// removed. A pool with that node id is refused at join.
type removedRecord struct {
	Name      string    `json:"name"`
	RemovedAt time.Time `json:"removedAt"`
}

// AddedMember is an etcd member added for a new node (AddMember).
type AddedMember struct {
	Name     string
	MemberID uint64
	PeerURLs []string
	// InitialCluster is the new node's --initial-cluster: every member,
	// the new one included, as NAME=PEER-URL.
	InitialCluster string
}

// AddMember adds an etcd member for the node name with peerURLs, as a
// learner: it counts for no quorum until the node, started with the
// answer's InitialCluster and ClusterStateExisting, has caught up and
// promoted itself. Asked again for a member added and not started yet (same
// peer URLs), it answers the same, under the name asked: etcd knows a
// member's name only once it has started. Refused: a node of this cluster runs
// no embedded member (ErrNotSupported), the name is a node or a member
// already (ErrNameTaken), or another added member has not joined yet
// (ErrMemberPending). It changes nothing in quiver's own records: the new
// node registers itself when it starts.
func (n *Node) AddMember(ctx context.Context, name string, peerURLs []string) (AddedMember, error) {
	out := AddedMember{Name: name}
	if n.etcd == nil {
		return out, fmt.Errorf("add node %s: this node runs no embedded etcd member (it uses --etcd-endpoints): a new node "+
			"of this cluster needs no member; start it with the same --etcd-endpoints and it registers itself: %w",
			name, ErrNotSupported)
	}
	if !isDNSLabel(name) {
		return out, fmt.Errorf("add node %q: the name must be a DNS label (lower-case letters, digits and '-', at most 63): %w",
			name, ErrInvalidMember)
	}
	urls, err := n.peerURLs(peerURLs)
	if err != nil {
		return out, fmt.Errorf("add node %s: %w", name, err)
	}
	out.PeerURLs = urls
	resp, err := n.cli.Get(ctx, n.key("members", name))
	if err != nil {
		return out, fmt.Errorf("add node %s: %w", name, err)
	}
	if len(resp.Kvs) > 0 {
		return out, fmt.Errorf("add node %s: a node of that name is in the cluster already (quiver node list); pick another "+
			"name, or remove that node first (quiver node remove %s): %w", name, name, ErrNameTaken)
	}
	list, err := n.cli.MemberList(ctx)
	if err != nil {
		return out, fmt.Errorf("add node %s: list the etcd members: %w", name, err)
	}
	for _, m := range list.Members {
		shared := slices.ContainsFunc(m.PeerURLs, func(u string) bool { return slices.Contains(urls, u) })
		switch {
		case m.Name == name:
			return out, fmt.Errorf("add node %s: etcd has a member of that name already (id %x, peers %s): remove it first "+
				"(quiver node remove %s): %w", name, m.ID, strings.Join(m.PeerURLs, ","), name, ErrNameTaken)
		case shared && m.Name == "" && m.IsLearner && slices.Equal(sortedCopy(m.PeerURLs), sortedCopy(urls)):
			// Added before and not started yet: the same answer again.
			out.MemberID = m.ID
			out.InitialCluster = initialCluster(list.Members, m.ID, name)
			return out, nil
		case shared:
			who := m.Name
			if who == "" {
				who = "a member added and not started yet"
			}
			return out, fmt.Errorf("add node %s: peer URL of %s is %s's (etcd member %x): give the new node's own --peer-url: %w",
				name, strings.Join(urls, ","), who, m.ID, ErrNameTaken)
		}
	}
	var added *clientv3.MemberAddResponse
	err = whileUnhealthy(ctx, func() (err error) {
		added, err = n.cli.MemberAddAsLearner(ctx, urls)
		return err
	})
	if err != nil {
		if errors.Is(err, rpctypes.ErrTooManyLearners) {
			var pending []string
			for _, m := range list.Members {
				if m.IsLearner {
					pending = append(pending, fmt.Sprintf("member %x at %s", m.ID, strings.Join(m.PeerURLs, ",")))
				}
			}
			return out, fmt.Errorf("add node %s: another added node has not joined yet (%s): start it with the flags its "+
				"quiver node add printed, or remove it (quiver node remove NAME), then add this one: %w",
				name, strings.Join(pending, "; "), ErrMemberPending)
		}
		return out, fmt.Errorf("add node %s: etcd member add: %w", name, err)
	}
	out.MemberID = added.Member.ID
	out.InitialCluster = initialCluster(added.Members, added.Member.ID, name)
	n.log.Info("etcd member added as a learner for a new node", "member", name, "memberID", fmt.Sprintf("%x", added.Member.ID),
		"peers", urls)
	return out, nil
}

// unhealthyWait is how long a membership change is tried again while etcd
// answers that its cluster is unhealthy: etcd refuses a change of its
// members until every member has been connected for 5 s (its strict
// reconfiguration check), which a cluster just started, or a member just
// restarted, is not yet.
const unhealthyWait = 20 * time.Second

// whileUnhealthy runs change until it succeeds, fails otherwise than with
// etcd's ErrUnhealthy, or unhealthyWait has passed.
func whileUnhealthy(ctx context.Context, change func() error) error {
	deadline := time.Now().Add(unhealthyWait)
	for {
		err := change()
		if !errors.Is(err, rpctypes.ErrUnhealthy) || time.Now().After(deadline) || ctx.Err() != nil {
			if errors.Is(err, rpctypes.ErrUnhealthy) {
				return fmt.Errorf("%w (every etcd member must be up and connected for 5 s: check quiver node list): %w", err, ErrQuorum)
			}
			return err
		}
		sleep(ctx, 500*time.Millisecond)
	}
}

func sortedCopy(s []string) []string {
	c := slices.Clone(s)
	slices.Sort(c)
	return c
}

// peerURLs checks the new member's peer URLs: http or https, a host and
// a port. With this node's etcd on TLS every member's is, so http becomes
// https, as secureEtcd does for the node's own flags.
func (n *Node) peerURLs(raw []string) ([]string, error) {
	if len(raw) == 0 {
		return nil, fmt.Errorf("--peer-url is required: the URL the new node's etcd member listens on for its peers, "+
			"e.g. https://10.0.0.14:2380: %w", ErrInvalidMember)
	}
	out := make([]string, 0, len(raw))
	for _, r := range raw {
		u, err := url.Parse(r)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Hostname() == "" || u.Port() == "" || u.Path != "" {
			return nil, fmt.Errorf("peer URL %q: want http://HOST:PORT or https://HOST:PORT: %w", r, ErrInvalidMember)
		}
		if n.cfg.etcdTLS() {
			u.Scheme = "https"
		}
		out = append(out, u.String())
	}
	return out, nil
}

// initialCluster is the --initial-cluster of the member id, named name:
// every member as NAME=PEER-URL (one item per peer URL).
func initialCluster(members []*etcdserverpb.Member, id uint64, name string) string {
	var items []string
	for _, m := range members {
		mn := m.Name
		if m.ID == id {
			mn = name
		}
		for _, u := range m.PeerURLs {
			items = append(items, mn+"="+u)
		}
	}
	return strings.Join(items, ",")
}

// RemovedNode is what RemoveNode did.
type RemovedNode struct {
	Name   string
	NodeID string // "" when the node's records were forgotten already
	// MemberID is the etcd member removed (0: the node had none).
	MemberID uint64
	// EtcdMembers is how many voting etcd members are left.
	EtcdMembers int
}

// RemoveNode removes node from the cluster. It refuses, changing nothing,
// a node that is not drained (ErrNodeInUse: drain it first), one that still
// holds a copy of a volume (placed, being removed or left in copies/), and
// a removal of its etcd member that would leave fewer than minEtcdMembers
// voting members or fewer members up than their quorum (ErrQuorum). Then, in
// one Txn comparing the drain mark and the member record it read, it
// deletes the node's records (members/, drained/, alive/) and records its
// node id removed (removedRecord: its pool is refused at join and a live
// process of it stops), and then removes its etcd member. A removal whose
// member removal failed is finished by running it again: the node's
// records are gone, its member is found by name.
func (n *Node) RemoveNode(ctx context.Context, node string) (RemovedNode, error) {
	return n.forgetNode(ctx, node, false)
}

// forgetNode is RemoveNode, and with dead the last step of ReplaceNode: the
// node must then be down (no alive/ key, compared in the Txn) instead of
// drained, and its replacing/ record goes with its other records.
func (n *Node) forgetNode(ctx context.Context, node string, dead bool) (RemovedNode, error) {
	out := RemovedNode{Name: node}
	op := "remove node"
	if dead {
		op = "replace node"
	}
	mk, dk, ak := n.key("members", node), n.key("drained", node), n.key("alive", node)
	resp, err := n.cli.Txn(ctx).Then(clientv3.OpGet(mk), clientv3.OpGet(dk),
		clientv3.OpGet(n.key("volumes")+"/", clientv3.WithPrefix()),
		clientv3.OpGet(n.key("copies")+"/", clientv3.WithPrefix(), clientv3.WithKeysOnly()),
		clientv3.OpGet(n.key("alive")+"/", clientv3.WithPrefix())).Commit()
	if err != nil {
		return out, fmt.Errorf("%s %s: %w", op, node, err)
	}
	list, err := n.cli.MemberList(ctx)
	if err != nil {
		return out, fmt.Errorf("%s %s: list the etcd members: %w", op, node, err)
	}
	var member *etcdserverpb.Member
	for _, m := range list.Members {
		if m.Name == node {
			member = m
		}
	}
	up := map[string]bool{}
	for _, kv := range resp.Responses[4].GetResponseRange().Kvs {
		up[lastSegment(string(kv.Key))] = true
	}
	mkv := resp.Responses[0].GetResponseRange().Kvs
	if len(mkv) == 0 && member == nil {
		return out, fmt.Errorf("%s %s: no such node in the cluster, and no etcd member of that name: %w", op, node, ErrNodeNotFound)
	}
	if len(mkv) > 0 {
		var m memberRecord
		if err := json.Unmarshal(mkv[0].Value, &m); err != nil {
			return out, fmt.Errorf("etcd key %s: %w", mk, err)
		}
		out.NodeID = m.NodeID
		var drain drainRecord
		dkv := resp.Responses[1].GetResponseRange().Kvs
		if len(dkv) > 0 {
			_ = json.Unmarshal(dkv[0].Value, &drain)
		}
		if dead && up[node] {
			return out, fmt.Errorf("%s %s: the node is up: a replace is for a node that is gone; take a running node "+
				"out with quiver node remove %s --drain: %w", op, node, node, ErrNodeInUse)
		}
		if !dead && drain.State != DrainDone {
			state := "not drained"
			if drain.State != "" {
				state = "still " + drain.State
			}
			return out, fmt.Errorf("remove node %s: the node is %s: drain it first (quiver node remove %s --drain, or "+
				"quiver --server <its API> node drain %s), so that no copy is lost with it: %w", node, state, node, node, ErrNodeInUse)
		}
		if held := heldBy(node, resp.Responses[2].GetResponseRange().Kvs, resp.Responses[3].GetResponseRange().Kvs); len(held) > 0 {
			if dead {
				return out, fmt.Errorf("%s %s: it still holds a copy of %s: run quiver node replace again: %w",
					op, node, strings.Join(held, ", "), ErrNodeInUse)
			}
			return out, fmt.Errorf("remove node %s: it still holds a copy of %s: run its drain again (quiver node drain %s) "+
				"and wait until quiver node list shows it drained with 0 volumes: %w", node, strings.Join(held, ", "), node, ErrNodeInUse)
		}
		if member != nil && !member.IsLearner {
			if err := quorumAfterRemoval(list.Members, member.ID, up); err != nil {
				return out, fmt.Errorf("%s %s: %w", op, node, err)
			}
		}
		ops := []clientv3.Op{clientv3.OpDelete(mk), clientv3.OpDelete(dk), clientv3.OpDelete(ak),
			clientv3.OpPut(n.key("removed", m.NodeID), mustJSON(removedRecord{Name: node, RemovedAt: time.Now().UTC()}))}
		cmps := []clientv3.Cmp{clientv3.Compare(clientv3.ModRevision(mk), "=", mkv[0].ModRevision)}
		if dead {
			// Still gone: a node back meanwhile is not forgotten under it.
			cmps = append(cmps, clientv3.Compare(clientv3.CreateRevision(ak), "=", 0))
			ops = append(ops, clientv3.OpDelete(n.key("replacing", node)))
		} else {
			cmps = append(cmps, clientv3.Compare(clientv3.ModRevision(dk), "=", dkv[0].ModRevision))
		}
		// An unknown outcome fails the removal; run again, it finds the
		// records gone (and removes the member) or removes them.
		tresp, err := n.commit(ctx, txnSpec{If: cmps, Then: ops})
		if err != nil {
			return out, fmt.Errorf("%s %s: %w", op, node, err)
		}
		if !tresp.Succeeded {
			return out, fmt.Errorf("%s %s: its records changed meanwhile (an undrain, a new drain or its restart): "+
				"check quiver node list and run it again: %w", op, node, ErrNodeInUse)
		}
		n.log.Info("node removed from the cluster's records", "removed", node, "nodeID", m.NodeID)
	} else if !member.IsLearner {
		// Forgotten already (a removal whose member removal failed).
		if err := quorumAfterRemoval(list.Members, member.ID, up); err != nil {
			return out, fmt.Errorf("%s %s: %w", op, node, err)
		}
	}
	voters := 0
	for _, m := range list.Members {
		if !m.IsLearner {
			voters++
		}
	}
	out.EtcdMembers = voters
	if member == nil {
		return out, nil
	}
	err = whileUnhealthy(ctx, func() error {
		_, err := n.cli.MemberRemove(ctx, member.ID)
		return err
	})
	if err != nil && !errors.Is(err, rpctypes.ErrMemberNotFound) {
		if errors.Is(err, rpctypes.ErrMemberNotEnoughStarted) {
			err = fmt.Errorf("%w: %w", err, ErrQuorum)
		}
		again := "quiver node remove " + node
		if dead {
			again = "quiver node replace " + node + " NEW"
		}
		return out, fmt.Errorf("%s %s: the node's records are gone, but its etcd member %x is not: %w; "+
			"run %s again once the other members are up", op, node, member.ID, err, again)
	}
	out.MemberID = member.ID
	if !member.IsLearner {
		out.EtcdMembers--
	}
	n.log.Info("etcd member removed", "removed", node, "memberID", fmt.Sprintf("%x", member.ID), "members", out.EtcdMembers)
	return out, nil
}

// heldBy lists the volumes of which node holds a copy, by the records
// volumes/ and the keys copies/<volume>/<node>.
func heldBy(node string, volumes, copies []*mvccpb.KeyValue) []string {
	var held []string
	for _, kv := range volumes {
		var v volumeRecord
		if json.Unmarshal(kv.Value, &v) != nil {
			continue
		}
		if v.Primary == node || slices.Contains(v.Copies, node) || slices.Contains(v.Removing, node) {
			held = append(held, lastSegment(string(kv.Key)))
		}
	}
	for _, kv := range copies {
		k := string(kv.Key)
		if lastSegment(k) != node {
			continue
		}
		vol := lastSegment(strings.TrimSuffix(k, "/"+node))
		if !slices.Contains(held, vol) {
			held = append(held, vol)
		}
	}
	slices.Sort(held)
	return held
}

// quorumAfterRemoval checks that removing the voting member id leaves at
// least minEtcdMembers voting members, and that a quorum of them is up
// (its node's alive key: a member whose node is unknown counts as down).
// Otherwise it is ErrQuorum, saying why.
func quorumAfterRemoval(members []*etcdserverpb.Member, id uint64, up map[string]bool) error {
	var left, down []string
	for _, m := range members {
		if m.IsLearner || m.ID == id {
			continue
		}
		name := m.Name
		if name == "" {
			name = fmt.Sprintf("member %x (not started)", m.ID)
		}
		left = append(left, name)
		if !up[m.Name] {
			down = append(down, name)
		}
	}
	if len(left) < minEtcdMembers {
		return fmt.Errorf("it would leave %d etcd member(s) (%s), and fewer than %d lose their quorum when any one is down: "+
			"add a node first (quiver node add), then remove this one: %w", len(left), strings.Join(left, ", "), minEtcdMembers, ErrQuorum)
	}
	if quorum := len(left)/2 + 1; len(left)-len(down) < quorum {
		return fmt.Errorf("of the %d etcd members left, %s %s down and a quorum is %d: bring them up first, so that etcd "+
			"keeps a quorum through the removal: %w", len(left), strings.Join(down, ", "), isAre(len(down)), quorum, ErrQuorum)
	}
	return nil
}

func isAre(n int) string {
	if n == 1 {
		return "is"
	}
	return "are"
}

// checkNotRemoved refuses the identity of a node that was removed
// (RemoveNode): its pool cannot join again.
func (n *Node) checkNotRemoved(ctx context.Context) error {
	resp, err := n.cli.Get(ctx, n.key("removed", n.id.NodeID))
	if err != nil {
		return fmt.Errorf("register node %q: %w", n.cfg.NodeName, err)
	}
	if len(resp.Kvs) == 0 {
		return nil
	}
	var r removedRecord
	_ = json.Unmarshal(resp.Kvs[0].Value, &r)
	return n.removedError(r.RemovedAt)
}

func (n *Node) removedError(at time.Time) error {
	when := ""
	if !at.IsZero() {
		when = " at " + at.Format(time.RFC3339)
	}
	return fmt.Errorf("node %q (id %s, pool %s) was removed from cluster %q%s (quiver node remove): its pool cannot join "+
		"again; to bring this machine back, start it on a new pool and add it with quiver node add %s: %w",
		n.cfg.NodeName, n.id.NodeID, n.id.PoolID, n.cfg.ClusterName, when, n.cfg.NodeName, ErrNodeRemoved)
}

// watchRemoval ends the node (fail) when it is removed while it runs: its
// removed/ record appears, or its embedded etcd member stops by itself
// (etcd stops a member once it is removed; it stops for nothing else while
// the node runs).
func (n *Node) watchRemoval(ctx context.Context) {
	var stopped <-chan struct{}
	if n.etcd != nil {
		stopped = n.etcd.Server.StopNotify()
	}
	k := n.key("removed", n.id.NodeID)
	for ctx.Err() == nil {
		wctx, cancel := context.WithCancel(ctx)
		wch := n.cli.Watch(clientv3.WithRequireLeader(wctx), k)
		// The key may have been written before the watch began.
		if resp, err := n.cli.Get(wctx, k); err == nil && len(resp.Kvs) > 0 {
			cancel()
			n.fail(n.removedError(time.Time{}))
			return
		}
	watch:
		for {
			select {
			case <-ctx.Done():
				cancel()
				return
			case <-stopped:
				cancel()
				if ctx.Err() == nil {
					n.fail(fmt.Errorf("node %q: its embedded etcd member stopped, as etcd stops a member removed from the "+
						"cluster (quiver node remove): this node cannot go on: %w", n.cfg.NodeName, ErrNodeRemoved))
				}
				return
			case wr, ok := <-wch:
				if !ok || wr.Err() != nil {
					break watch
				}
				for _, ev := range wr.Events {
					if ev.Type == clientv3.EventTypePut {
						cancel()
						n.fail(n.removedError(time.Time{}))
						return
					}
				}
			}
		}
		cancel()
		sleep(ctx, time.Second)
	}
}

// fail ends the node's membership for good: Done closes and Err says why.
// The server stops when it sees Done.
func (n *Node) fail(err error) {
	n.failOnce.Do(func() {
		n.log.Error("this node leaves the cluster", "err", err)
		n.failErr = err
		close(n.done)
	})
}

// Done is closed when the node can no longer serve as a member of the
// cluster (it was removed); Err then says why.
func (n *Node) Done() <-chan struct{} { return n.done }

// Err says why Done closed (nil while it is open).
func (n *Node) Err() error {
	select {
	case <-n.done:
		return n.failErr
	default:
		return nil
	}
}
