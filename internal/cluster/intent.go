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

// Intents (docs/cluster.md, "Intents: a change at the cut that outlives its
// primary"). Before a primary changes its own copy at the cut (a snapshot,
// a rollback, a disk change, clones), it records the change in
// intents/<volume>, as the primary at its term holding its lease; it
// removes the record when every in-sync copy applied the change or was
// recorded diverged. A record left behind (the primary crashed, or lost
// etcd before it could record a copy's state) is settled by the volume's
// primary of the moment (the promoted copy, or the old primary itself when
// it comes back and wins) before the volume serves I/O at its term: it is
// finished or undone everywhere, per kind (Settle).

// Intent is intents/<volume>: one change at the cut of the volume, at most
// one at a time.
type Intent struct {
	ID      string `json:"id"`
	Primary string `json:"primary"`
	Term    uint64 `json:"term"`
	// Ops is the change as the copies are sent it: one op, or one OpClone
	// per clone of a request.
	Ops []Op `json:"ops"`
	// Nodes are the copies in sync at the cut, the primary's excluded.
	Nodes []string `json:"nodes"`
	// Pending, once the intent was settled by undoing it: the nodes that
	// still hold a part of it (down when it was undone). The record stays
	// until each has removed its part.
	Pending   []string  `json:"pending,omitempty"`
	Settled   bool      `json:"settled,omitempty"`
	CreatedAt time.Time `json:"createdAt"`
	// rev is the record's mod revision, from etcd.
	rev int64
}

// Settlement is what a primary does with an intent it finds left behind.
type Settlement int

const (
	// SettleFinish applies the change on the primary's copy (again: each
	// op answers the same when applied twice) and on every in-sync copy; a
	// copy that fails it is recorded diverged, and its resync makes it the
	// primary's. For what cannot be taken back (a rollback, a grow, a disk
	// removed) and a disk added: the changes of the volume's disks.
	SettleFinish Settlement = iota
	// SettleUndo deletes what the change made on every node that holds a
	// part of it: clones not placed in etcd (a clone placed is whole, and
	// kept), a snapshot (by its UID). Nodes down are asked again when they
	// are back: a resync would not carry a snapshot to them.
	SettleUndo
)

func (s Settlement) String() string {
	if s == SettleUndo {
		return "undo"
	}
	return "finish"
}

// SettleOf says how an intent left behind is settled: clones and
// snapshots are undone, changes of the disks finished.
func SettleOf(in Intent) Settlement {
	for _, op := range in.Ops {
		if op.Kind == OpClone || op.Kind == OpSnapshot {
			return SettleUndo
		}
	}
	return SettleFinish
}

// NeedsSettling says whether an intent found for a volume must be settled
// before the volume serves I/O: it was not begun by this process (ownHere:
// this process's own code path ends it, and may have let I/O go on after
// it), and it was not settled already (an undone intent waiting only for
// its pending nodes leaves the volume's data as it is).
func NeedsSettling(in Intent, ownHere bool) bool {
	return !in.Settled && !ownHere
}

// UndoOps lists the operations that undo an intent settled by undoing:
// an OpUnclone for each clone that is not placed (placed maps a clone name
// to the cluster UID of the volume of that name in etcd; a name placed with
// another UID is another volume, so its clone was never placed either),
// and an OpDeleteSnapshot of a snapshot by its UID.
func UndoOps(in Intent, placed map[string]string) []Op {
	var out []Op
	for _, op := range in.Ops {
		switch {
		case op.Kind == OpClone && placed[op.Name] != op.UID:
			out = append(out, Op{Kind: OpUnclone, Name: op.Name, UID: op.UID})
		case op.Kind == OpSnapshot:
			out = append(out, Op{Kind: OpDeleteSnapshot, Name: op.Name, UID: op.UID})
		}
	}
	return out
}

// HoldersOf lists the nodes that may hold a part of an undone intent, this
// node excluded: the primary that began it and the copies it sent it to.
func HoldersOf(in Intent, me string) []string {
	var out []string
	for _, n := range append([]string{in.Primary}, in.Nodes...) {
		if n != me && !slices.Contains(out, n) {
			out = append(out, n)
		}
	}
	slices.Sort(out)
	return out
}

// StillPending lists the nodes of pending that still hold their part after
// an undo round: those that did not answer it (answered: nil for done), and
// that are still in the volume's placement (placement: copies and
// removing). A node out of the placement is dropped: it holds no copy of
// the volume the cluster knows of (docs/cluster.md says what it keeps).
func StillPending(pending []string, answered map[string]error, placement []string) []string {
	var out []string
	for _, n := range pending {
		if err, ok := answered[n]; ok && err == nil {
			continue
		}
		if slices.Contains(placement, n) {
			out = append(out, n)
		}
	}
	return out
}

