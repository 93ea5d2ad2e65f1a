package cluster

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// CopyDegraded is the state of a copy that left the in-sync set: it lacks
// writes acknowledged since, and waits for a resync.
const CopyDegraded = "degraded"

// CopyResyncing is the state of a degraded copy that its primary is
// bringing back (copyRecord.Progress says how far).
const CopyResyncing = "resyncing"

// Target is a copy a primary writes to: the copy node's NBD address (empty
// while the node is down) and the instance of its process, for which the
// primary signs its replication sessions (replica.Credential).
type Target struct {
	Node, NBD, Instance string
	// State is the copy's recorded state (Role.Behind).
	State string
	// Whole: a resync must copy this out-of-sync copy whole
	// (copyRecord.Whole).
	Whole bool
	// Term is the term the copy follows (its replication attachment's): a
	// target whose term is older than the volume's has not followed the
	// new primary yet, and refuses its sessions until it has.
	Term uint64
}

// Role is what this node is for one volume.
type Role struct {
	Placed   bool // the volume is a cluster volume (placed in etcd)
	Replicas int
	Primary  string
	// PrimaryAPI and PrimaryNBD are the primary's addresses, empty while it
	// is down.
	PrimaryAPI, PrimaryNBD string
	Term                   uint64
	// Targets are the other in-sync copies, when this node is the primary.
	Targets []Target
	// Behind are the other copies out of the in-sync set, when this node
	// is the primary: their changes are tracked for a resync.
	Behind []Target
	// CopyTerm is the term this node's copy follows, when it holds a copy
	// that is not the primary's (0: none, or not followed yet).
	CopyTerm uint64
}

// roleRetry bounds how long Role tries a failing read again (an etcd
// leader election takes about a second), and roleRetryPause is the pause
// between tries.
const (
	roleRetry      = 5 * time.Second
	roleRetryPause = 200 * time.Millisecond
)

// IsPrimary says whether this node is the volume's primary.
func (r Role) IsPrimary(node string) bool { return r.Placed && r.Primary == node }

// Role reads what this node is for volume: its primary, term and, on the
// primary, the in-sync copies to write.
func (n *Node) Role(ctx context.Context, volume string) (Role, error) {
	// A read changes nothing, so one that fails while etcd elects a leader
	// ("leader changed", "no leader") is tried again for a while, instead
	// of failing the client's connection.
	var resp *clientv3.TxnResponse
	var err error
	deadline := time.Now().Add(roleRetry)
	for {
		resp, err = n.cli.Txn(ctx).Then(clientv3.OpGet(n.key("volumes", volume)),
			clientv3.OpGet(n.key("copies", volume)+"/", clientv3.WithPrefix()),
			clientv3.OpGet(n.key("alive")+"/", clientv3.WithPrefix())).Commit()
		if err == nil || ctx.Err() != nil || time.Now().After(deadline) {
			break
		}
		select {
		case <-ctx.Done():
		case <-time.After(roleRetryPause):
		}
	}
	if err != nil {
		return Role{}, fmt.Errorf("role for %q: %w", volume, err)
	}
	kvs := resp.Responses[0].GetResponseRange().Kvs
	if len(kvs) == 0 {
		return Role{}, nil
	}
	var rec volumeRecord
	if err := json.Unmarshal(kvs[0].Value, &rec); err != nil {
		return Role{}, fmt.Errorf("etcd key %s: %w", kvs[0].Key, err)
	}
	copies := map[string]copyRecord{}
	for _, kv := range resp.Responses[1].GetResponseRange().Kvs {
		var c copyRecord
		if json.Unmarshal(kv.Value, &c) == nil {
			copies[lastSegment(string(kv.Key))] = c
		}
	}
	alive := map[string]aliveRecord{}
	for _, kv := range resp.Responses[2].GetResponseRange().Kvs {
		var a aliveRecord
		if json.Unmarshal(kv.Value, &a) == nil {
			alive[lastSegment(string(kv.Key))] = a
		}
	}
	r := Role{Placed: true, Replicas: max(rec.Spec.Replicas, 1), Primary: rec.Primary, Term: rec.Term,
		PrimaryAPI: alive[rec.Primary].API, PrimaryNBD: alive[rec.Primary].NBD}
	me := n.cfg.NodeName
	if rec.Primary == me && rec.State == volumeActive {
		for _, node := range rec.InSync {
			if node != me {
				r.Targets = append(r.Targets, Target{Node: node, NBD: alive[node].NBD, Instance: alive[node].Instance,
					State: copies[node].State, Term: copyTerm(copies[node])})
			}
		}
		for _, node := range rec.Copies {
			if node != me && !slices.Contains(rec.InSync, node) {
				r.Behind = append(r.Behind, Target{Node: node, NBD: alive[node].NBD, Instance: alive[node].Instance,
					State: copies[node].State, Term: copyTerm(copies[node]), Whole: copies[node].Whole})
			}
		}
	}
	if rec.Primary != me && slices.Contains(rec.Copies, me) {
		r.CopyTerm = copyTerm(copies[me])
	}
	return r, nil
}

