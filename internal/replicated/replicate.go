package replicated

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/quiverstorage/quiver/internal/api"
	"github.com/quiverstorage/quiver/internal/cluster"
	"github.com/quiverstorage/quiver/internal/job"
	"github.com/quiverstorage/quiver/internal/nbd"
	"github.com/quiverstorage/quiver/internal/pool"
	"github.com/quiverstorage/quiver/internal/replica"
)

// Exports serves a cluster node's exports: on the primary of a
// replicated volume, each read-write disk handle writes through the disk's
// replication Set (replica.Set: every in-sync copy, the dirty bitmaps of
// the others); anywhere else, and for snapshots, the pool's handle as it is.
type Exports struct {
	nbd.Exports
	node *cluster.Node
	log  *slog.Logger
	sets *Volumes
	// sessions are the replication sessions this node's copies accept
	// (openSession).
	sessions *replica.Sessions
	pool     *pool.Pool
}

var _ nbd.Exports = Exports{}

// NewExports serves next's exports on a cluster node whose replicated
// volumes v are.
func NewExports(next nbd.Exports, v *Volumes) Exports {
	return Exports{Exports: next, node: v.node, log: v.log, sets: v, sessions: replica.NewSessions(), pool: v.pool}
}

// Options configure a node's replicated volumes.
type Options struct {
	// Config is the node's cluster configuration (its resync rate and
	// rebuild delay).
	Config cluster.Config
	// Jobs runs the rebuilds.
	Jobs *job.Manager
	Log  *slog.Logger
	// AtStep, when set, is told each step of a change at the cut as this
	// process reaches it (the steps of docs/cluster.md, "Intents"): the
	// crash tests' hidden flag kills the process at one. nil in production.
	AtStep func(step string)
}

// New returns the replicated volumes of node, over its pool p. Run drives
// their resyncs and rebuilds; Collectors are their metrics.
func New(node *cluster.Node, p *pool.Pool, opts Options) *Volumes {
	v := newReplicaSets(node, p, opts.Log, newReplMetrics(), opts.Config, opts.Jobs)
	v.atStep = opts.AtStep
	return v
}

// Collectors are the replication's metrics.
func (r *Volumes) Collectors() []prometheus.Collector { return r.metrics.collectors() }

// Run resyncs and rebuilds the copies behind, until ctx ends.
func (r *Volumes) Run(ctx context.Context) { r.resyncLoop(ctx) }