// ErrIntentPending: an earlier change at the cut of the volume is being
// settled; try again.
var ErrIntentPending = errors.New("an earlier change at the cut of the volume is being settled")

// ErrIntentLeft: an intent may be recorded (a Txn of unknown outcome that
// could not be learnt, or one recorded while this node stopped being the
// primary), and is left to the next primary to settle. Its caller must let
// no write follow the cut on this node at this term.
var ErrIntentLeft = errors.New("the intent may be recorded: it is left to the next primary to settle")

// NewIntentID is a new intent's ID (BeginIntentAs).
func NewIntentID() string { return newID() }

// BeginIntent is BeginIntentAs with a new ID.
func (o Ops) BeginIntent(ctx context.Context, volume string, term uint64, ops []Op, nodes []string) (Intent, error) {
	return o.BeginIntentAs(ctx, volume, term, newID(), ops, nodes)
}

// BeginIntentAs records the intent id as the volume's, as its primary at
// term: one Txn that needs primary/<volume> held by this node at that term
// under its current lease, and no intent recorded. It returns the intent as
// recorded (EndIntent takes it). The caller names id before, so that it
// owns the intent while it is being recorded (a settlement on another
// goroutine must not take it for an orphan). An unknown outcome is learnt,
// for up to twice the lease TTL whatever ctx does; one that cannot be, and
// an intent found recorded while this node is no longer the primary, are
// ErrIntentLeft.
func (o Ops) BeginIntentAs(ctx context.Context, volume string, term uint64, id string, ops []Op, nodes []string) (Intent, error) {
	s := o.n.session()
	if s == nil || !o.n.up.Load() {
		return Intent{}, fmt.Errorf("record the intent on %q: %w", volume, ErrNoSession)
	}
	me := o.n.cfg.NodeName
	in := Intent{ID: id, Primary: me, Term: term, Nodes: slices.Clone(nodes), CreatedAt: time.Now().UTC()}
	for _, op := range ops {
		op.Primary, op.Term = me, term
		in.Ops = append(in.Ops, op)
	}
	pk, ik := o.n.key("primary", volume), o.n.key("intents", volume)
	spec := txnSpec{If: o.primaryHeld(pk, term, s.Lease()),
		Then: []clientv3.Op{clientv3.OpTxn([]clientv3.Cmp{clientv3.Compare(clientv3.CreateRevision(ik), "=", 0)},
			[]clientv3.Op{clientv3.OpPut(ik, mustJSON(in))}, []clientv3.Op{clientv3.OpGet(ik)})},
		Else: []clientv3.Op{clientv3.OpGet(ik)}}
	// An unknown outcome is settled here, never left: the same Txn again
	// (a write, so etcd orders it after the first, which has then been
	// applied or dropped for good) either records the intent now or finds
	// it recorded, by its ID, by the first. Left unknown, an intent
	// recorded late would be finished by a later settle after writes had
	// followed the cut (a rollback undoing them).
	resp, err := o.n.commit(ctx, spec)
	tried := errors.Is(err, ErrUnknownOutcome) // the intent may be recorded from here on
	if tried {
		// Only an answer tells: a later try that fails, however it
		// fails, says nothing of the first.
		lctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*o.n.leaseTTL())
		defer cancel()
		for err != nil && lctx.Err() == nil {
			o.n.log.Warn("recording an intent: outcome unknown; trying again to learn it", "volume", volume, "intent", in.ID,
				"err", err)
			sleep(lctx, 100*time.Millisecond)
			resp, err = o.n.commit(lctx, spec)
		}
		if err != nil {
			return Intent{}, fmt.Errorf("record the intent on %q: %w: %w", volume, ErrIntentLeft, err)
		}
	}
	if err != nil {
		return Intent{}, fmt.Errorf("record the intent on %q: %w", volume, err)
	}
	if !resp.Succeeded {
		if kvs := resp.Responses[0].GetResponseRange().Kvs; tried && len(kvs) > 0 {
			var have Intent
			if json.Unmarshal(kvs[0].Value, &have) == nil && have.ID == in.ID {
				return Intent{}, fmt.Errorf("record the intent on %q: recorded, and this node is no longer the primary at term %d: %w: %w",
					volume, term, ErrIntentLeft, ErrNotPrimary)
			}
		}
		return Intent{}, fmt.Errorf("record the intent on %q: this node is not the primary at term %d under its lease: %w",
			volume, term, ErrNotPrimary)
	}
	inner := resp.Responses[0].GetResponseTxn()
	if !inner.Succeeded {
		var have Intent
		kvs := inner.Responses[0].GetResponseRange().Kvs
		if len(kvs) > 0 {
			_ = json.Unmarshal(kvs[0].Value, &have)
		}
		if have.ID == in.ID {
			// Recorded by a try whose answer was lost.
			in.rev = kvs[0].ModRevision
			return in, nil
		}
		return Intent{}, fmt.Errorf("volume %q: intent %s (%s, by %s at term %d) is not settled yet: %w", volume,
			have.ID, intentKinds(have), have.Primary, have.Term, ErrIntentPending)
	}
	in.rev = resp.Header.Revision // the Put's mod revision
	return in, nil
}

