package cluster

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// settleHandOver finds out what became of a hand-over of volume from me to
// to at term whose commit has an unknown outcome (HandOver), reading etcd
// again until it knows or ctx ends. The hand-over compared the volume
// record's revision with modRev, so:
//
//   - the record names to at term+1: it was applied (nil);
//   - the record names another primary or term, or is gone: the volume
//     moved on some other way; this node is not its primary (ErrNotPrimary);
//   - the record names me at term, at another revision: it was not
//     applied, and never will be (its compare fails for good);
//   - the record is as it was (revision modRev): the hand-over may still
//     be on its way in etcd's log; the record is written again as it is,
//     comparing modRev, so that the hand-over's compare can no longer hold,
//     and read again.
//
// A read or write that fails is tried again after a pause: only ctx ends
// the wait, with ErrUnknownOutcome.
func (ps Primaries) settleHandOver(ctx context.Context, volume, me, to string, term uint64, modRev int64) error {
	vk := ps.n.key("volumes", volume)
	pause := 50 * time.Millisecond
	for {
		resp, err := ps.n.cli.Get(ctx, vk)
		if err == nil {
			if len(resp.Kvs) == 0 {
				return fmt.Errorf("the volume is gone meanwhile: %w", ErrNotPrimary)
			}
			kv := resp.Kvs[0]
			var rec volumeRecord
			if err := json.Unmarshal(kv.Value, &rec); err != nil {
				return fmt.Errorf("etcd key %s: %v: %w", vk, err, ErrUnknownOutcome)
			}
			switch {
			case rec.Primary == to && rec.Term == term+1:
				return nil
			case rec.Primary != me || rec.Term != term:
				return fmt.Errorf("the volume moved to %s at term %d meanwhile: %w", rec.Primary, rec.Term, ErrNotPrimary)
			case kv.ModRevision != modRev:
				return fmt.Errorf("not handed over: the volume record changed before the hand-over applied; "+
					"this node is still the primary at term %d", term)
			}
			put, perr := ps.n.commit(ctx, txnSpec{If: []clientv3.Cmp{clientv3.Compare(clientv3.ModRevision(vk), "=", modRev)},
				Then: []clientv3.Op{clientv3.OpPut(vk, string(kv.Value))}})
			if perr == nil && put.Succeeded {
				return fmt.Errorf("not handed over: the volume record was written again before the hand-over applied; "+
					"this node is still the primary at term %d", term)
			}
			err = perr // nil when the record changed meanwhile: read it again
		}
		if err != nil {
			ps.n.log.Warn("hand-over of unknown outcome: etcd did not answer; trying again", "volume", volume, "err", err)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("etcd did not tell in time whether the hand-over to %s applied: %w: %w", to, ctx.Err(),
				ErrUnknownOutcome)
		case <-time.After(pause):
		}
		pause = min(2*pause, time.Second)
	}
}

