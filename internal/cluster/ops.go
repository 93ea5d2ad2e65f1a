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

	"github.com/quiverstorage/quiver/internal/api"
)

// Ops is the node's part in the ops/, opresults/ and intents/ keys: the
// primary runs an operation on its in-sync copies (RunOp, RunOpEach) and
// records the change at the cut it is making (BeginIntent, EndIntent,
// SettledIntent); every node applies the operations sent to its copies and
// answers them (runOps). Get it with Node.Ops; it shares the node's etcd
// client, session and logger.
type Ops struct{ n *Node }

// Ops is this node's access to the ops/, opresults/ and intents/ keys.
func (n *Node) Ops() Ops { return Ops{n} }

// Operations a primary sends to its copies (Op.Kind): each copy applies it
// with the same name and UID, while the primary holds the volume's I/O
// gate, so every copy holds the same cut (docs/cluster.md).
const (
	OpSnapshot       = "snapshot"
	OpDeleteSnapshot = "delete-snapshot"
	// The operations that change a copy's disks at the cut (cutops.go).
	OpCheckSnapshot = "check-snapshot"
	OpRollback      = "rollback"
	OpAddDisk       = "add-disk"
	OpGrowDisk      = "grow-disk"
	OpRemoveDisk    = "remove-disk"
	OpConformDisks  = "conform-disks"
	// A change of the volume's capacity, QoS or labels (Op.Update).
	OpUpdate = "update"
	// A clone of the volume at the cut, made by each copy from its own
	// copy (clone.go), and its undo.
	OpClone   = "clone"
	OpUnclone = "unclone"
)

// Op is one operation for the copies of a volume, the value of
// ops/<volume>/<id>; each copy answers in opresults/<volume>/<id>/<node>.
type Op struct {
	Kind    string   `json:"kind"`
	Name    string   `json:"name"`
	UID     string   `json:"uid,omitempty"`
	Primary string   `json:"primary"`
	Term    uint64   `json:"term"`
	Nodes   []string `json:"nodes"`
	// Disk is the disk an add, grow or remove changes; Disks the disk set
	// a conform makes the copy's (OpConformDisks).
	Disk  *api.DiskSpec  `json:"disk,omitempty"`
	Disks []api.DiskSpec `json:"disks,omitempty"`
	// Capacity is the primary's volume capacity for a disk change: a
	// copy whose capacity is smaller grows it first.
	Capacity int64 `json:"capacity,omitempty"`
	// A clone (OpClone, OpUnclone): Name is the clone's name, UID its
	// cluster UID; Snapshot the source snapshot (empty: the live volume)
	// with the primary's SnapshotUID; Labels added to the source's.
	Snapshot    string            `json:"snapshot,omitempty"`
	SnapshotUID string            `json:"snapshotUID,omitempty"`
	Labels      map[string]string `json:"labels,omitempty"`
	// Update is the change of an OpUpdate, and the primary's capacity,
	// labels and QoS that an OpConformDisks gives the copy.
	Update *api.VolumeUpdate `json:"update,omitempty"`
}

type opResult struct {
	Error string `json:"error,omitempty"`
}

// RunOp sends op to the copies on nodes, as the primary of volume at term,
// and waits until each applied it (or refused it: the errors are joined),
// at most OpTimeout. The keys are removed afterwards.
func (o Ops) RunOp(ctx context.Context, volume string, term uint64, op Op) error {
	each, err := o.RunOpEach(ctx, volume, term, op)
	if err != nil {
		return err
	}
	var errs error
	for _, node := range op.Nodes {
		if e := each[node]; e != nil {
			errs = errors.Join(errs, e)
		}
	}
	if errs != nil {
		return fmt.Errorf("%s %q of %q: %w", op.Kind, op.Name, volume, errs)
	}
	return nil
}

