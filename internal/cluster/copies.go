package cluster

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// Copies is the node's part in the copies/<volume>/<node> keys: the primary
// records a copy out of sync, resyncing, back in sync, diverged or replaced
// (as the primary at its term, under its lease), and this node makes,
// follows and deletes its own copies as the placements say (reconcile,
// followTerm, the stale-copy check). Get it with Node.Copies; it shares the
// node's etcd client, session and logger.
type Copies struct{ n *Node }

// Copies is this node's access to the copies/ keys.
func (n *Node) Copies() Copies { return Copies{n} }

// CopyDegraded is the state of a copy that left the in-sync set: it lacks
// writes acknowledged since, and waits for a resync.
const CopyDegraded = "degraded"

// CopyResyncing is the state of a degraded copy that its primary is
// bringing back (copyRecord.Progress says how far).
const CopyResyncing = "resyncing"

// MarkOutOfSync takes copy node out of the volume's in-sync set, as the
// primary at term, and records the copy degraded. It succeeds only while
// this node is the volume's primary at that term and holds its lease, so a
// primary cut off from etcd cannot drop a copy and go on alone: its caller
// must not acknowledge the request that found the copy failed.
func (cs Copies) MarkOutOfSync(volume, node string, term uint64, cause error) error {
	return cs.markOutOfSync(volume, node, term, cause, false)
}

