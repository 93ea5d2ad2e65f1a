package cluster

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/quiverstorage/quiver/internal/api"
)

// Volumes is the node's part in the volumes/<volume> records and what is
// written with them in one Txn: a volume's placement (CreateVolume,
// CreateCharged, PlaceClone, DeleteVolume), the reads of placements, the
// changes of a placed volume's spec (UpdateSpec, UpdateDisks), a drain's
// moves of copies (PlanDrain, AddCopy, RemoveCopy), and the tenants' use
// (tenants/<tenant>/use) and snapshot charges (snapcharges/<volume>). Get it
// with Node.Volumes; it shares the node's etcd client, session and logger.
type Volumes struct{ n *Node }

// Volumes is this node's access to the volumes/ records.
func (n *Node) Volumes() Volumes { return Volumes{n} }

// CopyInfo is one copy of a volume.
type CopyInfo struct {
	Node   string
	State  string // CopyInSync, CopyDegraded, CopyResyncing, CopyFailed, or "" while being made
	Reason string
	// Progress of a resync (CopyResyncing), else nil.
	Progress *Progress
	// Whole: the copy's resync must copy it whole (copyRecord.Whole).
	Whole bool
}

// Placement is where a volume's copies are and which one is primary.
type Placement struct {
	Volume    string
	UID       string
	Replicas  int
	Copies    []CopyInfo
	Primary   string
	Term      uint64
	Deleting  bool
	Spec      api.VolumeSpec
	CreatedAt time.Time
}

func lastSegment(k string) string { return k[strings.LastIndexByte(k, '/')+1:] }

// freeStep is the step in which placement compares free space: nodes
// whose free bytes differ by less (nodes on one filesystem, or reports
// taken a moment apart while data is written) rank by how many copies they
// hold, so volumes spread over them instead of piling on one.
const freeStep = 1 << 30

// choose picks replicas distinct nodes among the up ones that are not
// drained: the one with the most free space first (in steps of freeStep),
// then each next one from a failure domain not used yet while there is one
// (a node without a domain is a domain of its own), most free space first;
// ties by fewer copies held, then by name. Fewer up nodes than replicas is
// ErrNotEnoughNodes, naming the nodes that are down.
func choose(nodes []NodeInfo, replicas int) ([]string, error) {
	var up []NodeInfo
	var down []string
	var drained []string
	for _, ni := range nodes {
		switch {
		case ni.Up && ni.Drain != "":
			drained = append(drained, ni.Name)
		case ni.Up:
			up = append(up, ni)
		default:
			down = append(down, ni.Name)
		}
	}
	if len(up) < replicas {
		msg := fmt.Sprintf("replicas %d: the cluster has %d node(s) up", replicas, len(up))
		if len(down) > 0 {
			msg += fmt.Sprintf(" (down: %s)", strings.Join(down, ", "))
		}
		if len(drained) > 0 {
			msg += fmt.Sprintf(" (drained, so not used: %s)", strings.Join(drained, ", "))
		}
		return nil, fmt.Errorf("%s; each copy needs a node of its own: %w", msg, ErrNotEnoughNodes)
	}
	slices.SortFunc(up, func(a, b NodeInfo) int {
		if c := cmp.Compare(b.FreeBytes/freeStep, a.FreeBytes/freeStep); c != 0 {
			return c
		}
		if c := cmp.Compare(a.Volumes, b.Volumes); c != 0 {
			return c
		}
		return cmp.Compare(a.Name, b.Name)
	})
	domain := func(ni NodeInfo) string {
		if ni.FailureDomain == "" {
			return "node:" + ni.Name
		}
		return "domain:" + ni.FailureDomain
	}
	used := map[string]bool{}
	var picked []string
	for len(picked) < replicas {
		i := slices.IndexFunc(up, func(ni NodeInfo) bool { return !used[domain(ni)] })
		if i < 0 {
			i = 0 // every domain holds a copy: the freest remaining node
		}
		used[domain(up[i])] = true
		picked = append(picked, up[i].Name)
		up = slices.Delete(up, i, i+1)
	}
	return picked, nil
}

// CreateVolume is CreateCharged without a charge, for volumes of no
// tenant.
func (vs Volumes) CreateVolume(ctx context.Context, spec api.VolumeSpec, key string, idempotent func(sameSpec bool, key string) bool) (Placement, bool, error) {
	return vs.CreateCharged(ctx, spec, key, idempotent, Charge{})
}

