package cluster

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

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
	// WasPrimary and Activity: the copy is an old primary's, which was the
	// primary at term WasPrimary, with its activity logs of that term
	// (copyRecord.WasPrimary, copyRecord.Activity).
	WasPrimary uint64
	Activity   *CopyActivity
}

// ActivityFor returns the activity logs by which a resync of this
// out-of-sync copy by the primary at term may copy, besides the primary's
// dirty bitmaps, only the regions the copy's node had writes active in,
// instead of the whole copy: only for an old primary's copy whose logs are
// of its term, resynced by the primary promoted in its place (whose bitmaps
// track the copy from its first write). nil: copy it whole.
func (t Target) ActivityFor(term uint64) *CopyActivity {
	if !t.Whole || t.WasPrimary == 0 || t.WasPrimary+1 != term || t.Activity == nil || t.Activity.Term != t.WasPrimary ||
		t.Activity.Extent <= 0 {
		return nil
	}
	return t.Activity
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
func (ps Primaries) Role(ctx context.Context, volume string) (Role, error) {
	// A read changes nothing, so one that fails while etcd elects a leader
	// ("leader changed", "no leader") is tried again for a while, instead
	// of failing the client's connection.
	var resp *clientv3.TxnResponse
	var err error
	deadline := time.Now().Add(roleRetry)
	for {
		resp, err = ps.n.cli.Txn(ctx).Then(clientv3.OpGet(ps.n.key("volumes", volume)),
			clientv3.OpGet(ps.n.key("copies", volume)+"/", clientv3.WithPrefix()),
			clientv3.OpGet(ps.n.key("alive")+"/", clientv3.WithPrefix())).Commit()
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
	me := ps.n.cfg.NodeName
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
					State: copies[node].State, Term: copyTerm(copies[node]), Whole: copies[node].Whole,
					WasPrimary: copies[node].WasPrimary, Activity: copies[node].Activity})
			}
		}
	}
	if rec.Primary != me && slices.Contains(rec.Copies, me) {
		r.CopyTerm = copyTerm(copies[me])
	}
	return r, nil
}