// MarkOutOfSync takes copy node out of the volume's in-sync set, as the
// primary at term, and records the copy degraded. It succeeds only while
// this node is the volume's primary at that term and holds its lease, so a
// primary cut off from etcd cannot drop a copy and go on alone: its caller
// must not acknowledge the request that found the copy failed.
func (n *Node) MarkOutOfSync(volume, node string, term uint64, cause error) error {
	return n.markOutOfSync(volume, node, term, cause, false)
}

// markOutOfSync is MarkOutOfSync; whole also records that the copy's
// resync must copy it whole (MarkDiverged), even if it was out of sync
// already.
func (n *Node) markOutOfSync(volume, node string, term uint64, cause error, whole bool) error {
	ctx, cancel := context.WithTimeout(context.Background(), n.cfg.LeaseTTL)
	defer cancel()
	s := n.session()
	if s == nil || !n.up.Load() {
		return fmt.Errorf("mark copy %s of %q out of sync: %w", node, volume, ErrNoSession)
	}
	vk, ck, ak := n.key("volumes", volume), n.key("copies", volume, node), n.key("alive", n.cfg.NodeName)
	// transient: an etcd error worth another try while this node holds
	// its lease and the deadline allows (the copy's node was the etcd
	// leader: "leader changed" while etcd elects another). A Txn whose
	// outcome is unknown is safe to try again: the next round reads the
	// record and finds the copy out of the in-sync set if it went through.
	transient := func() bool {
		if ctx.Err() != nil || !n.up.Load() {
			return false
		}
		sleep(ctx, 50*time.Millisecond)
		return ctx.Err() == nil
	}
	for {
		resp, err := n.cli.Txn(ctx).Then(clientv3.OpGet(vk), clientv3.OpGet(ck)).Commit()
		if err != nil {
			if transient() {
				continue
			}
			return fmt.Errorf("mark copy %s of %q out of sync: %w", node, volume, err)
		}
		kvs := resp.Responses[0].GetResponseRange().Kvs
		if len(kvs) == 0 {
			return fmt.Errorf("mark copy %s of %q out of sync: %w", node, volume, ErrVolumeNotFound)
		}
		var rec volumeRecord
		if err := json.Unmarshal(kvs[0].Value, &rec); err != nil {
			return err
		}
		if rec.Primary != n.cfg.NodeName || rec.Term != term {
			return fmt.Errorf("mark copy %s of %q out of sync: this node is no longer primary at term %d (primary %s, term %d): %w",
				node, volume, term, rec.Primary, rec.Term, ErrNotPrimary)
		}
		if !slices.Contains(rec.InSync, node) && !whole {
			return nil // a concurrent request recorded it
		}
		rec.InSync = slices.DeleteFunc(slices.Clone(rec.InSync), func(s string) bool { return s == node })
		var c copyRecord
		if ckvs := resp.Responses[1].GetResponseRange().Kvs; len(ckvs) > 0 {
			_ = json.Unmarshal(ckvs[0].Value, &c)
		}
		c.State, c.Reason, c.UpdatedAt = CopyDegraded, cause.Error(), time.Now().UTC()
		c.Whole = c.Whole || whole
		put, err := n.cli.Txn(ctx).If(clientv3.Compare(clientv3.ModRevision(vk), "=", kvs[0].ModRevision),
			clientv3.Compare(clientv3.LeaseValue(ak), "=", s.Lease())).
			Then(clientv3.OpPut(vk, mustJSON(rec)), clientv3.OpPut(ck, mustJSON(c))).Commit()
		if err != nil {
			if transient() {
				continue
			}
			return fmt.Errorf("mark copy %s of %q out of sync: %w", node, volume, err)
		}
		if put.Succeeded {
			n.log.Warn("copy out of sync: the volume is degraded", "volume", volume, "copy", node, "term", term,
				"inSync", rec.InSync, "err", cause)
			return nil
		}
		// The record changed meanwhile, or the lease is gone: look again.
		if !n.up.Load() {
			return fmt.Errorf("mark copy %s of %q out of sync: %w", node, volume, ErrNoSession)
		}
		sleep(ctx, 20*time.Millisecond)
	}
}