// CreateCharged places spec on Replicas distinct nodes (1 when 0), records
// the placement with the first copy as primary at term 1, and returns when
// every copy is made and in sync. A name placed already is ErrVolumeExists,
// unless idempotent says the existing volume is the answer (same spec, and
// the caller's rule on the key). When a copy fails, or the copies do not
// report within OpTimeout, what was made is deleted and the error returned.
//
// A volume of a tenant (spec.Tenant) is recorded in the same Txn that adds
// charge.Add to the tenant's usage, and only if the usage is still the one
// charge.Admit admitted: concurrent creates on any nodes cannot pass a
// quota together (a Txn that lost reads the usage again and admits again).
// The record keeps its charge, which its delete gives back.
func (vs Volumes) CreateCharged(ctx context.Context, spec api.VolumeSpec, key string, idempotent func(sameSpec bool, key string) bool, charge Charge) (Placement, bool, error) {
	if spec.Replicas == 0 {
		spec.Replicas = 1
	}
	nodes, err := vs.n.Nodes(ctx)
	if err != nil {
		return Placement{}, false, err
	}
	picked, err := choose(nodes, spec.Replicas)
	if err != nil {
		vs.n.placeFail.Add(1)
		return Placement{}, false, fmt.Errorf("create volume %q: %w", spec.Name, err)
	}
	rec := volumeRecord{UID: newID(), Spec: spec, IdempotencyKey: key, Copies: picked, Primary: picked[0], Term: 1,
		InSync: picked, CreatedAt: time.Now().UTC()}
	k := vs.n.key("volumes", spec.Name)
	var existing []byte // the record of the name, when it is placed already
	created := false
	for existing == nil && !created {
		cmps := []clientv3.Cmp{clientv3.Compare(clientv3.CreateRevision(k), "=", 0)}
		ops := []clientv3.Op{}
		if spec.Tenant != "" {
			used, rev, err := vs.readUsage(ctx, spec.Tenant)
			if err != nil {
				return Placement{}, false, fmt.Errorf("create volume %q: %w", spec.Name, err)
			}
			// A name placed already is answered as such (a retry of an
			// idempotent create is not refused by the quota it counts in).
			if r, err := vs.n.cli.Get(ctx, k); err != nil {
				return Placement{}, false, fmt.Errorf("create volume %q: %w", spec.Name, err)
			} else if len(r.Kvs) > 0 {
				existing = r.Kvs[0].Value
				break
			}
			if charge.Admit != nil {
				if err := charge.Admit(used); err != nil {
					return Placement{}, false, fmt.Errorf("create volume %q: %w", spec.Name, err)
				}
			}
			add := charge.Add
			rec.Charge = &add
			cmps = append(cmps, vs.usageUnchanged(spec.Tenant, rev))
			ops = append(ops, clientv3.OpPut(vs.usageKey(spec.Tenant), mustJSON(used.plus(add))))
		}
		ops = append(ops, clientv3.OpPut(k, mustJSON(rec)))
		// An unknown outcome is learnt (commitLearning): a try again
		// finds the name placed, by this call if the record is ours (its
		// UID), which is created, not ErrVolumeExists. Left unknown, it is
		// ErrUnknownOutcome (503): the user's retry with its idempotency
		// key takes the record if it was applied.
		resp, tried, err := vs.n.commitLearning(ctx, "create volume", txnSpec{If: cmps, Then: ops,
			Else: []clientv3.Op{clientv3.OpGet(k)}})
		if err != nil {
			return Placement{}, false, fmt.Errorf("create volume %q: record placement: %w", spec.Name, err)
		}
		created = resp.Succeeded || (tried && recordedUID(resp, rec.UID))
		if kvs := resp.Responses[0].GetResponseRange().GetKvs(); !created && len(kvs) > 0 {
			existing = kvs[0].Value
		}
		// Else the name is free but the tenant's usage changed since it
		// was read: admit again on the new usage.
	}
	if !created {
		var have volumeRecord
		if err := json.Unmarshal(existing, &have); err != nil {
			return Placement{}, false, fmt.Errorf("etcd key %s: %w", k, err)
		}
		if have.State == volumeDeleting {
			return Placement{}, false, fmt.Errorf("volume %q is being deleted: the name is free once its last copy is gone (copies on %s; "+
				"a copy whose node is down goes when the node is back): %w", spec.Name, strings.Join(have.Copies, ", "), ErrVolumeDeleting)
		}
		same := have.State == volumeActive && reflect.DeepEqual(have.Spec, spec)
		if !idempotent(same, have.IdempotencyKey) {
			return Placement{}, false, fmt.Errorf("volume %q is placed already on %s: %w", spec.Name,
				strings.Join(have.Copies, ", "), ErrVolumeExists)
		}
		rec = have
	}
	vs.n.log.Info("volume placed", "volume", spec.Name, "copies", rec.Copies, "primary", rec.Primary, "term", rec.Term)
	p, err := vs.waitCopies(ctx, spec.Name, rec, func(c copyRecord) bool { return c.State == CopyInSync })
	if err != nil {
		vs.n.placeFail.Add(1)
		if created {
			if derr := vs.DeleteVolume(context.WithoutCancel(ctx), spec.Name); derr != nil {
				vs.n.log.Error("remove a volume whose creation failed", "volume", spec.Name, "err", derr)
			}
		}
		return Placement{}, false, fmt.Errorf("create volume %q: %w", spec.Name, err)
	}
	vs.n.placeOK.Add(1)
	return p, created, nil
}

