package cluster

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"

	"github.com/quiverstorage/quiver/internal/api"
	"github.com/quiverstorage/quiver/internal/durable"
	"github.com/quiverstorage/quiver/internal/storage"
)

// Store is this node's pool as the cluster sees it. The server implements it
// over pool.Pool.
type Store interface {
	// PoolID is the pool's identity (pool.json).
	PoolID() string
	// Usage is the pool filesystem's total and free bytes.
	Usage() (total, free int64, err error)
	// CreateCopy makes the volume in the pool and returns its local UID.
	CreateCopy(ctx context.Context, spec api.VolumeSpec) (uid string, err error)
	// DeleteCopy deletes the volume name if its local UID is uid; a volume
	// that is absent, or has another UID, is left alone and is no error.
	// The attachments made by AttachForPrimary go with it.
	DeleteCopy(ctx context.Context, name, uid string) error
	// AttachForPrimary makes (or finds again) the read-write attachment
	// through which primary, at term, writes this node's copy of volume
	// over a replication session. Its token stays on this node.
	// It gives that attachment the writer role, so that writes through
	// the attachments of older terms (an old primary's) are refused from
	// then on: term fencing at the copy.
	AttachForPrimary(ctx context.Context, volume, primary string, term uint64) error
	// ApplyOp applies an operation of the volume's primary to this node's
	// copy (a snapshot with the primary's name and UID); applying it again
	// is no error.
	ApplyOp(ctx context.Context, volume string, op Op) error
	// CloneCopy makes op.Name, a clone of this node's copy of volume (of
	// its snapshot op.Snapshot, which must have the UID op.SnapshotUID,
	// or of the live copy), durable on return, and returns its local UID.
	// Applied again it finds the clone it made.
	CloneCopy(ctx context.Context, volume string, op Op) (uid string, err error)
	// DeleteUnplacedClone deletes the local volume name if its manifest
	// says it is a clone of volume (a clone made at the cut whose
	// placement never happened); anything else of that name, or none, is
	// left alone and is no error.
	DeleteUnplacedClone(ctx context.Context, volume, name string) error
	// AdoptAttachments replaces the attachments of this node's copy with
	// state, as the volume's old primary published it (PublishAttachments;
	// nil: none), when this node becomes the primary.
	AdoptAttachments(ctx context.Context, volume string, state []byte) error
	// LocalCopies lists the volumes in the pool, for the stale-copy check
	// (stale.go).
	LocalCopies() []LocalCopy
	// ActivityOf reads the activity logs of this node's copy of volume
	// (local UID uid) that it wrote as the primary at term: nil when there
	// is none it can vouch for; a disk whose log is missing, damaged,
	// untrusted or of another term is left out.
	ActivityOf(volume, uid string, term uint64) *CopyActivity
}

// identity is <StateDir>/node.json: which cluster and node this pool is.
type identity struct {
	ClusterName string `json:"clusterName"`
	ClusterID   string `json:"clusterID"`
	NodeName    string `json:"nodeName"`
	NodeID      string `json:"nodeID"`
	PoolID      string `json:"poolID"`
}

// Node is this server's membership of the cluster. Its methods are safe for
// concurrent use.
type Node struct {
	cfg       Config
	log       *slog.Logger
	store     Store
	etcd      *embed.Etcd // nil with external etcd
	etcdLog   zap.AtomicLevel
	cli       *clientv3.Client
	id        identity
	started   time.Time
	up        atomic.Bool // holds a live session with its alive key
	sessMu    sync.Mutex
	sess      *concurrency.Session
	stop      context.CancelFunc
	wg        sync.WaitGroup
	placeOK   atomic.Int64
	placeFail atomic.Int64
	closeOnce sync.Once
	lease     leaseClock
	// adopted holds, per volume, the term at which this node took over
	// as primary and adopted the volume's attachments (failover.go).
	adoptMu sync.Mutex
	adopted map[string]uint64
	// failovers counts the promotions this node won.
	failovers atomic.Int64
	// staleDeleted counts the stale copies this node deleted (stale.go).
	staleDeleted atomic.Int64
	// keys are derived from the cluster token (secrets.go).
	keys nodeKeys
	// instance names this process's membership: a replication session
	// is signed for one instance of its copy node (replica.Credential),
	// so a credential seen once does not open a session after a restart.
	instance string
	// done closes when the node is removed while it runs (membership.go);
	// failErr says why.
	done     chan struct{}
	failOnce sync.Once
	failErr  error
}