// HandOver makes another in-sync copy of volume its primary, as this node,
// the primary at term holding its lease: one Txn that compares the volume
// record's revision, primary/<volume> held by this node at term under its
// lease, the new primary's copy record and alive key, and then writes
// term+1 with the new primary, takes this node's copy out of the placement
// (recorded CopyRemoving: this node deletes it) and deletes
// primary/<volume>, which the new primary takes within an election round.
// The new primary is an in-sync copy that has followed term (its token is
// of term), up; of several, the first by name. The caller has stopped every
// change of the volume here (the disks' Sets frozen) and retires them when
// HandOver returns nil, so no change is applied here after the new term.
//
// When the commit's outcome is unknown, HandOver reads etcd until it knows
// (settleHandOver): nil when the hand-over was applied; ErrNotPrimary when
// the volume moved on otherwise; an error wrapping neither ErrNotPrimary
// nor ErrUnknownOutcome only when this node is still the primary at term
// and the hand-over can no longer be applied; ErrUnknownOutcome when ctx
// ended first. On ErrNotPrimary and ErrUnknownOutcome the caller must act
// as on nil: this node may no longer be the primary.
func (ps Primaries) HandOver(ctx context.Context, volume string, term uint64) (string, uint64, error) {
	s := ps.n.session()
	if s == nil || !ps.n.up.Load() {
		return "", 0, fmt.Errorf("hand over %q: %w", volume, ErrNoSession)
	}
	me := ps.n.cfg.NodeName
	view, err := ps.readView(ctx, volume)
	if err != nil {
		return "", 0, fmt.Errorf("hand over %q: %w", volume, err)
	}
	e, ok := view.volumes[volume]
	if !ok {
		return "", 0, fmt.Errorf("hand over %q: %w", volume, ErrVolumeNotFound)
	}
	rec := e.rec
	if rec.Primary != me || rec.Term != term || rec.State != volumeActive {
		return "", 0, fmt.Errorf("hand over %q: this node is not its primary at term %d (primary %s, term %d): %w",
			volume, term, rec.Primary, rec.Term, ErrNotPrimary)
	}
	var to string
	for _, c := range slices.Sorted(slices.Values(rec.InSync)) {
		cr, ok := view.copies[volume][c]
		if c != me && ok && cr.State == CopyInSync && cr.LocalUID != "" && copyTerm(cr) == term && view.alive[c] {
			to = c
			break
		}
	}
	if to == "" {
		return "", 0, fmt.Errorf("hand over %q: no other copy is in sync at term %d and up (in sync: %s): %w",
			volume, term, strings.Join(rec.InSync, ", "), ErrDegraded)
	}
	mine := view.copies[volume][me]
	next := rec
	next.Primary, next.Term = to, term+1
	next.InSync = slices.DeleteFunc(slices.Clone(rec.InSync), func(c string) bool { return c == me })
	next.Copies = slices.DeleteFunc(slices.Clone(rec.Copies), func(c string) bool { return c == me })
	if !slices.Contains(next.Removing, me) {
		next.Removing = append(slices.Clone(rec.Removing), me)
	}
	rc := copyRecord{State: CopyRemoving, Reason: fmt.Sprintf("drained: handed over to %s at term %d", to, next.Term),
		LocalUID: mine.LocalUID, UpdatedAt: time.Now().UTC()}
	vk, pk, ck := ps.n.key("volumes", volume), ps.n.key("primary", volume), ps.n.key("copies", volume, me)
	tk, tak := ps.n.key("copies", volume, to), ps.n.key("alive", to)
	tresp, err := ps.n.cli.Get(ctx, tk)
	if err != nil || len(tresp.Kvs) == 0 {
		return "", 0, fmt.Errorf("hand over %q: read the copy on %s: %v", volume, to, err)
	}
	resp, err := ps.n.commit(ctx, txnSpec{If: []clientv3.Cmp{clientv3.Compare(clientv3.ModRevision(vk), "=", e.modRev),
		clientv3.Compare(clientv3.LeaseValue(pk), "=", s.Lease()),
		clientv3.Compare(clientv3.Value(pk), "=", mustJSON(primaryRecord{Node: me, Term: term})),
		clientv3.Compare(clientv3.ModRevision(tk), "=", tresp.Kvs[0].ModRevision),
		clientv3.Compare(clientv3.CreateRevision(tak), ">", 0)},
		Then: []clientv3.Op{clientv3.OpPut(vk, mustJSON(next)), clientv3.OpDelete(pk), clientv3.OpPut(ck, mustJSON(rc))}})
	if errors.Is(err, ErrUnknownOutcome) {
		ps.n.log.Warn("hand-over: its transaction has an unknown outcome; reading etcd until it is known", "volume", volume,
			"to", to, "term", next.Term, "err", err)
		err = ps.settleHandOver(ctx, volume, me, to, term, e.modRev)
		if err == nil {
			ps.n.log.Warn("primary handed over: this node is drained", "volume", volume, "to", to, "term", next.Term)
			return to, next.Term, nil
		}
		return "", 0, fmt.Errorf("hand over %q to %s: %w", volume, to, err)
	}
	if err != nil {
		return "", 0, fmt.Errorf("hand over %q to %s: %w", volume, to, err)
	}
	if !resp.Succeeded {
		return "", 0, fmt.Errorf("hand over %q to %s: the volume, its primary key or the copy changed meanwhile: %w",
			volume, to, ErrNotReady)
	}
	ps.n.log.Warn("primary handed over: this node is drained", "volume", volume, "to", to, "term", next.Term)
	return to, next.Term, nil
}