// waitCopies waits until every copy of rec satisfies done, or one failed,
// or OpTimeout passes.
func (vs Volumes) waitCopies(ctx context.Context, volume string, rec volumeRecord, done func(copyRecord) bool) (Placement, error) {
	ctx, cancel := context.WithTimeout(ctx, vs.n.cfg.OpTimeout)
	defer cancel()
	prefix := vs.n.key("copies", volume) + "/"
	for {
		resp, err := vs.n.cli.Get(ctx, prefix, clientv3.WithPrefix())
		if err != nil {
			return Placement{}, vs.opError(ctx, err)
		}
		copies := map[string]copyRecord{}
		for _, kv := range resp.Kvs {
			var c copyRecord
			if json.Unmarshal(kv.Value, &c) == nil {
				copies[lastSegment(string(kv.Key))] = c
			}
		}
		p := toPlacement(volume, rec, copies)
		all := true
		for _, node := range rec.Copies {
			c, ok := copies[node]
			if ok && c.State == CopyFailed {
				return p, fmt.Errorf("copy on node %s: %s: %w", node, c.Reason, ErrCopyFailed)
			}
			if !ok || !done(c) {
				all = false
			}
		}
		if all {
			return p, nil
		}
		wch := vs.n.cli.Watch(ctx, prefix, clientv3.WithPrefix(), clientv3.WithRev(resp.Header.Revision+1))
		select {
		case <-wch:
		case <-ctx.Done():
			return p, vs.opError(ctx, ctx.Err())
		}
	}
}

func (vs Volumes) opError(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return fmt.Errorf("%w within %s (--cluster-op-timeout): %v", ErrTimeout, vs.n.cfg.OpTimeout, err)
	}
	return err
}

func toPlacement(volume string, rec volumeRecord, copies map[string]copyRecord) Placement {
	p := Placement{Volume: volume, UID: rec.UID, Replicas: rec.Spec.Replicas, Primary: rec.Primary, Term: rec.Term,
		Deleting: rec.State == volumeDeleting, Spec: rec.Spec, CreatedAt: rec.CreatedAt}
	for _, node := range rec.Copies {
		c := copies[node]
		p.Copies = append(p.Copies, CopyInfo{Node: node, State: c.State, Reason: c.Reason, Progress: c.Progress, Whole: c.Whole})
	}
	return p
}

// Placement returns where volume is placed; false when it is not.
func (vs Volumes) Placement(ctx context.Context, volume string) (Placement, bool, error) {
	resp, err := vs.n.cli.Txn(ctx).Then(clientv3.OpGet(vs.n.key("volumes", volume)),
		clientv3.OpGet(vs.n.key("copies", volume)+"/", clientv3.WithPrefix())).Commit()
	if err != nil {
		return Placement{}, false, fmt.Errorf("placement of %q: %w", volume, err)
	}
	kvs := resp.Responses[0].GetResponseRange().Kvs
	if len(kvs) == 0 {
		return Placement{}, false, nil
	}
	var rec volumeRecord
	if err := json.Unmarshal(kvs[0].Value, &rec); err != nil {
		return Placement{}, false, fmt.Errorf("etcd key %s: %w", kvs[0].Key, err)
	}
	copies := map[string]copyRecord{}
	for _, kv := range resp.Responses[1].GetResponseRange().Kvs {
		var c copyRecord
		if json.Unmarshal(kv.Value, &c) == nil {
			copies[lastSegment(string(kv.Key))] = c
		}
	}
	return toPlacement(volume, rec, copies), true, nil
}

// Placements returns every placed volume by name.
func (vs Volumes) Placements(ctx context.Context) (map[string]Placement, error) {
	resp, err := vs.n.cli.Txn(ctx).Then(clientv3.OpGet(vs.n.key("volumes")+"/", clientv3.WithPrefix()),
		clientv3.OpGet(vs.n.key("copies")+"/", clientv3.WithPrefix())).Commit()
	if err != nil {
		return nil, fmt.Errorf("list placements: %w", err)
	}
	copies := map[string]map[string]copyRecord{}
	for _, kv := range resp.Responses[1].GetResponseRange().Kvs {
		rest := strings.TrimPrefix(string(kv.Key), vs.n.key("copies")+"/")
		vol, node, ok := strings.Cut(rest, "/")
		var c copyRecord
		if !ok || json.Unmarshal(kv.Value, &c) != nil {
			continue
		}
		if copies[vol] == nil {
			copies[vol] = map[string]copyRecord{}
		}
		copies[vol][node] = c
	}
	out := map[string]Placement{}
	for _, kv := range resp.Responses[0].GetResponseRange().Kvs {
		var rec volumeRecord
		if json.Unmarshal(kv.Value, &rec) != nil {
			continue
		}
		name := lastSegment(string(kv.Key))
		out[name] = toPlacement(name, rec, copies[name])
	}
	return out, nil
}