func (e Exports) Open(ctx context.Context, name, peer string) (nbd.Export, error) {
	ref, err := nbd.ParseExportName(name)
	if err != nil || ref.Snapshot != "" {
		// Not a live disk: the pool's exports refuse it or serve the
		// snapshot, which no replication concerns.
		return e.Exports.Open(ctx, name, peer)
	}
	volume, disk := ref.Volume, ref.Disk
	role, err := e.node.Primaries().Role(ctx, volume)
	if err != nil {
		// Without etcd this node cannot know whether it is the primary:
		// refuse rather than write one copy.
		return nbd.Export{}, fmt.Errorf("export %s: %w", volume+"/"+disk, err)
	}
	if !role.Placed {
		return e.Exports.Open(ctx, name, peer) // this node's alone
	}
	if role.Replicas <= 1 {
		if role.IsPrimary(e.node.Name()) || role.Primary == "" {
			return e.Exports.Open(ctx, name, peer)
		}
		// Its one copy is another node's: forwarded there, as a
		// replicated volume's client is to its primary, so that any
		// node serves any volume (a CSI node plugin's one --nbd).
		return e.forward(ctx, name, volume)
	}
	if !role.IsPrimary(e.node.Name()) {
		if replica.IsCredential(ref.Token) {
			// The primary's connection to this node's copy.
			return e.openSession(ctx, volume, disk, ref.Token, role, peer)
		}
		// A client: its requests go to the primary of the moment
		// (failover.go). A copy is written by its primary only.
		return e.forward(ctx, name, volume)
	}
	prim, err := e.node.Primaries().HoldPrimary(ctx, volume)
	if errors.Is(err, cluster.ErrNotPrimary) {
		return e.forward(ctx, name, volume) // failed over since Role
	}
	if err != nil {
		return nbd.Export{}, fmt.Errorf("export %s: %w", volume+"/"+disk, err)
	}
	ex, err := e.Exports.Open(ctx, name, peer)
	if err != nil {
		return ex, err
	}
	var set *replica.Set
	var release func()
	if !ex.Disk.ReadOnly() {
		// The primary at prim.Term, in sync or degraded: every change
		// goes through the disk's Set of this term, which writes the
		// in-sync copies (once they followed the term) and tracks what
		// the copies out of sync miss.
		role, err := followedRole(ctx, e.node, volume, prim.Term)
		if err != nil {
			_ = ex.Disk.Close()
			return nbd.Export{}, fmt.Errorf("export %s: %w", volume+"/"+disk, err)
		}
		ent, err := e.sets.acquire(ctx, volume, disk, role, ex.Disk.Size())
		if err != nil {
			_ = ex.Disk.Close()
			return nbd.Export{}, fmt.Errorf("export %s: %w", volume+"/"+disk, err)
		}
		e.log.Debug("replicated export opened", "volume", volume, "disk", disk, "term", role.Term, "inSync", ent.set.InSync())
		set, release = ent.set, func() { e.sets.release(ent) }
	}
	ex.Disk = primaryHandle(ex.Disk, set, release, e.node, prim,
		func() bool { return e.sets.retiredAt(volume, prim.Term) })
	return ex, nil
}

// openSession opens a replication session of volume's primary on this
// node's copy of disk (replica.Sessions): the credential must be signed
// with the cluster's replication key for this node's instance, by the
// volume's primary at its term, which this copy follows, and be newer than
// every other session of the disk, which it fences. The copy is then
// written through its attachment for that term, whose token never leaves
// this node. Every refusal is the same to the peer: not authorized.
func (e Exports) openSession(ctx context.Context, volume, disk, token string, role cluster.Role,
	peer string) (nbd.Export, error) {
	refuse := func(err error) (nbd.Export, error) {
		// Why is for the log; the peer learns only that it was refused.
		e.log.Warn("replication session refused", "volume", volume, "disk", disk, "peer", peer, "err", err)
		return nbd.Export{}, fmt.Errorf("export %s: %w", volume+"/"+disk, pool.ErrUnauthorized)
	}
	cred, err := replica.ParseCredential(volume, disk, token)
	if err != nil {
		return refuse(err)
	}
	cred.Copy, cred.Instance = e.node.Name(), e.node.Instance()
	if err := cred.Verify(e.node.ReplicationKey()); err != nil {
		return refuse(err)
	}
	switch {
	case cred.Primary != role.Primary || cred.Term != role.Term:
		return refuse(fmt.Errorf("%w: %s at term %d is not the primary now (%s at term %d)", replica.ErrSessionRefused,
			cred.Primary, cred.Term, role.Primary, role.Term))
	case role.CopyTerm != cred.Term:
		return refuse(fmt.Errorf("%w: this copy follows term %d, not %d", replica.ErrSessionRefused, role.CopyTerm, cred.Term))
	}
	v, err := e.pool.Volume(volume)
	if err != nil {
		return nbd.Export{}, fmt.Errorf("export %s: %w", volume+"/"+disk, err)
	}
	sess, err := e.sessions.Begin(v.Info().UID, cred)
	if err != nil {
		return refuse(err)
	}
	// The copy's attachment for this term, made when it followed the
	// term (cluster's followTerm): found again by its idempotency key.
	att := replicaAttachment(cred.Primary, cred.Term)
	a, _, err := v.AttachWith(att, api.ModeReadWrite, pool.Idempotency{Key: att})
	if err != nil {
		return nbd.Export{}, fmt.Errorf("export %s: %w", volume+"/"+disk, err)
	}
	ex, err := e.Exports.Open(ctx, volume+"/"+disk+"/"+a.Token, peer)
	if err != nil {
		return ex, err
	}
	ex.Disk = sess.Disk(ex.Disk)
	e.log.Debug("replication session opened", "volume", volume, "disk", disk, "primary", cred.Primary,
		"term", cred.Term, "epoch", cred.Epoch)
	return ex, nil
}