// primaryHeld are the compares that hold while this node is the volume's
// primary at term under lease.
func (o Ops) primaryHeld(pk string, term uint64, lease clientv3.LeaseID) []clientv3.Cmp {
	return []clientv3.Cmp{clientv3.Compare(clientv3.LeaseValue(pk), "=", lease),
		clientv3.Compare(clientv3.Value(pk), "=", mustJSON(primaryRecord{Node: o.n.cfg.NodeName, Term: term}))}
}

func intentKinds(in Intent) string {
	if len(in.Ops) == 0 {
		return "nothing"
	}
	s := in.Ops[0].Kind + " " + in.Ops[0].Name
	if len(in.Ops) > 1 {
		s += fmt.Sprintf(" and %d more", len(in.Ops)-1)
	}
	return s
}

// EndIntent removes in, the change done (every in-sync copy applied it or
// was recorded diverged), as the primary at term holding its lease. When it
// fails the record stays and the next primary finishes the change again,
// which changes nothing.
func (o Ops) EndIntent(ctx context.Context, volume string, term uint64, in Intent) error {
	return o.SettledIntent(ctx, volume, term, in, nil)
}

// SettledIntent records the outcome of settling in, as the primary at term
// holding its lease: the record goes when pending is empty; otherwise it
// stays, settled, with the nodes that still hold a part of it.
func (o Ops) SettledIntent(ctx context.Context, volume string, term uint64, in Intent, pending []string) error {
	s := o.n.session()
	if s == nil || !o.n.up.Load() {
		return fmt.Errorf("settle the intent on %q: %w", volume, ErrNoSession)
	}
	ik := o.n.key("intents", volume)
	op := clientv3.OpDelete(ik)
	if len(pending) > 0 {
		in.Pending, in.Settled = slices.Clone(pending), true
		op = clientv3.OpPut(ik, mustJSON(in))
	}
	cmps := append(o.primaryHeld(o.n.key("primary", volume), term, s.Lease()),
		clientv3.Compare(clientv3.ModRevision(ik), "=", in.rev))
	resp, err := o.n.commit(ctx, txnSpec{If: cmps, Then: []clientv3.Op{op}})
	if err != nil {
		return fmt.Errorf("settle the intent on %q: %w", volume, err)
	}
	if !resp.Succeeded {
		return fmt.Errorf("settle the intent on %q: the intent changed, or this node is not the primary at term %d "+
			"under its lease: %w", volume, term, ErrNotPrimary)
	}
	return nil
}

// VolumeIntent reads the volume's intent, if any.
func (o Ops) VolumeIntent(ctx context.Context, volume string) (Intent, bool, error) {
	resp, err := o.n.cli.Get(ctx, o.n.key("intents", volume))
	if err != nil {
		return Intent{}, false, fmt.Errorf("read the intent on %q: %w", volume, err)
	}
	if len(resp.Kvs) == 0 {
		return Intent{}, false, nil
	}
	var in Intent
	if err := json.Unmarshal(resp.Kvs[0].Value, &in); err != nil {
		return Intent{}, false, fmt.Errorf("etcd key %s: %w", resp.Kvs[0].Key, err)
	}
	in.rev = resp.Kvs[0].ModRevision
	return in, true, nil
}

// Intents lists the recorded intents by volume.
func (o Ops) Intents(ctx context.Context) (map[string]Intent, error) {
	resp, err := o.n.cli.Get(ctx, o.n.key("intents")+"/", clientv3.WithPrefix())
	if err != nil {
		return nil, fmt.Errorf("read the intents: %w", err)
	}
	out := map[string]Intent{}
	for _, kv := range resp.Kvs {
		var in Intent
		if json.Unmarshal(kv.Value, &in) == nil {
			in.rev = kv.ModRevision
			out[lastSegment(string(kv.Key))] = in
		}
	}
	return out, nil
}

// UndoClone deletes this node's part of clone op (OpClone of an intent on
// volume) when the clone is not placed: as applyUnclone.
func (o Ops) UndoClone(ctx context.Context, volume string, op Op) error {
	return o.applyUnclone(ctx, volume, op)
}