// MarkInSync puts copy node back into the volume's in-sync set, as the
// primary at term, and records the copy in sync: one transaction that
// holds only while this node is that primary and holds its lease. The
// caller has made sure the copy holds every acknowledged write and gets
// every later one (replica.Rejoin).
func (n *Node) MarkInSync(volume, node string, term uint64) error {
	ctx, cancel := context.WithTimeout(context.Background(), n.cfg.LeaseTTL)
	defer cancel()
	s := n.session()
	if s == nil || !n.up.Load() {
		return fmt.Errorf("mark copy %s of %q in sync: %w", node, volume, ErrNoSession)
	}
	vk, ck, ak := n.key("volumes", volume), n.key("copies", volume, node), n.key("alive", n.cfg.NodeName)
	resp, err := n.cli.Txn(ctx).Then(clientv3.OpGet(vk), clientv3.OpGet(ck)).Commit()
	if err != nil {
		return fmt.Errorf("mark copy %s of %q in sync: %w", node, volume, err)
	}
	kvs := resp.Responses[0].GetResponseRange().Kvs
	if len(kvs) == 0 {
		return fmt.Errorf("mark copy %s of %q in sync: %w", node, volume, ErrVolumeNotFound)
	}
	var rec volumeRecord
	if err := json.Unmarshal(kvs[0].Value, &rec); err != nil {
		return err
	}
	if rec.Primary != n.cfg.NodeName || rec.Term != term || rec.State != volumeActive || !slices.Contains(rec.Copies, node) {
		return fmt.Errorf("mark copy %s of %q in sync: this node is not the primary at term %d (primary %s, term %d, copies %v): %w",
			node, volume, term, rec.Primary, rec.Term, rec.Copies, ErrNotPrimary)
	}
	if !slices.Contains(rec.InSync, node) {
		rec.InSync = append(slices.Clone(rec.InSync), node)
	}
	var c copyRecord
	if ckvs := resp.Responses[1].GetResponseRange().Kvs; len(ckvs) > 0 {
		_ = json.Unmarshal(ckvs[0].Value, &c)
	}
	c.State, c.Reason, c.Progress, c.Whole, c.UpdatedAt = CopyInSync, "", nil, false, time.Now().UTC()
	put, err := n.cli.Txn(ctx).If(clientv3.Compare(clientv3.ModRevision(vk), "=", kvs[0].ModRevision),
		clientv3.Compare(clientv3.LeaseValue(ak), "=", s.Lease())).
		Then(clientv3.OpPut(vk, mustJSON(rec)), clientv3.OpPut(ck, mustJSON(c))).Commit()
	if err != nil {
		return fmt.Errorf("mark copy %s of %q in sync: %w", node, volume, err)
	}
	if !put.Succeeded {
		return fmt.Errorf("mark copy %s of %q in sync: the volume record changed meanwhile, or this node lost its lease: %w",
			node, volume, ErrNoSession)
	}
	n.log.Info("copy back in sync", "volume", volume, "copy", node, "term", term, "inSync", rec.InSync)
	return nil
}

// Progress is how far a resync (or rebuild) of a copy got.
type Progress struct {
	DoneBytes  int64 `json:"doneBytes"`
	TotalBytes int64 `json:"totalBytes"`
}

// Percent is the share done, 0 to 100.
func (p Progress) Percent() float64 {
	if p.TotalBytes <= 0 {
		return 100
	}
	return 100 * float64(p.DoneBytes) / float64(p.TotalBytes)
}

// SetCopyState records the state of an out-of-sync copy, as its primary at
// term: CopyResyncing with its progress, or CopyDegraded with the reason
// (a resync that stopped). It never touches a copy in the in-sync set.
func (n *Node) SetCopyState(volume, node string, term uint64, state, reason string, p *Progress) error {
	ctx, cancel := context.WithTimeout(context.Background(), n.cfg.LeaseTTL)
	defer cancel()
	vk, ck := n.key("volumes", volume), n.key("copies", volume, node)
	resp, err := n.cli.Txn(ctx).Then(clientv3.OpGet(vk), clientv3.OpGet(ck)).Commit()
	if err != nil {
		return fmt.Errorf("record the state of copy %s of %q: %w", node, volume, err)
	}
	kvs, ckvs := resp.Responses[0].GetResponseRange().Kvs, resp.Responses[1].GetResponseRange().Kvs
	if len(kvs) == 0 || len(ckvs) == 0 {
		return fmt.Errorf("record the state of copy %s of %q: %w", node, volume, ErrVolumeNotFound)
	}
	var rec volumeRecord
	var c copyRecord
	if err := json.Unmarshal(kvs[0].Value, &rec); err != nil {
		return err
	}
	if err := json.Unmarshal(ckvs[0].Value, &c); err != nil {
		return err
	}
	if rec.Primary != n.cfg.NodeName || rec.Term != term {
		return fmt.Errorf("record the state of copy %s of %q: this node is not the primary at term %d (primary %s, term %d): %w",
			node, volume, term, rec.Primary, rec.Term, ErrNotPrimary)
	}
	if slices.Contains(rec.InSync, node) {
		return fmt.Errorf("record the state of copy %s of %q: the copy is in sync, not out of sync", node, volume)
	}
	c.State, c.Reason, c.Progress, c.UpdatedAt = state, reason, p, time.Now().UTC()
	put, err := n.cli.Txn(ctx).If(clientv3.Compare(clientv3.ModRevision(vk), "=", kvs[0].ModRevision),
		clientv3.Compare(clientv3.ModRevision(ck), "=", ckvs[0].ModRevision)).
		Then(clientv3.OpPut(ck, mustJSON(c))).Commit()
	if err != nil {
		return fmt.Errorf("record the state of copy %s of %q: %w", node, volume, err)
	}
	if !put.Succeeded {
		return fmt.Errorf("record the state of copy %s of %q: changed meanwhile", node, volume)
	}
	return nil
}
