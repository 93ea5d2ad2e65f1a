package cluster

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// Election, promotion and the term (docs/cluster.md, "Lease fencing and
// failover").
//
// primary/<volume> names the primary and its term, under the primary's
// session lease: it vanishes with the lease. Every node looks, as soon as
// a primary/ key goes (a watch) and every electInterval besides, at the
// volumes whose in-sync set holds it:
//
//   - it is the volume's primary and primary/<volume> is absent (a new
//     volume, or its session was renewed after a lapse with no failover
//     meanwhile): it takes the key again at the same term;
//   - another node is the primary, primary/<volume> is absent and that node
//     is down (no alive key): it promotes itself, in one Txn that compares
//     the volume record's revision, the absence of primary/<volume> and of
//     the old primary's alive key, and its own lease. The Txn writes term+1,
//     takes the old primary out of the in-sync set (it misses every write
//     from now on), records its copy degraded and takes primary/<volume>.
//     Of several candidates, one Txn wins.
//
// Only the in-sync set in etcd says who may be promoted: an out-of-date copy
// never is.

// primaryRecord is "primary/<volume>", under the primary's lease.
type primaryRecord struct {
	Node string `json:"node"`
	Term uint64 `json:"term"`
	// lease is the key's lease, from etcd (not stored in the value).
	lease clientv3.LeaseID
}

// electInterval is how often a node looks for volumes without a primary
// besides the watch of primary/ (Config.electEvery).
const electInterval = 500 * time.Millisecond

// ErrNotReady: this node is the volume's new primary, but has not yet
// taken over its attachments; a client tries again.
var ErrNotReady = errors.New("the new primary is taking over")

// elect runs an election round whenever a primary/ key goes and every
// electInterval: the watch promotes a copy as soon as etcd ends the old
// primary's lease, where the ticker alone added up to electInterval to
// every failover; the ticker covers what the watch cannot see (a copy
// that becomes in sync, a session renewed, a watch being made again).
func (ps Primaries) elect(ctx context.Context) {
	t := time.NewTicker(ps.n.cfg.electEvery)
	defer t.Stop()
	gone := ps.watchPrimariesGone(ctx)
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-gone:
		}
		if err := ps.electOnce(ctx); err != nil && ctx.Err() == nil {
			ps.n.log.Debug("election round", "err", err)
		}
	}
}

// watchPrimariesGone returns a channel that receives when a primary/ key
// is deleted (its lease ended, or it was handed over), until ctx ends. A
// watch that ends (etcd compacted past it, the member restarted) is made
// again after a pause.
func (ps Primaries) watchPrimariesGone(ctx context.Context) <-chan struct{} {
	ch := make(chan struct{}, 1)
	go func() {
		for ctx.Err() == nil {
			wctx, cancel := context.WithCancel(ctx)
			for wr := range ps.n.cli.Watch(wctx, ps.n.key("primary")+"/", clientv3.WithPrefix(), clientv3.WithFilterPut()) {
				if len(wr.Events) == 0 {
					continue
				}
				select {
				case ch <- struct{}{}:
				default: // a round is already due
				}
			}
			cancel()
			select {
			case <-ctx.Done():
			case <-time.After(time.Second):
			}
		}
	}()
	return ch
}

// clusterView is one consistent read of what an election needs.
type clusterView struct {
	rev      int64
	volumes  map[string]volumeEntry
	primary  map[string]primaryRecord
	alive    map[string]bool
	copies   map[string]map[string]copyRecord
	attached map[string][]byte
}

type volumeEntry struct {
	rec    volumeRecord
	modRev int64
}

