package cluster

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// Stale copies (docs/cluster.md, "Stale copies"): a node that was gone while
// its copy of a volume was rebuilt elsewhere (ReplaceCopy) still holds that
// copy when it comes back, out of the placement and out of date. The node
// deletes it, at start and then every staleInterval, when etcd says so
// beyond doubt; anything it cannot prove stale it leaves, and logs.

// LocalCopy is a volume in this node's pool, as the stale-copy check sees it.
type LocalCopy struct {
	Name string
	UID  string
	// Replicas is the manifest's: above 1 only for a copy a cluster made
	// (CreateCopy); a volume made on a single node, before the node
	// joined, has 1.
	Replicas int
	Disks    []string
	// Allocated is the bytes its disks hold.
	Allocated int64
	// InUse names who has it attached or open (clients, or a primary's
	// replication connection), "" when nobody.
	InUse string
}

// staleInterval is how often a node looks for stale copies after start.
const staleInterval = 10 * time.Second

// staleVerdict is what the stale-copy check decided for one local volume.
type staleVerdict struct {
	Delete bool
	// Retry: it may be deleted later (in use, or etcd did not answer);
	// otherwise it is left alone for as long as its record says so.
	Retry  bool
	Reason string
}

// staleCopy decides whether this node (me) deletes its local volume lc.
// rec is the volume's record in etcd (nil: there is none), readErr the
// error of reading or decoding it, copies the volume's copy records by node.
// It deletes only a cluster-made copy (Replicas above 1) of a volume whose
// record exists, is active, and neither places it here nor names this node
// the primary or a drain's removal (finishRemoval does that one), while
// another node's copy is in sync (in the record's in-sync set and in its own
// copy record), and no client has it attached or open.
func staleCopy(me string, lc LocalCopy, rec *volumeRecord, readErr error, copies map[string]copyRecord) staleVerdict {
	keep := func(retry bool, why string, a ...any) staleVerdict {
		return staleVerdict{Retry: retry, Reason: fmt.Sprintf(why, a...)}
	}
	switch {
	case readErr != nil:
		return keep(true, "its record could not be read: %v", readErr)
	case rec == nil:
		return keep(false, "not in etcd: this node's alone")
	case lc.UID == "":
		return keep(false, "quarantined or without a UID")
	case lc.Replicas <= 1:
		return keep(false, "made with one copy, not by the cluster as a copy")
	case rec.State != volumeActive:
		return keep(false, "the volume is %s", rec.State)
	case rec.Primary == me:
		return keep(false, "this node is the recorded primary (term %d)", rec.Term)
	case slices.Contains(rec.Copies, me):
		return keep(false, "placed here")
	case slices.Contains(rec.Removing, me):
		return keep(false, "a drain is removing it")
	}
	var inSync []string
	for _, c := range rec.InSync {
		if c != me && slices.Contains(rec.Copies, c) && copies[c].State == CopyInSync {
			inSync = append(inSync, c)
		}
	}
	if len(inSync) == 0 {
		return keep(true, "no other copy is in sync (copies %s, in sync %s)", strings.Join(rec.Copies, ","),
			strings.Join(rec.InSync, ","))
	}
	if lc.InUse != "" {
		return keep(true, "in use: %s", lc.InUse)
	}
	return staleVerdict{Delete: true, Reason: fmt.Sprintf("placed on %s, in sync on %s, primary %s at term %d",
		strings.Join(rec.Copies, ","), strings.Join(inSync, ","), rec.Primary, rec.Term)}
}

// collectStale runs the stale-copy check at start and every staleInterval.
func (cs Copies) collectStale(ctx context.Context) {
	logged := map[string]string{} // the reason last logged, by volume
	for ctx.Err() == nil {
		cs.collectStaleOnce(ctx, logged)
		sleep(ctx, staleInterval)
	}
}

// collectStaleOnce checks every local volume once; a verdict is logged when
// it changed since the last check of that volume.
func (cs Copies) collectStaleOnce(ctx context.Context, logged map[string]string) {
	me := cs.n.cfg.NodeName
	here := map[string]bool{}
	for _, lc := range cs.n.store.LocalCopies() {
		here[lc.Name] = true
		rec, copies, rev, err := cs.readStale(ctx, lc.Name)
		v := staleCopy(me, lc, rec, err, copies)
		if !v.Delete {
			if logged[lc.Name] != v.Reason {
				logged[lc.Name] = v.Reason
				// Info for what a reader may wonder about: a volume etcd
				// does not know, or one left for now; the copies placed
				// here are the common case.
				level := slog.LevelDebug
				if v.Retry || rec == nil {
					level = slog.LevelInfo
				}
				cs.n.log.Log(ctx, level, "local volume kept", "volume", lc.Name, "uid", lc.UID, "why", v.Reason)
			}
			continue
		}
		if err := cs.n.store.DeleteCopy(ctx, lc.Name, lc.UID); err != nil {
			cs.n.log.Warn("delete a stale copy; tried again later", "volume", lc.Name, "uid", lc.UID, "err", err)
			continue
		}
		delete(logged, lc.Name)
		delete(here, lc.Name)
		cs.n.log.Warn("stale copy deleted: its volume was placed on other nodes while this node was gone",
			"volume", lc.Name, "uid", lc.UID, "disks", lc.Disks, "allocated", lc.Allocated, "why", v.Reason)
		cs.n.staleDeleted.Add(1)
		// A copy key of this node left over (none after ReplaceCopy) goes
		// too, if the record did not change meanwhile.
		if _, ok := copies[me]; ok {
			ck, vk := cs.n.key("copies", lc.Name, me), cs.n.key("volumes", lc.Name)
			// A delete: an unknown outcome (ErrUnknownOutcome) is logged;
			// a key left is left as any failure leaves it.
			if _, err := cs.n.commit(ctx, txnSpec{If: []clientv3.Cmp{clientv3.Compare(clientv3.ModRevision(vk), "=", rev)},
				Then: []clientv3.Op{clientv3.OpDelete(ck)}}); err != nil {
				cs.n.log.Warn("remove the copy state of a stale copy", "volume", lc.Name, "err", err)
			}
		}
	}
	for name := range logged {
		if !here[name] {
			delete(logged, name)
		}
	}
}

// readStale reads a volume's record (nil when absent) and its copy records
// in one etcd read, and the record's mod revision.
func (cs Copies) readStale(ctx context.Context, volume string) (*volumeRecord, map[string]copyRecord, int64, error) {
	vk, cp := cs.n.key("volumes", volume), cs.n.key("copies", volume)+"/"
	resp, err := cs.n.cli.Txn(ctx).Then(clientv3.OpGet(vk), clientv3.OpGet(cp, clientv3.WithPrefix())).Commit()
	if err != nil {
		return nil, nil, 0, err
	}
	kvs := resp.Responses[0].GetResponseRange().Kvs
	if len(kvs) == 0 {
		return nil, nil, 0, nil
	}
	var rec volumeRecord
	if err := json.Unmarshal(kvs[0].Value, &rec); err != nil {
		return nil, nil, 0, fmt.Errorf("etcd key %s: %w", vk, err)
	}
	copies := map[string]copyRecord{}
	for _, kv := range resp.Responses[1].GetResponseRange().Kvs {
		var c copyRecord
		if err := json.Unmarshal(kv.Value, &c); err != nil {
			return nil, nil, 0, fmt.Errorf("etcd key %s: %w", kv.Key, err)
		}
		copies[lastSegment(string(kv.Key))] = c
	}
	return &rec, copies, kvs[0].ModRevision, nil
}