// Join starts the embedded etcd member (with InitialCluster) or connects to
// EtcdEndpoints, checks the cluster and the node's identity, registers the
// node under a lease and starts keeping it alive and making the copies it is
// given. It fails, having closed whatever it opened, when etcd does not
// answer within DialTimeout, when etcd or the pool belongs to another
// cluster, when the token is wrong and when the node name is taken.
func Join(ctx context.Context, cfg Config, store Store) (*Node, error) {
	cfg.defaults()
	token, err := cfg.validate()
	if err != nil {
		return nil, err
	}
	n := &Node{cfg: cfg, log: cfg.Logger.With("node", cfg.NodeName), store: store, started: time.Now().UTC(),
		adopted: map[string]uint64{}, keys: deriveKeys(token, cfg.ClusterName), instance: newID(),
		done: make(chan struct{})}
	ok := false
	defer func() {
		if !ok {
			n.closeClients()
		}
	}()
	id, fresh, err := n.loadIdentity()
	if err != nil {
		return nil, err
	}
	endpoints := n.cfg.EtcdEndpoints
	if cfg.InitialCluster != "" {
		n.etcd, n.etcdLog, endpoints, err = startEmbedded(ctx, &n.cfg)
		if err != nil {
			return nil, err
		}
	}
	ccfg := clientv3.Config{Endpoints: endpoints, DialTimeout: cfg.DialTimeout, Username: n.cfg.EtcdUsername,
		Logger: zap.NewNop(), Context: ctx, DialOptions: cfg.EtcdDialOptions}
	if ccfg.TLS, err = n.cfg.clientTLS(endpoints); err != nil {
		return nil, err
	}
	if ccfg.Password, err = n.cfg.etcdPassword(); err != nil {
		return nil, err
	}
	n.cli, err = clientv3.New(ccfg)
	if err != nil {
		return nil, fmt.Errorf("etcd client for %v: %w", endpoints, err)
	}
	cr, err := n.checkCluster(ctx, token, endpoints)
	if err != nil {
		return nil, err
	}
	if id.ClusterID != "" && id.ClusterID != cr.ID {
		return nil, fmt.Errorf("this pool's node %q joined cluster %q with id %s (%s), but etcd holds cluster %q with id %s: "+
			"the pool belongs to another cluster; use a new pool, or point the node at its own cluster's etcd: %w",
			id.NodeName, id.ClusterName, id.ClusterID, n.identityPath(), cr.Name, cr.ID, ErrOtherCluster)
	}
	id.ClusterID = cr.ID
	n.id = id
	if fresh {
		if err := os.MkdirAll(n.cfg.StateDir, 0o700); err != nil {
			return nil, fmt.Errorf("cluster state directory: %w", err)
		}
		if err := n.writeIdentity(id); err != nil {
			return nil, fmt.Errorf("write node identity: %w", err)
		}
	}
	if !fresh {
		// A removed node's pool: refused before it registers again.
		if err := n.checkNotRemoved(ctx); err != nil {
			return nil, err
		}
	}
	if err := n.claimMember(ctx); err != nil {
		if fresh && !errors.Is(err, ErrUnknownOutcome) {
			_ = os.Remove(n.identityPath())
		}
		return nil, err
	}
	if err := n.startSession(ctx); err != nil {
		return nil, err
	}
	lctx, cancel := context.WithCancel(context.Background())
	n.stop = cancel
	n.wg.Add(5)
	go func() { defer n.wg.Done(); n.keepAlive(lctx) }()
	go func() { defer n.wg.Done(); n.renewLease(lctx) }()
	go func() { defer n.wg.Done(); n.Primaries().elect(lctx) }()
	go func() { defer n.wg.Done(); n.report(lctx) }()
	go func() { defer n.wg.Done(); n.Copies().reconcile(lctx) }()
	n.wg.Add(3)
	go func() { defer n.wg.Done(); n.watchRemoval(lctx) }()
	go func() { defer n.wg.Done(); n.Ops().runOps(lctx) }()
	go func() { defer n.wg.Done(); n.Copies().collectStale(lctx) }()
	n.log.Info("joined the cluster", "cluster", cr.Name, "clusterID", cr.ID, "nodeID", id.NodeID,
		"etcd", endpoints, "failureDomain", cfg.FailureDomain)
	ok = true
	return n, nil
}

