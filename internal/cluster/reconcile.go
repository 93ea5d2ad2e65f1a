package cluster

import (
	"context"
	"encoding/json"
	"slices"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// reconcile makes and deletes this node's copies as the placements in etcd
// say: it reads every volume record, then follows the changes with a watch,
// and starts over (a full read) when the watch breaks. Records are handled
// one at a time, in revision order.
func (cs Copies) reconcile(ctx context.Context) {
	prefix := cs.n.key("volumes") + "/"
	for ctx.Err() == nil {
		resp, err := cs.n.cli.Get(ctx, prefix, clientv3.WithPrefix())
		if err != nil {
			cs.n.log.Warn("read placements", "err", err)
			sleep(ctx, time.Second)
			continue
		}
		for _, kv := range resp.Kvs {
			cs.apply(ctx, kv.Key, kv.Value, kv.ModRevision)
			cs.finishRemoval(ctx, kv.Key, kv.Value)
		}
		wctx, cancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
		for wr := range cs.n.cli.Watch(wctx, prefix, clientv3.WithPrefix(), clientv3.WithRev(resp.Header.Revision+1)) {
			if err := wr.Err(); err != nil {
				cs.n.log.Warn("watch placements; reading them again", "err", err)
				break
			}
			for _, ev := range wr.Events {
				if ev.Type == clientv3.EventTypePut {
					cs.apply(ctx, ev.Kv.Key, ev.Kv.Value, ev.Kv.ModRevision)
				}
			}
		}
		cancel()
		sleep(ctx, 200*time.Millisecond)
	}
}

func sleep(ctx context.Context, d time.Duration) {
	select {
	case <-ctx.Done():
	case <-time.After(d):
	}
}

// apply brings this node's copy of one volume in line with its record (at
// mod revision modRev).
func (cs Copies) apply(ctx context.Context, key, value []byte, modRev int64) {
	var rec volumeRecord
	if json.Unmarshal(value, &rec) != nil || !slices.Contains(rec.Copies, cs.n.cfg.NodeName) {
		return
	}
	name := lastSegment(string(key))
	ck := cs.n.key("copies", name, cs.n.cfg.NodeName)
	resp, err := cs.n.cli.Get(ctx, ck)
	if err != nil {
		cs.n.log.Warn("read copy state", "volume", name, "err", err)
		return
	}
	var have copyRecord
	exists := len(resp.Kvs) > 0 && json.Unmarshal(resp.Kvs[0].Value, &have) == nil
	switch rec.State {
	case volumeActive:
		// A copy placed to replace another (ReplaceCopy) is recorded
		// rebuilding before it is made: it is made here and stays
		// rebuilding, out of sync, until its primary has copied it whole.
		rebuild := exists && have.State == CopyRebuilding && have.LocalUID == ""
		if exists && !rebuild {
			cs.followTerm(ctx, name, rec, have, resp.Kvs[0].ModRevision)
			return
		}
		// Term is recorded once the copy is made and attached for the
		// primary: a primary opens sessions only on a copy that follows
		// its term.
		c := copyRecord{State: CopyInSync, UpdatedAt: time.Now().UTC()}
		if rebuild {
			c.State, c.Reason, c.Whole = CopyRebuilding, have.Reason, have.Whole
		}
		uid, err := cs.n.store.CreateCopy(ctx, rec.Spec)
		if err != nil {
			c.State, c.Reason = CopyFailed, err.Error()
			cs.n.log.Error("make a copy", "volume", name, "err", err)
		} else {
			c.LocalUID = uid
			cs.n.log.Info("copy made", "volume", name, "primary", rec.Primary, "term", rec.Term)
			c.Term = rec.Term
			if rec.Primary != cs.n.cfg.NodeName {
				if err = cs.n.store.AttachForPrimary(ctx, name, rec.Primary, rec.Term); err != nil {
					c.State, c.Reason, c.Term = CopyFailed, err.Error(), 0
					cs.n.log.Error("attach a copy for its primary", "volume", name, "err", err)
				}
			}
		}
		cs.putCopy(ctx, ck, c)
	case volumeDeleting:
		cs.deleteCopy(ctx, name, rec, modRev, have, exists)
	}
}

func (cs Copies) putCopy(ctx context.Context, k string, c copyRecord) {
	if _, err := cs.n.cli.Put(ctx, k, mustJSON(c)); err != nil {
		cs.n.log.Warn("record copy state", "key", k, "err", err)
	}
}

// followTerm makes a copy take a new primary's term: it attaches for the
// new primary, giving that attachment the writer role (the old primary's
// writes are refused from then on), and records the attachment's token at
// the new term. The new primary waits for that before it writes an in-sync
// copy, and before it resyncs an out-of-sync one (degraded, resyncing or
// rebuilding: among them an old primary that came back, whose copy has no
// token yet).
func (cs Copies) followTerm(ctx context.Context, name string, rec volumeRecord, have copyRecord, modRev int64) {
	me := cs.n.cfg.NodeName
	inSync := slices.Contains(rec.InSync, me) && have.State == CopyInSync
	behind := !slices.Contains(rec.InSync, me) &&
		(have.State == CopyDegraded || have.State == CopyResyncing || have.State == CopyRebuilding)
	if rec.Primary == me || (!inSync && !behind) || have.LocalUID == "" || copyTerm(have) >= rec.Term {
		return
	}
	if err := cs.n.store.AttachForPrimary(ctx, name, rec.Primary, rec.Term); err != nil {
		cs.n.log.Error("attach a copy for its new primary", "volume", name, "primary", rec.Primary, "term", rec.Term, "err", err)
		return
	}
	have.Term, have.UpdatedAt = rec.Term, time.Now().UTC()
	switch {
	case behind && have.WasPrimary != 0 && have.WasPrimary+1 == rec.Term:
		// The old primary, back under the primary promoted in its place:
		// what it may hold that the new primary lacks is in its activity
		// logs of its term, read now that the attachment for the new
		// primary fenced every older writer here.
		have.Activity = cs.n.store.ActivityOf(name, have.LocalUID, have.WasPrimary)
	case behind:
		// What the copy missed under the older terms' primaries is in
		// their dirty bitmaps, which the new primary does not have: its
		// resync copies the copy whole.
		have.Whole, have.WasPrimary, have.Activity = true, 0, nil
	}
	ck := cs.n.key("copies", name, me)
	// An unknown outcome (ErrUnknownOutcome) is logged like any error:
	// if it did not apply, the copy record still names an older term and
	// reconcile's next pass attaches again (which changes nothing) and
	// records it; if it applied, that pass finds the term recorded.
	resp, err := cs.n.commit(ctx, txnSpec{If: []clientv3.Cmp{clientv3.Compare(clientv3.ModRevision(ck), "=", modRev)},
		Then: []clientv3.Op{clientv3.OpPut(ck, mustJSON(have))}})
	switch {
	case err != nil:
		cs.n.log.Warn("record copy state", "volume", name, "err", err)
	case !resp.Succeeded:
		cs.n.log.Info("copy state changed meanwhile: not following the new term", "volume", name, "term", rec.Term)
	default:
		cs.n.log.Info("copy follows the new primary; older terms are fenced", "volume", name, "primary", rec.Primary,
			"term", rec.Term)
	}
}

// copyTerm is the term a copy follows (0: none yet).
func copyTerm(c copyRecord) uint64 { return c.Term }

// finishRemoval deletes this node's copy of a volume that a drain took out
// of the placement and that is still here (the drain job stopped, or the
// node restarted, before it deleted it): reconcile calls it on each full
// read of the placements. A copy still attached is left, and logged.
func (cs Copies) finishRemoval(ctx context.Context, key, value []byte) {
	var rec volumeRecord
	me := cs.n.cfg.NodeName
	if json.Unmarshal(value, &rec) != nil || !slices.Contains(rec.Removing, me) || slices.Contains(rec.Copies, me) {
		return
	}
	name := lastSegment(string(key))
	uid, err := cs.n.Volumes().RemovingUID(ctx, name)
	if err != nil {
		return
	}
	if uid != "" {
		if err := cs.n.store.DeleteCopy(ctx, name, uid); err != nil {
			cs.n.log.Warn("delete a copy a drain removed", "volume", name, "err", err)
			return
		}
	}
	if err := cs.n.Volumes().RemovedCopy(ctx, name); err != nil {
		cs.n.log.Warn("record a removed copy", "volume", name, "err", err)
	}
}