func (ps Primaries) readView(ctx context.Context, volume string) (clusterView, error) {
	vk, pk, ck, ak := ps.n.key("volumes")+"/", ps.n.key("primary")+"/", ps.n.key("copies")+"/", ps.n.key("attach")+"/"
	opts := []clientv3.OpOption{clientv3.WithPrefix()}
	if volume != "" {
		vk, pk, ck, ak = ps.n.key("volumes", volume), ps.n.key("primary", volume), ps.n.key("copies", volume)+"/", ps.n.key("attach", volume)
		opts = nil
	}
	resp, err := ps.n.cli.Txn(ctx).Then(clientv3.OpGet(vk, opts...), clientv3.OpGet(pk, opts...),
		clientv3.OpGet(ps.n.key("alive")+"/", clientv3.WithPrefix(), clientv3.WithKeysOnly()),
		clientv3.OpGet(ck, clientv3.WithPrefix()), clientv3.OpGet(ak, opts...)).Commit()
	if err != nil {
		return clusterView{}, err
	}
	v := clusterView{rev: resp.Header.Revision, volumes: map[string]volumeEntry{}, primary: map[string]primaryRecord{},
		alive: map[string]bool{}, copies: map[string]map[string]copyRecord{}, attached: map[string][]byte{}}
	for _, kv := range resp.Responses[0].GetResponseRange().Kvs {
		var rec volumeRecord
		if json.Unmarshal(kv.Value, &rec) == nil {
			v.volumes[lastSegment(string(kv.Key))] = volumeEntry{rec, kv.ModRevision}
		}
	}
	for _, kv := range resp.Responses[1].GetResponseRange().Kvs {
		var p primaryRecord
		if json.Unmarshal(kv.Value, &p) == nil {
			p.lease = clientv3.LeaseID(kv.Lease)
			v.primary[lastSegment(string(kv.Key))] = p
		}
	}
	for _, kv := range resp.Responses[2].GetResponseRange().Kvs {
		v.alive[lastSegment(string(kv.Key))] = true
	}
	for _, kv := range resp.Responses[3].GetResponseRange().Kvs {
		// copies/<volume>/<node>
		k := string(kv.Key)[len(ps.n.key("copies"))+1:]
		vol, node := k[:max(len(k)-len(lastSegment(k))-1, 0)], lastSegment(k)
		var c copyRecord
		if json.Unmarshal(kv.Value, &c) == nil {
			if v.copies[vol] == nil {
				v.copies[vol] = map[string]copyRecord{}
			}
			v.copies[vol][node] = c
		}
	}
	for _, kv := range resp.Responses[4].GetResponseRange().Kvs {
		v.attached[lastSegment(string(kv.Key))] = kv.Value
	}
	return v, nil
}

func (ps Primaries) electOnce(ctx context.Context) error {
	s := ps.n.session()
	if s == nil || !ps.n.up.Load() {
		return nil
	}
	view, err := ps.readView(ctx, "")
	if err != nil {
		return err
	}
	me := ps.n.cfg.NodeName
	var errs error
	for name, e := range view.volumes {
		rec := e.rec
		if rec.State != volumeActive || max(rec.Spec.Replicas, 1) <= 1 || !slices.Contains(rec.InSync, me) {
			continue
		}
		if _, held := view.primary[name]; held {
			continue
		}
		if c, ok := view.copies[name][me]; !ok || c.LocalUID == "" || c.State != CopyInSync {
			continue // this node's copy is not made yet
		}
		switch {
		case rec.Primary == me:
			if _, err := ps.takePrimary(ctx, name, e); err != nil {
				errs = errors.Join(errs, err)
			}
		case !view.alive[rec.Primary]:
			if err := ps.promote(ctx, name, e, view.attached[name]); err != nil {
				errs = errors.Join(errs, err)
			}
		}
	}
	return errs
}

// takePrimary creates primary/<volume> for this node, the volume's primary,
// at its term, under this node's lease. It reports whether it did.
func (ps Primaries) takePrimary(ctx context.Context, volume string, e volumeEntry) (bool, error) {
	s := ps.n.session()
	if s == nil {
		return false, ErrNoSession
	}
	vk, pk, ak := ps.n.key("volumes", volume), ps.n.key("primary", volume), ps.n.key("alive", ps.n.cfg.NodeName)
	// An unknown outcome is an error: the caller reads the view again
	// (HoldPrimaryKey, the next election round) and finds the key held
	// if it was applied.
	resp, err := ps.n.commit(ctx, txnSpec{If: []clientv3.Cmp{clientv3.Compare(clientv3.ModRevision(vk), "=", e.modRev),
		clientv3.Compare(clientv3.CreateRevision(pk), "=", 0),
		clientv3.Compare(clientv3.LeaseValue(ak), "=", s.Lease())},
		Then: []clientv3.Op{clientv3.OpPut(pk, mustJSON(primaryRecord{Node: ps.n.cfg.NodeName, Term: e.rec.Term}),
			clientv3.WithLease(s.Lease()))}})
	if err != nil {
		return false, fmt.Errorf("take primary of %q: %w", volume, err)
	}
	if resp.Succeeded {
		ps.n.log.Info("primary of the volume", "volume", volume, "term", e.rec.Term)
	}
	return resp.Succeeded, nil
}