// RunOpEach is RunOp that answers each copy's outcome: nil for a copy that
// applied op, its refusal, or a copy that did not answer within OpTimeout.
// err is set only when op could not be sent (every copy's outcome is then
// unknown).
func (o Ops) RunOpEach(ctx context.Context, volume string, term uint64, op Op) (map[string]error, error) {
	each := map[string]error{}
	if len(op.Nodes) == 0 {
		return each, nil
	}
	ctx, cancel := context.WithTimeout(ctx, o.n.cfg.OpTimeout)
	defer cancel()
	op.Primary, op.Term = o.n.cfg.NodeName, term
	id := newID()
	ok, rk := o.n.key("ops", volume, id), o.n.key("opresults", volume, id)+"/"
	defer func() {
		dctx, dcancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer dcancel()
		// Best effort, outside commit's policy on purpose: two deletes,
		// which a second try would only repeat, that nothing waits on; a
		// failure or an unknown outcome leaves the keys as they are, and a
		// copy that answered already skips them (applyOp).
		_, _ = o.n.cli.Txn(dctx).Then(clientv3.OpDelete(ok), clientv3.OpDelete(rk, clientv3.WithPrefix())).Commit()
	}()
	put, err := o.n.cli.Put(ctx, ok, mustJSON(op))
	if err != nil {
		return nil, fmt.Errorf("%s %q of %q on the copies: %w", op.Kind, op.Name, volume, err)
	}
	results := map[string]opResult{}
	wch := o.n.cli.Watch(clientv3.WithRequireLeader(ctx), rk, clientv3.WithPrefix(), clientv3.WithRev(put.Header.Revision))
wait:
	for len(results) < len(op.Nodes) {
		select {
		case <-ctx.Done():
			break wait
		case wr, open := <-wch:
			if !open || wr.Err() != nil {
				if ctx.Err() != nil {
					break wait
				}
				return nil, fmt.Errorf("%s %q of %q: watching the copies' answers: %v", op.Kind, op.Name, volume, wr.Err())
			}
			for _, ev := range wr.Events {
				var r opResult
				if ev.Type == clientv3.EventTypePut && json.Unmarshal(ev.Kv.Value, &r) == nil {
					results[lastSegment(string(ev.Kv.Key))] = r
				}
			}
		}
	}
	for _, node := range op.Nodes {
		r, answered := results[node]
		switch {
		case !answered:
			each[node] = fmt.Errorf("copy on %s: no answer: %w", node, ctx.Err())
		case r.Error != "":
			each[node] = fmt.Errorf("copy on %s: %s", node, r.Error)
		default:
			each[node] = nil
		}
	}
	return each, nil
}

// runOps applies the operations sent to this node's copies: it reads the
// pending ones, then follows new ones with a watch, and starts over when
// the watch breaks.
func (o Ops) runOps(ctx context.Context) {
	prefix := o.n.key("ops") + "/"
	for ctx.Err() == nil {
		resp, err := o.n.cli.Get(ctx, prefix, clientv3.WithPrefix())
		if err != nil {
			sleep(ctx, time.Second)
			continue
		}
		for _, kv := range resp.Kvs {
			o.applyOp(ctx, string(kv.Key), kv.Value)
		}
		wctx, cancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
		for wr := range o.n.cli.Watch(wctx, prefix, clientv3.WithPrefix(), clientv3.WithRev(resp.Header.Revision+1)) {
			if wr.Err() != nil {
				break
			}
			for _, ev := range wr.Events {
				if ev.Type == clientv3.EventTypePut {
					o.applyOp(ctx, string(ev.Kv.Key), ev.Kv.Value)
				}
			}
		}
		cancel()
		sleep(ctx, 200*time.Millisecond)
	}
}

// applyOp applies one operation to this node's copy, once, if it is for
// this node and comes from the volume's primary at its current term.
func (o Ops) applyOp(ctx context.Context, key string, value []byte) {
	var op Op
	if json.Unmarshal(value, &op) != nil || !slices.Contains(op.Nodes, o.n.cfg.NodeName) {
		return
	}
	rest := strings.TrimPrefix(key, o.n.key("ops")+"/")
	volume, id, ok := strings.Cut(rest, "/")
	if !ok {
		return
	}
	rk := o.n.key("opresults", volume, id, o.n.cfg.NodeName)
	if r, err := o.n.cli.Get(ctx, rk); err != nil || len(r.Kvs) > 0 {
		return // answered already
	}
	var res opResult
	vr, err := o.n.cli.Get(ctx, o.n.key("volumes", volume))
	var rec volumeRecord
	switch {
	case err != nil:
		res.Error = err.Error()
	case len(vr.Kvs) == 0 || json.Unmarshal(vr.Kvs[0].Value, &rec) != nil:
		res.Error = "the volume is not placed"
	case rec.Primary != op.Primary || rec.Term != op.Term:
		res.Error = fmt.Sprintf("sent by %s at term %d, but the primary is %s at term %d", op.Primary, op.Term,
			rec.Primary, rec.Term)
	default:
		var err error
		switch op.Kind {
		case OpClone:
			err = o.applyClone(ctx, volume, op)
		case OpUnclone:
			err = o.applyUnclone(ctx, volume, op)
		default:
			err = o.n.store.ApplyOp(ctx, volume, op)
		}
		if err != nil {
			res.Error = err.Error()
		}
	}
	if res.Error != "" {
		o.n.log.Warn("operation from the primary refused", "volume", volume, "op", op.Kind, "name", op.Name, "err", res.Error)
	} else {
		o.n.log.Info("operation from the primary applied", "volume", volume, "op", op.Kind, "name", op.Name, "uid", op.UID)
	}
	if _, err := o.n.cli.Put(ctx, rk, mustJSON(res)); err != nil {
		o.n.log.Warn("answer an operation", "volume", volume, "op", op.Kind, "err", err)
	}
}