func (n *Node) identityPath() string { return filepath.Join(n.cfg.StateDir, identityFile) }

// identityFile is the node's identity in its state directory.
const identityFile = "node.json"

// writeIdentity writes node.json atomically and durably, through the
// storage layer rooted at the state directory.
func (n *Node) writeIdentity(id identity) error {
	fsys, err := storage.OpenOS(n.cfg.StateDir)
	if err != nil {
		return err
	}
	defer fsys.Close()
	return durable.WriteJSON(fsys, identityFile, id)
}

// loadIdentity reads node.json, or makes a new identity (fresh) when there
// is none. A pool that is another node's, or that joined another cluster
// name, is refused.
func (n *Node) loadIdentity() (identity, bool, error) {
	var id identity
	err := durable.ReadJSON(n.identityPath(), &id)
	switch {
	case errors.Is(err, os.ErrNotExist):
		return identity{ClusterName: n.cfg.ClusterName, NodeName: n.cfg.NodeName, NodeID: newID(),
			PoolID: n.store.PoolID()}, true, nil
	case err != nil:
		return id, false, fmt.Errorf("read node identity: %w", err)
	}
	if id.NodeName != n.cfg.NodeName {
		return id, false, fmt.Errorf("this pool is node %q's (%s), not %q: start it with --node-name %s, or use another pool: %w",
			id.NodeName, n.identityPath(), n.cfg.NodeName, id.NodeName, ErrConfig)
	}
	if id.ClusterName != n.cfg.ClusterName {
		return id, false, fmt.Errorf("this pool's node %q belongs to cluster %q (%s), not %q: %w",
			id.NodeName, id.ClusterName, n.identityPath(), n.cfg.ClusterName, ErrOtherCluster)
	}
	if p := n.store.PoolID(); id.PoolID != p {
		return id, false, fmt.Errorf("%s was written for pool %s, but the pool is %s: %w", n.identityPath(), id.PoolID, p, ErrConfig)
	}
	return id, false, nil
}

func (n *Node) key(parts ...string) string {
	k := n.cfg.Prefix
	for i, p := range parts {
		if i > 0 {
			k += "/"
		}
		k += p
	}
	return k
}

// checkCluster creates the cluster record if etcd has none, else checks its
// name and token. It is the first request to etcd: a timeout is
// ErrUnreachable.
func (n *Node) checkCluster(ctx context.Context, token string, endpoints []string) (clusterRecord, error) {
	rec := clusterRecord{Name: n.cfg.ClusterName, ID: newID(), TokenVerifier: verifier(token, n.cfg.ClusterName),
		CreatedAt: time.Now().UTC()}
	k := n.key("cluster")
	cctx, cancel := context.WithTimeout(ctx, n.cfg.DialTimeout)
	defer cancel()
	// An unknown outcome (ErrUnknownOutcome) fails the join like an etcd
	// that does not answer, and leaves nothing to settle: the next join's
	// same Txn creates the record or reads it, and takes one this node
	// wrote (its name and token verifier are this configuration's).
	resp, err := n.commit(cctx, txnSpec{If: []clientv3.Cmp{clientv3.Compare(clientv3.CreateRevision(k), "=", 0)},
		Then: []clientv3.Op{clientv3.OpPut(k, mustJSON(rec))}, Else: []clientv3.Op{clientv3.OpGet(k)}})
	if err != nil {
		if ctx.Err() == nil {
			return rec, fmt.Errorf("etcd at %v did not answer within %s (--etcd-dial-timeout): %v: %w",
				endpoints, n.cfg.DialTimeout, err, ErrUnreachable)
		}
		return rec, err
	}
	if resp.Succeeded {
		n.log.Info("created the cluster in etcd", "cluster", rec.Name, "clusterID", rec.ID, "prefix", n.cfg.Prefix)
		return rec, nil
	}
	var have clusterRecord
	if err := json.Unmarshal(resp.Responses[0].GetResponseRange().Kvs[0].Value, &have); err != nil {
		return rec, fmt.Errorf("etcd key %s: %w", k, err)
	}
	if have.Name != n.cfg.ClusterName {
		return have, fmt.Errorf("etcd at %v (prefix %s) holds cluster %q, not %q (--cluster-name): a node of another cluster is refused: %w",
			endpoints, n.cfg.Prefix, have.Name, n.cfg.ClusterName, ErrOtherCluster)
	}
	if !hmacEqual(have.TokenVerifier, rec.TokenVerifier) {
		return have, fmt.Errorf("cluster %q: the token of --cluster-token-file %s is not the cluster's: %w",
			have.Name, n.cfg.TokenFile, ErrWrongToken)
	}
	return have, nil
}