// promote makes this node, an in-sync copy, the volume's primary at term+1
// in place of the primary that is down, and takes over the volume's
// attachments (attached: their state as the old primary published it).
func (ps Primaries) promote(ctx context.Context, volume string, e volumeEntry, attached []byte) error {
	s := ps.n.session()
	if s == nil {
		return ErrNoSession
	}
	me, old := ps.n.cfg.NodeName, e.rec.Primary
	rec := e.rec
	rec.Primary, rec.Term = me, e.rec.Term+1
	rec.InSync = slices.DeleteFunc(slices.Clone(e.rec.InSync), func(s string) bool { return s == old })
	vk, pk := ps.n.key("volumes", volume), ps.n.key("primary", volume)
	ak, oak, ock := ps.n.key("alive", me), ps.n.key("alive", old), ps.n.key("copies", volume, old)
	// Whole, WasPrimary: the old primary may have applied writes it never
	// acknowledged, which no in-sync copy has. Its activity logs of its
	// term say where (it publishes them when it follows this term); this
	// node's dirty bitmaps, made with the copy out of sync from this term
	// on, say what it misses. Without the logs its resync copies it whole.
	oc := copyRecord{State: CopyDegraded, Reason: fmt.Sprintf("was primary at term %d and went down: failed over to %s at term %d",
		e.rec.Term, me, rec.Term), Whole: true, WasPrimary: e.rec.Term, UpdatedAt: time.Now().UTC()}
	cur, err := ps.n.cli.Get(ctx, ock)
	if err != nil {
		return err
	}
	if len(cur.Kvs) > 0 {
		var c copyRecord
		if json.Unmarshal(cur.Kvs[0].Value, &c) == nil {
			oc.LocalUID, oc.Term = c.LocalUID, c.Term
		}
	}
	start := time.Now()
	// An unknown outcome is an error: if the promotion applied, this node
	// holds primary/<volume> at the new term, the next election round
	// skips the volume, and HoldPrimary takes over the attachments at the
	// first open.
	resp, err := ps.n.commit(ctx, txnSpec{If: []clientv3.Cmp{clientv3.Compare(clientv3.ModRevision(vk), "=", e.modRev),
		clientv3.Compare(clientv3.CreateRevision(pk), "=", 0),
		clientv3.Compare(clientv3.CreateRevision(oak), "=", 0),
		clientv3.Compare(clientv3.LeaseValue(ak), "=", s.Lease())},
		Then: []clientv3.Op{clientv3.OpPut(vk, mustJSON(rec)), clientv3.OpPut(ock, mustJSON(oc)),
			clientv3.OpPut(pk, mustJSON(primaryRecord{Node: me, Term: rec.Term}), clientv3.WithLease(s.Lease()))}})
	if err != nil {
		return fmt.Errorf("promote to primary of %q: %w", volume, err)
	}
	if !resp.Succeeded {
		return nil // another copy won, or the record changed: the next round looks again
	}
	ps.n.failovers.Add(1)
	ps.n.log.Warn("promoted to primary: the old primary is down", "volume", volume, "old", old, "term", rec.Term,
		"inSync", rec.InSync)
	if err := ps.adopt(ctx, volume, rec.Term, attached); err != nil {
		ps.n.log.Error("take over the attachments (tried again at the next open)", "volume", volume, "err", err)
	}
	ps.n.log.Info("serving as primary", "volume", volume, "term", rec.Term, "took", time.Since(start))
	return nil
}

// adopt makes this node's copy take the volume's attachments (their state as
// published in etcd) at term, once per term.
func (ps Primaries) adopt(ctx context.Context, volume string, term uint64, state []byte) error {
	ps.n.adoptMu.Lock()
	defer ps.n.adoptMu.Unlock()
	if ps.n.adopted[volume] == term {
		return nil
	}
	ak := ps.n.key("attach", volume)
	if state == nil {
		resp, err := ps.n.cli.Get(ctx, ak)
		if err != nil {
			return err
		}
		if len(resp.Kvs) > 0 {
			state = resp.Kvs[0].Value
		}
	}
	// The old primary sealed them (secrets.go): their tokens open disks.
	plain, err := ps.n.keys.unseal(ak, state)
	if err != nil {
		return fmt.Errorf("attachments of %q: %w", volume, err)
	}
	if err := ps.n.store.AdoptAttachments(ctx, volume, plain); err != nil {
		return err
	}
	ps.n.adopted[volume] = term
	return nil
}

// Primacy is what a primary holds while it serves a volume: its term and
// the lease under which primary/<volume> is held. Requests are acknowledged
// only while LeaseHeld(Lease).
type Primacy struct {
	Term  uint64
	Lease clientv3.LeaseID
}

// Primaries is the node's part in the primary/<volume> keys and what hangs
// on them: the election of a new primary when one is gone (elect, promote),
// this node's primacy of a volume it serves (HoldPrimary, HoldPrimaryKey),
// the attachments a primary publishes and its successor adopts, the hand-over
// of a drain (HandOver), the watch of who is the primary (WatchPrimary), and
// what this node is for a volume (Role). Get it with Node.Primaries; it
// shares the node's etcd client, session and logger.
type Primaries struct{ n *Node }

// Primaries is this node's access to the primary/ keys.
func (n *Node) Primaries() Primaries { return Primaries{n} }

