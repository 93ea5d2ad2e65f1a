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
func (n *Node) reconcile(ctx context.Context) {
	prefix := n.key("volumes") + "/"
	for ctx.Err() == nil {
		resp, err := n.cli.Get(ctx, prefix, clientv3.WithPrefix())
		if err != nil {
			n.log.Warn("read placements", "err", err)
			sleep(ctx, time.Second)
			continue
		}
		for _, kv := range resp.Kvs {
			n.apply(ctx, kv.Key, kv.Value)
			n.finishRemoval(ctx, kv.Key, kv.Value)
		}
		wctx, cancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
		for wr := range n.cli.Watch(wctx, prefix, clientv3.WithPrefix(), clientv3.WithRev(resp.Header.Revision+1)) {
			if err := wr.Err(); err != nil {
				n.log.Warn("watch placements; reading them again", "err", err)
				break
			}
			for _, ev := range wr.Events {
				if ev.Type == clientv3.EventTypePut {
					n.apply(ctx, ev.Kv.Key, ev.Kv.Value)
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

// apply brings this node's copy of one volume in line with its record.
func (n *Node) apply(ctx context.Context, key, value []byte) {
	var rec volumeRecord
	if json.Unmarshal(value, &rec) != nil || !slices.Contains(rec.Copies, n.cfg.NodeName) {
		return
	}
	name := lastSegment(string(key))
	ck := n.key("copies", name, n.cfg.NodeName)
	resp, err := n.cli.Get(ctx, ck)
	if err != nil {
		n.log.Warn("read copy state", "volume", name, "err", err)
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
			n.followTerm(ctx, name, rec, have, resp.Kvs[0].ModRevision)
			return
		}
		// Term is recorded once the copy is made and attached for the
		// primary: a primary opens sessions only on a copy that follows
		// its term.
		c := copyRecord{State: CopyInSync, UpdatedAt: time.Now().UTC()}
		if rebuild {
			c.State, c.Reason, c.Whole = CopyRebuilding, have.Reason, have.Whole
		}
		uid, err := n.store.CreateCopy(ctx, rec.Spec)
		if err != nil {
			c.State, c.Reason = CopyFailed, err.Error()
			n.log.Error("make a copy", "volume", name, "err", err)
		} else {
			c.LocalUID = uid
			n.log.Info("copy made", "volume", name, "primary", rec.Primary, "term", rec.Term)
			c.Term = rec.Term
			if rec.Primary != n.cfg.NodeName {
				if err = n.store.AttachForPrimary(ctx, name, rec.Primary, rec.Term); err != nil {
					c.State, c.Reason, c.Term = CopyFailed, err.Error(), 0
					n.log.Error("attach a copy for its primary", "volume", name, "err", err)
				}
			}
		}
		n.putCopy(ctx, ck, c)
	case volumeDeleting:
		if !exists {
			return
		}
		if have.LocalUID != "" {
			if err := n.store.DeleteCopy(ctx, name, have.LocalUID); err != nil {
				n.log.Error("delete a copy", "volume", name, "err", err)
				have.State, have.Reason, have.UpdatedAt = copyDeleteFailed, err.Error(), time.Now().UTC()
				n.putCopy(ctx, ck, have)
				return
			}
			n.log.Info("copy deleted", "volume", name)
		}
		if _, err := n.cli.Delete(ctx, ck); err != nil {
			n.log.Warn("remove copy state", "volume", name, "err", err)
		}
	}
}

func (n *Node) putCopy(ctx context.Context, k string, c copyRecord) {
	if _, err := n.cli.Put(ctx, k, mustJSON(c)); err != nil {
		n.log.Warn("record copy state", "key", k, "err", err)
	}
}

// followTerm makes a copy take a new primary's term: it attaches for the
// new primary, giving that attachment the writer role (the old primary's
// writes are refused from then on), and records the attachment's token at
// the new term. The new primary waits for that before it writes an in-sync
// copy, and before it resyncs an out-of-sync one (degraded, resyncing or
// rebuilding: among them an old primary that came back, whose copy has no
// token yet).
func (n *Node) followTerm(ctx context.Context, name string, rec volumeRecord, have copyRecord, modRev int64) {
	me := n.cfg.NodeName
	inSync := slices.Contains(rec.InSync, me) && have.State == CopyInSync
	behind := !slices.Contains(rec.InSync, me) &&
		(have.State == CopyDegraded || have.State == CopyResyncing || have.State == CopyRebuilding)
	if rec.Primary == me || (!inSync && !behind) || have.LocalUID == "" || copyTerm(have) >= rec.Term {
		return
	}
	if err := n.store.AttachForPrimary(ctx, name, rec.Primary, rec.Term); err != nil {
		n.log.Error("attach a copy for its new primary", "volume", name, "primary", rec.Primary, "term", rec.Term, "err", err)
		return
	}
	have.Term, have.UpdatedAt = rec.Term, time.Now().UTC()
	if behind {
		// What the copy missed under the older terms' primaries is in
		// their dirty bitmaps, which the new primary does not have: its
		// resync copies the copy whole.
		have.Whole = true
	}
	ck := n.key("copies", name, me)
	resp, err := n.cli.Txn(ctx).If(clientv3.Compare(clientv3.ModRevision(ck), "=", modRev)).
		Then(clientv3.OpPut(ck, mustJSON(have))).Commit()
	switch {
	case err != nil:
		n.log.Warn("record copy state", "volume", name, "err", err)
	case !resp.Succeeded:
		n.log.Info("copy state changed meanwhile: not following the new term", "volume", name, "term", rec.Term)
	default:
		n.log.Info("copy follows the new primary; older terms are fenced", "volume", name, "primary", rec.Primary,
			"term", rec.Term)
	}
}

// copyTerm is the term a copy follows (0: none yet).
func copyTerm(c copyRecord) uint64 { return c.Term }
