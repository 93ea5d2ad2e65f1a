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
			return
		}
		c := copyRecord{State: CopyInSync, UpdatedAt: time.Now().UTC()}
		if rebuild {
			c.State, c.Reason = CopyRebuilding, have.Reason
		}
		uid, err := n.store.CreateCopy(ctx, rec.Spec)
		if err != nil {
			c.State, c.Reason = CopyFailed, err.Error()
			n.log.Error("make a copy", "volume", name, "err", err)
		} else {
			c.LocalUID = uid
			n.log.Info("copy made", "volume", name, "primary", rec.Primary, "term", rec.Term)
			if rec.Primary != n.cfg.NodeName {
				if c.Token, err = n.store.AttachForPrimary(ctx, name, rec.Primary, rec.Term); err != nil {
					c.State, c.Reason = CopyFailed, err.Error()
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