// HoldPrimary returns this node's primacy of volume: primary/<volume> held
// at the volume's term under this node's current lease (taken now if the
// node is the primary and the key is absent), with the volume's attachments
// taken over at that term. ErrNotPrimary when another node is the primary.
func (ps Primaries) HoldPrimary(ctx context.Context, volume string) (Primacy, error) {
	pr, err := ps.HoldPrimaryKey(ctx, volume)
	if err != nil {
		return pr, err
	}
	if err := ps.adopt(ctx, volume, pr.Term, nil); err != nil {
		return Primacy{}, fmt.Errorf("volume %q: %w: %w", volume, ErrNotReady, err)
	}
	return pr, nil
}

// PublishAttachments is the pool's attachments hook (pool.AttachmentsHook)
// on a cluster node: on the primary of a replicated volume it writes the
// volume's attachment state to attach/<volume>, as the primary holding its
// lease, before the change takes effect; anywhere else (a copy's own
// attachments for its primary, a volume of one copy) it does nothing.
func (ps Primaries) PublishAttachments(volume string, state []byte) error {
	ctx, cancel := context.WithTimeout(context.Background(), ps.n.leaseTTL())
	defer cancel()
	resp, err := ps.n.cli.Get(ctx, ps.n.key("volumes", volume))
	if err != nil {
		return fmt.Errorf("publish attachments: %w", err)
	}
	if len(resp.Kvs) == 0 {
		return nil
	}
	var rec volumeRecord
	if err := json.Unmarshal(resp.Kvs[0].Value, &rec); err != nil {
		return err
	}
	if rec.Primary != ps.n.cfg.NodeName || max(rec.Spec.Replicas, 1) <= 1 {
		return nil
	}
	pr, err := ps.HoldPrimaryKey(ctx, volume)
	if err != nil {
		return err
	}
	pk, ak := ps.n.key("primary", volume), ps.n.key("attach", volume)
	// The state holds the attachments' tokens: etcd gets it sealed.
	sealed, err := ps.n.keys.seal(ak, state)
	if err != nil {
		return fmt.Errorf("publish attachments: %w", err)
	}
	// An unknown outcome (ErrUnknownOutcome) refuses the change, which
	// then never takes effect here, though etcd may hold its state: a
	// successor adopts attachments a step ahead of the old primary's, as
	// when the old primary fails between this write and the change.
	put, err := ps.n.commit(ctx, txnSpec{
		If: []clientv3.Cmp{clientv3.Compare(clientv3.LeaseValue(pk), "=", pr.Lease),
			clientv3.Compare(clientv3.Value(pk), "=", mustJSON(primaryRecord{Node: ps.n.cfg.NodeName, Term: pr.Term}))},
		Then: []clientv3.Op{clientv3.OpPut(ak, string(sealed))}})
	if err != nil {
		return fmt.Errorf("publish attachments: %w", err)
	}
	if !put.Succeeded {
		return fmt.Errorf("publish attachments of %q: %w", volume, ErrNotPrimary)
	}
	return nil
}

// HoldPrimaryKey is HoldPrimary without taking over the attachments (the
// attachments hook runs under the volume's attachment lock).
func (ps Primaries) HoldPrimaryKey(ctx context.Context, volume string) (Primacy, error) {
	s := ps.n.session()
	if s == nil || !ps.n.up.Load() {
		return Primacy{}, fmt.Errorf("primary of %q: %w", volume, ErrNoSession)
	}
	for range 3 {
		view, err := ps.readView(ctx, volume)
		if err != nil {
			return Primacy{}, err
		}
		e, ok := view.volumes[volume]
		if !ok {
			return Primacy{}, fmt.Errorf("primary of %q: %w", volume, ErrVolumeNotFound)
		}
		if e.rec.Primary != ps.n.cfg.NodeName {
			return Primacy{}, fmt.Errorf("volume %q: primary is %s: %w", volume, e.rec.Primary, ErrNotPrimary)
		}
		p, held := view.primary[volume]
		if !held {
			if _, err := ps.takePrimary(ctx, volume, e); err != nil {
				return Primacy{}, err
			}
			continue
		}
		if p.Node != ps.n.cfg.NodeName || p.Term != e.rec.Term {
			return Primacy{}, fmt.Errorf("volume %q: primary/%s holds %s at term %d: %w", volume, volume, p.Node, p.Term, ErrNotPrimary)
		}
		if p.lease != s.Lease() {
			// Held under this node's previous lease, which has not
			// expired in etcd yet: it will, and the key with it.
			return Primacy{}, fmt.Errorf("volume %q: primary key under a lapsed lease: %w", volume, ErrNotReady)
		}
		return Primacy{Term: e.rec.Term, Lease: s.Lease()}, nil
	}
	return Primacy{}, fmt.Errorf("primary of %q: %w", volume, ErrNotReady)
}