// claimMember creates members/<node>, or checks that it is this node's.
func (n *Node) claimMember(ctx context.Context) error {
	k := n.key("members", n.cfg.NodeName)
	rec := memberRecord{NodeID: n.id.NodeID, PoolID: n.id.PoolID, FailureDomain: n.cfg.FailureDomain,
		JoinedAt: time.Now().UTC()}
	// An unknown outcome is learnt (commitLearning): the same Txn again
	// creates the record or reads it, and one this node wrote carries its
	// node id, which the check below takes as this node's. Left unknown,
	// it is ErrUnknownOutcome, and Join keeps a fresh identity: the
	// record may carry its node id.
	resp, _, err := n.commitLearning(ctx, "register node", txnSpec{
		If:   []clientv3.Cmp{clientv3.Compare(clientv3.CreateRevision(k), "=", 0)},
		Then: []clientv3.Op{clientv3.OpPut(k, mustJSON(rec))}, Else: []clientv3.Op{clientv3.OpGet(k)}})
	if err != nil {
		return fmt.Errorf("register node %q: %w", n.cfg.NodeName, err)
	}
	if resp.Succeeded {
		return nil
	}
	var have memberRecord
	if err := json.Unmarshal(resp.Responses[0].GetResponseRange().Kvs[0].Value, &have); err != nil {
		return fmt.Errorf("etcd key %s: %w", k, err)
	}
	if have.NodeID != n.id.NodeID {
		state, addr := "down", ""
		if a, ok, _ := n.alive(ctx, n.cfg.NodeName); ok {
			state, addr = "up", a.API
		}
		return fmt.Errorf("node name %q is taken by node id %s (pool %s, %s%s): pick another --node-name, or remove the other node: %w",
			n.cfg.NodeName, have.NodeID, have.PoolID, state, addrSuffix(addr), ErrNameTaken)
	}
	if have.FailureDomain != n.cfg.FailureDomain {
		if _, err := n.cli.Put(ctx, k, mustJSON(memberRecord{NodeID: have.NodeID, PoolID: have.PoolID,
			FailureDomain: n.cfg.FailureDomain, JoinedAt: have.JoinedAt})); err != nil {
			return fmt.Errorf("update node %q: %w", n.cfg.NodeName, err)
		}
	}
	return nil
}

func addrSuffix(a string) string {
	if a == "" {
		return ""
	}
	return " at " + a
}

func (n *Node) alive(ctx context.Context, name string) (aliveRecord, bool, error) {
	var a aliveRecord
	resp, err := n.cli.Get(ctx, n.key("alive", name))
	if err != nil || len(resp.Kvs) == 0 {
		return a, false, err
	}
	return a, json.Unmarshal(resp.Kvs[0].Value, &a) == nil, nil
}

// Close stops the loops, revokes the lease (the node is down at once) and
// stops the embedded member. Later calls do nothing.
func (n *Node) Close() error {
	n.closeOnce.Do(n.close)
	return nil
}

func (n *Node) close() {
	if n.stop != nil {
		n.stop()
	}
	n.wg.Wait()
	n.sessMu.Lock()
	if s := n.sess; s != nil {
		_ = s.Close() // revokes the lease: alive/<node> goes with it
	}
	n.sessMu.Unlock()
	n.up.Store(false)
	n.closeClients()
}

func (n *Node) closeClients() {
	if n.cli != nil {
		_ = n.cli.Close()
	}
	if n.etcd != nil {
		// A member logs its own shutdown as errors (closed listeners).
		n.etcdLog.SetLevel(zap.FatalLevel)
		n.etcd.Close()
	}
}

// Name is this node's name.
func (n *Node) Name() string { return n.cfg.NodeName }

// ClusterName is the name of the cluster the node belongs to
// (--cluster-name).
func (n *Node) ClusterName() string { return n.cfg.ClusterName }

// Up says whether this node holds a live session (its alive key).
func (n *Node) Up() bool { return n.up.Load() }

func mustJSON(v any) string {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err) // records are plain structs
	}
	return string(b)
}