// copyOf is how this primary reaches copy t of volume's disk at term: each
// connection is a new replication session, signed for the copy's node and
// instance.
func (r *Volumes) copyOf(volume, disk string, term uint64, t cluster.Target) replica.Copy {
	key, me := r.node.ReplicationKey(), r.node.Name()
	return replica.Copy{Node: t.Node, Addr: t.NBD, Session: func() string {
		return replica.Credential{Volume: volume, Disk: disk, Primary: me, Copy: t.Node, Instance: t.Instance,
			Term: term, Epoch: replica.NewEpoch()}.Export(key)
	}}
}

// setDisk is a handle of a disk through its Set; closing it releases the
// Set. It is the replica.Disk in every other way: each method passes to it,
// with its capabilities (none), and nothing is embedded, so that a method
// added to pool.Disk or to replica.Disk reaches no client unchecked.
type setDisk struct {
	disk    *replica.Disk
	once    sync.Once
	release func()
}

var _ pool.Disk = (*setDisk)(nil)

func (d *setDisk) Size() int64                      { return d.disk.Size() }
func (d *setDisk) ReadOnly() bool                   { return d.disk.ReadOnly() }
func (d *setDisk) ReadAt(p []byte, off int64) error { return d.disk.ReadAt(p, off) }
func (d *setDisk) WriteAt(p []byte, off int64, fua bool) error {
	return d.disk.WriteAt(p, off, fua)
}
func (d *setDisk) Flush() error                           { return d.disk.Flush() }
func (d *setDisk) Trim(off, length int64, fua bool) error { return d.disk.Trim(off, length, fua) }
func (d *setDisk) Zero(off, length int64, flags pool.ZeroFlags) error {
	return d.disk.Zero(off, length, flags)
}
func (d *setDisk) Cache(off, length int64) error { return d.disk.Cache(off, length) }
func (d *setDisk) Extents(off, length int64, limit int) ([]pool.Extent, error) {
	return d.disk.Extents(off, length, limit)
}

// Capabilities offers none: the replica.Disk offers none, and one it
// offered would be its own, not setDisk's (pool.CapabilitiesOf).
func (d *setDisk) Capabilities() pool.Capabilities { return pool.Capabilities{} }

func (d *setDisk) Close() error {
	err := d.disk.Close()
	d.once.Do(d.release)
	return err
}

// Volumes are the replicated volumes of this node: the replication Set of
// each replicated disk this node is the primary of, while a handle or a
// resync uses it, and one RangeLock per disk for the server's life (one
// small map entry per replicated disk ever opened).
type Volumes struct {
	node    *cluster.Node
	pool    *pool.Pool
	log     *slog.Logger
	metrics *replMetrics
	// rate limits each resync and rebuild (bytes per second; 0: none).
	rate int64
	// rebuildAfter is how long a copy's node may be gone before the copy
	// is rebuilt on another node (0: never).
	rebuildAfter time.Duration
	jobs         *job.Manager

	// bitmaps are the dirty bitmaps open in this process, by pool path
	// (openBitmap); an entry whose file closed is replaced when opened
	// again.
	bmu     sync.Mutex
	bitmaps map[string]*replica.Bitmap
	// activity are the activity logs open in this process, by pool path
	// (openActivity), the same way.
	activity map[string]*replica.ActivityLog

	mu     sync.Mutex
	ranges map[string]*replica.RangeLock
	m      map[string]*setEntry
	// retired: per volume, the term up to which this node handed it over
	// (drain.go); its handles of those terms abandon every request.
	retired map[string]uint64
	// intents are the intents of changes at the cut this process began
	// (intent.go).
	intents intentsHere
	// atStep is Options.AtStep.
	atStep func(step string)
}