// markOutOfSync is MarkOutOfSync; whole also records that the copy's
// resync must copy it whole (MarkDiverged), even if it was out of sync
// already.
func (cs Copies) markOutOfSync(volume, node string, term uint64, cause error, whole bool) error {
	ctx, cancel := context.WithTimeout(context.Background(), cs.n.cfg.LeaseTTL)
	defer cancel()
	s := cs.n.session()
	if s == nil || !cs.n.up.Load() {
		return fmt.Errorf("mark copy %s of %q out of sync: %w", node, volume, ErrNoSession)
	}
	vk, ck, ak := cs.n.key("volumes", volume), cs.n.key("copies", volume, node), cs.n.key("alive", cs.n.cfg.NodeName)
	// transient: an etcd error worth another try while this node holds
	// its lease and the deadline allows (the copy's node was the etcd
	// leader: "leader changed" while etcd elects another). commit tries
	// again what etcd surely did not apply; its ErrUnknownOutcome, and any
	// other error, is tried again here: the next round reads the record
	// and finds the copy out of the in-sync set if the write went through,
	// and a write that applies late cannot apply after another round's
	// write, which changed the record's revision it compares.
	transient := func() bool {
		if ctx.Err() != nil || !cs.n.up.Load() {
			return false
		}
		sleep(ctx, 50*time.Millisecond)
		return ctx.Err() == nil
	}
	for {
		resp, err := cs.n.cli.Txn(ctx).Then(clientv3.OpGet(vk), clientv3.OpGet(ck)).Commit()
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
		if rec.Primary != cs.n.cfg.NodeName || rec.Term != term {
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
		if whole {
			// Diverged: its activity logs no longer say where it differs.
			c.WasPrimary, c.Activity = 0, nil
		}
		put, err := cs.n.commit(ctx, txnSpec{
			If: []clientv3.Cmp{clientv3.Compare(clientv3.ModRevision(vk), "=", kvs[0].ModRevision),
				clientv3.Compare(clientv3.LeaseValue(ak), "=", s.Lease())},
			Then: []clientv3.Op{clientv3.OpPut(vk, mustJSON(rec)), clientv3.OpPut(ck, mustJSON(c))}})
		if err != nil {
			if transient() {
				continue
			}
			return fmt.Errorf("mark copy %s of %q out of sync: %w", node, volume, err)
		}
		if put.Succeeded {
			cs.n.log.Warn("copy out of sync: the volume is degraded", "volume", volume, "copy", node, "term", term,
				"inSync", rec.InSync, "err", cause)
			return nil
		}
		// The record changed meanwhile, or the lease is gone: look again.
		if !cs.n.up.Load() {
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
func (cs Copies) MarkInSync(volume, node string, term uint64) error {
	ctx, cancel := context.WithTimeout(context.Background(), cs.n.cfg.LeaseTTL)
	defer cancel()
	s := cs.n.session()
	if s == nil || !cs.n.up.Load() {
		return fmt.Errorf("mark copy %s of %q in sync: %w", node, volume, ErrNoSession)
	}
	vk, ck, ak := cs.n.key("volumes", volume), cs.n.key("copies", volume, node), cs.n.key("alive", cs.n.cfg.NodeName)
	resp, err := cs.n.cli.Txn(ctx).Then(clientv3.OpGet(vk), clientv3.OpGet(ck)).Commit()
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
	if rec.Primary != cs.n.cfg.NodeName || rec.Term != term || rec.State != volumeActive || !slices.Contains(rec.Copies, node) {
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
	c.WasPrimary, c.Activity = 0, nil
	// An unknown outcome is ErrUnknownOutcome, an error like any other to
	// the caller: replica.Rejoin records the copy out of sync again on
	// any error of this commit, as if it had been applied.
	put, err := cs.n.commit(ctx, txnSpec{
		If: []clientv3.Cmp{clientv3.Compare(clientv3.ModRevision(vk), "=", kvs[0].ModRevision),
			clientv3.Compare(clientv3.LeaseValue(ak), "=", s.Lease())},
		Then: []clientv3.Op{clientv3.OpPut(vk, mustJSON(rec)), clientv3.OpPut(ck, mustJSON(c))}})
	if err != nil {
		return fmt.Errorf("mark copy %s of %q in sync: %w", node, volume, err)
	}
	if !put.Succeeded {
		return fmt.Errorf("mark copy %s of %q in sync: the volume record changed meanwhile, or this node lost its lease: %w",
			node, volume, ErrNoSession)
	}
	cs.n.log.Info("copy back in sync", "volume", volume, "copy", node, "term", term, "inSync", rec.InSync)
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
func (cs Copies) SetCopyState(volume, node string, term uint64, state, reason string, p *Progress) error {
	ctx, cancel := context.WithTimeout(context.Background(), cs.n.cfg.LeaseTTL)
	defer cancel()
	vk, ck := cs.n.key("volumes", volume), cs.n.key("copies", volume, node)
	resp, err := cs.n.cli.Txn(ctx).Then(clientv3.OpGet(vk), clientv3.OpGet(ck)).Commit()
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
	if rec.Primary != cs.n.cfg.NodeName || rec.Term != term {
		return fmt.Errorf("record the state of copy %s of %q: this node is not the primary at term %d (primary %s, term %d): %w",
			node, volume, term, rec.Primary, rec.Term, ErrNotPrimary)
	}
	if slices.Contains(rec.InSync, node) {
		return fmt.Errorf("record the state of copy %s of %q: the copy is in sync, not out of sync", node, volume)
	}
	c.State, c.Reason, c.Progress, c.UpdatedAt = state, reason, p, time.Now().UTC()
	// The state of an out-of-sync copy is a report: after an unknown
	// outcome (ErrUnknownOutcome) the copy shows the old state or this
	// one, and the next report, or MarkInSync, writes over it.
	put, err := cs.n.commit(ctx, txnSpec{
		If: []clientv3.Cmp{clientv3.Compare(clientv3.ModRevision(vk), "=", kvs[0].ModRevision),
			clientv3.Compare(clientv3.ModRevision(ck), "=", ckvs[0].ModRevision)},
		Then: []clientv3.Op{clientv3.OpPut(ck, mustJSON(c))}})
	if err != nil {
		return fmt.Errorf("record the state of copy %s of %q: %w", node, volume, err)
	}
	if !put.Succeeded {
		return fmt.Errorf("record the state of copy %s of %q: changed meanwhile", node, volume)
	}
	return nil
}

// MarkDiverged takes copy node out of the volume's in-sync set, as the
// primary at term, and records that its resync must copy it whole: an
// operation at the cut (a rollback, a disk change) failed on it, so it may
// differ from the primary anywhere, which no dirty bitmap says. Like
// MarkOutOfSync it holds only while this node is that primary with its
// lease; when it fails the caller must not let I/O go on as if the copy
// were in sync.
func (cs Copies) MarkDiverged(volume, node string, term uint64, cause error) error {
	return cs.markOutOfSync(volume, node, term, cause, true)
}

// WaitCopyInSync waits until the copy of volume on node is in sync
// (rebuilt and back in the in-sync set), calling progress with the
// rebuild's progress as it goes. A failed copy is ErrCopyFailed.
func (cs Copies) WaitCopyInSync(ctx context.Context, volume, node string, progress func(Progress)) error {
	for {
		p, ok, err := cs.n.Volumes().Placement(ctx, volume)
		if err == nil && !ok {
			err = fmt.Errorf("volume %q: %w", volume, ErrVolumeNotFound)
		}
		if err != nil {
			return err
		}
		i := slices.IndexFunc(p.Copies, func(c CopyInfo) bool { return c.Node == node })
		if i < 0 {
			return fmt.Errorf("copy of %q on %s: no longer placed", volume, node)
		}
		c := p.Copies[i]
		switch {
		case c.State == CopyInSync:
			return nil
		case c.State == CopyFailed:
			return fmt.Errorf("copy of %q on %s: %s: %w", volume, node, c.Reason, ErrCopyFailed)
		case c.Progress != nil && progress != nil:
			progress(*c.Progress)
		}
		sleep(ctx, 500*time.Millisecond)
		if err := ctx.Err(); err != nil {
			return err
		}
	}
}
