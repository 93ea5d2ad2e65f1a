package cluster

import (
	"context"
	"encoding/json"
	"fmt"
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
func (n *Node) settleHandOver(ctx context.Context, volume, me, to string, term uint64, modRev int64) error {
	vk := n.key("volumes", volume)
	pause := 50 * time.Millisecond
	for {
		resp, err := n.cli.Get(ctx, vk)
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
			put, perr := n.commit(ctx, txnSpec{If: []clientv3.Cmp{clientv3.Compare(clientv3.ModRevision(vk), "=", modRev)},
				Then: []clientv3.Op{clientv3.OpPut(vk, string(kv.Value))}})
			if perr == nil && put.Succeeded {
				return fmt.Errorf("not handed over: the volume record was written again before the hand-over applied; "+
					"this node is still the primary at term %d", term)
			}
			err = perr // nil when the record changed meanwhile: read it again
		}
		if err != nil {
			n.log.Warn("hand-over of unknown outcome: etcd did not answer; trying again", "volume", volume, "err", err)
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