type setEntry struct {
	key, uid string
	term     uint64
	set      *replica.Set
	refs     int
}

func newReplicaSets(node *cluster.Node, p *pool.Pool, log *slog.Logger, m *replMetrics, cfg cluster.Config,
	jobs *job.Manager) *Volumes {
	return &Volumes{node: node, pool: p, log: log, metrics: m, rate: cfg.ResyncRate, rebuildAfter: cfg.RebuildAfter, jobs: jobs,
		ranges: map[string]*replica.RangeLock{}, m: map[string]*setEntry{}}
}

// acquire returns the Set of a disk of a volume this node is the primary of
// (role), making it when there is none for this volume's local copy and
// term; release gives it back. A Set follows a term change: a handle or
// resync of a new term gets a new Set, made from the copies as they are at
// that term (each in-sync copy written through its attachment of that
// term); the older term's Set stays with its last users, whose writes the
// copies refuse (term fencing) and whose answers the lease fencing holds.
func (r *Volumes) acquire(ctx context.Context, volume, disk string, role cluster.Role, size int64) (*setEntry, error) {
	// An intent left behind is settled before any Set of the volume
	// writes at this term.
	if err := r.settleFirst(ctx, volume); err != nil {
		return nil, fmt.Errorf("settle the intent on %s: %w: %w", volume, cluster.ErrNotReady, err)
	}
	for _, t := range role.Targets {
		if t.Term < role.Term {
			// An in-sync copy that has not followed this term yet: wait
			// for it (or record it out of sync).
			var err error
			if role, err = followedRole(ctx, r.node, volume, role.Term); err != nil {
				return nil, err
			}
			break
		}
	}
	v, err := r.pool.Volume(volume)
	if err != nil {
		return nil, err
	}
	uid := v.Info().UID
	key := volume + "/" + disk
	r.mu.Lock()
	defer r.mu.Unlock()
	if e := r.m[key]; e != nil && e.uid == uid && e.term == role.Term {
		e.refs++
		return e, nil
	}
	if r.ranges[key] == nil {
		r.ranges[key] = replica.NewRangeLock()
	}
	fsys := r.pool.FS()
	copies := make([]replica.Copy, 0, len(role.Targets))
	for _, t := range role.Targets {
		// A bitmap of a copy in sync is left from a crash after the copy
		// went back in sync: it is stale.
		if err := fsys.Remove(replica.BitmapPath(uid, disk, t.Node)); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return nil, fmt.Errorf("remove the stale dirty bitmap of copy %s: %w", t.Node, err)
		}
		copies = append(copies, r.copyOf(volume, disk, role.Term, t))
	}
	behind := make([]string, 0, len(role.Behind))
	for _, b := range role.Behind {
		behind = append(behind, b.Node)
	}
	term := role.Term
	al, err := r.openActivity(replica.ActivityPath(uid, disk), term)
	if err != nil {
		return nil, err
	}
	set, err := replica.NewSet(ctx, size, copies, behind, replica.Options{
		OutOfSync: func(node string, cause error) error { return r.node.Copies().MarkOutOfSync(volume, node, term, cause) },
		Diverged:  func(node string, cause error) error { return r.node.Copies().MarkDiverged(volume, node, term, cause) },
		Bitmap: func(node string) (*replica.Bitmap, bool, error) {
			return r.openBitmap(replica.BitmapPath(uid, disk, node), size)
		},
		Latency:  r.metrics.observeLatency,
		Ranges:   r.ranges[key],
		Activity: al,
	})
	if err != nil {
		_ = al.Close()
		return nil, err
	}
	e := &setEntry{key: key, uid: uid, term: term, set: set, refs: 1}
	r.m[key] = e
	return e, nil
}

// openBitmap opens the dirty bitmap rel of a disk of size bytes, shared by
// every Set of this process that tracks it (Sets of two terms of one disk
// can live at once): a Mark writes whole words from its Bitmap's memory,
// so two Bitmaps of one file would write over each other's bits.
func (r *Volumes) openBitmap(rel string, size int64) (*replica.Bitmap, bool, error) {
	r.bmu.Lock()
	defer r.bmu.Unlock()
	if b := r.bitmaps[rel]; b != nil {
		if s := b.Share(size); s != nil {
			return s, false, nil
		}
	}
	b, created, err := replica.OpenBitmap(r.pool.FS(), rel, size, replica.DefaultGranule)
	if err != nil {
		return nil, false, err
	}
	if r.bitmaps == nil {
		r.bitmaps = map[string]*replica.Bitmap{}
	}
	r.bitmaps[rel] = b
	return b, created, nil
}

// openActivity opens the activity log rel of a disk for its primary at
// term, shared by every Set of this process that writes the disk (Sets of
// two terms of one disk can live at once; a later term's moves the log to
// its term, replica.ActivityLog.Advance). The process keeps it open once
// opened (one file per replicated disk it was the primary of): opened
// again from its file at the same term, a log pins every extent it holds,
// as after a crash, so a Set made again when a client comes back must find
// the log in memory, with what it knows of each extent.
func (r *Volumes) openActivity(rel string, term uint64) (*replica.ActivityLog, error) {
	r.bmu.Lock()
	defer r.bmu.Unlock()
	if l := r.activity[rel]; l != nil {
		if s := l.Share(); s != nil {
			if err := s.Advance(max(term, s.Term())); err != nil {
				_ = s.Close()
				return nil, err
			}
			return s, nil
		}
	}
	l, err := replica.OpenActivityLog(r.pool.FS(), rel, term, 0, 0)
	if err != nil {
		return nil, err
	}
	if r.activity == nil {
		r.activity = map[string]*replica.ActivityLog{}
	}
	r.activity[rel] = l
	return l.Share(), nil
}

// release gives a Set back; the last user closes it (its bitmaps stay on
// disk for the next).
func (r *Volumes) release(e *setEntry) {
	r.mu.Lock()
	e.refs--
	last := e.refs == 0
	if last && r.m[e.key] == e {
		delete(r.m, e.key)
	}
	r.mu.Unlock()
	if last {
		e.set.Close()
	}
}

// replMetrics are the replication's: copy latency and resyncs.
type replMetrics struct {
	latency      *prometheus.HistogramVec
	resyncBytes  prometheus.Counter
	resyncs      *prometheus.CounterVec
	resyncActive prometheus.Gauge
}

func newReplMetrics() *replMetrics {
	return &replMetrics{
		latency: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "quiver_cluster_replication_latency_seconds",
			Help:    "Time a copy took to answer a change or flush forwarded by this primary.",
			Buckets: prometheus.ExponentialBuckets(0.0001, 2, 16)}, []string{"copy"}),
		resyncBytes: prometheus.NewCounter(prometheus.CounterOpts{Name: "quiver_cluster_resync_bytes_total",
			Help: "Bytes of dirty granules copied to copies coming back (resync and rebuild)."}),
		resyncs: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "quiver_cluster_resyncs_total",
			Help: "Resyncs run by this primary, by result (ok: the copy is in sync again)."}, []string{"result"}),
		resyncActive: prometheus.NewGauge(prometheus.GaugeOpts{Name: "quiver_cluster_resyncs_running",
			Help: "Resyncs running on this primary now (their progress is quiver_cluster_copy_resync_progress_ratio)."}),
	}
}

func (m *replMetrics) collectors() []prometheus.Collector {
	return []prometheus.Collector{m.latency, m.resyncBytes, m.resyncs, m.resyncActive}
}

func (m *replMetrics) observeLatency(node string, d time.Duration) {
	m.latency.WithLabelValues(node).Observe(d.Seconds())
}
