package api

import "time"

// Version is the path prefix of every route of this API.
const Version = "/v1"

// DefaultAddr is where `quiver server` listens for the HTTP API when it is
// given no address: loopback only.
const DefaultAddr = "127.0.0.1:7480"

// IdempotencyKeyHeader names a create request (POST of a volume, disk,
// snapshot, clone or attachment). The key, at most 256 printable ASCII
// characters, is stored with the object made. A create of a taken name is
// 409 AlreadyExists, unless the request carries the key the object was made
// with and asks for the same spec (then the object is the answer, 200), or
// QueryIdempotent is "true".
const IdempotencyKeyHeader = "Idempotency-Key"

// Query parameters.
const (
	// QueryIdempotent "true" makes a create of a taken name answer with the
	// existing object when its spec is the same, whatever key made it.
	QueryIdempotent = "idempotent"
	// QueryForce "true" lets a rollback or a disk removal go ahead while
	// writers are connected to the volume (else 409 InUse).
	QueryForce = "force"
	// QueryRecursive "true" deletes a volume's snapshots with it; without
	// it a volume with snapshots is refused (409 HasSnapshots).
	QueryRecursive = "recursive"
	// QueryShred "true" crypto-shreds an encrypted volume as it is deleted:
	// the KEKs of its data key are destroyed first, so no copy of its data
	// can be read again. QueryShredAlso names (comma-separated) the clones
	// that share its data key, shredded with it; without them such a
	// volume is refused (409 KeyShared).
	QueryShred     = "shred"
	QueryShredAlso = "shredAlso"
)

// DiskSpec describes one virtual disk: a sparse raw file <name>.img.
type DiskSpec struct {
	Name string `json:"name"`
	Size int64  `json:"size"` // virtual size in bytes, a multiple of 512
	// Shared exempts the disk from the single-writer rule: every rw
	// attachment may write it at once (guest clusters with shareable
	// disks). Opt-in only.
	Shared bool `json:"shared,omitempty"`
}

// QoS limits the I/O of a whole VM: one budget across all its disks. Zero
// means unlimited; MBytes are 10^6 bytes per second. Read and write are
// counted together by the rw limits.
type QoS struct {
	RWIOPS      int64 `json:"rwIOPS,omitempty"`
	RWMBytes    int64 `json:"rwMBytes,omitempty"`
	ReadIOPS    int64 `json:"readIOPS,omitempty"`
	WriteIOPS   int64 `json:"writeIOPS,omitempty"`
	ReadMBytes  int64 `json:"readMBytes,omitempty"`
	WriteMBytes int64 `json:"writeMBytes,omitempty"`
}

// VolumeSpec is the body of POST /v1/volumes. A volume holds every disk of
// one VM.
type VolumeSpec struct {
	Name     string            `json:"name"`
	Capacity int64             `json:"capacity"` // budget in bytes for the sum of disk sizes
	Labels   map[string]string `json:"labels,omitempty"`
	Disks    []DiskSpec        `json:"disks,omitempty"`
	QoS      *QoS              `json:"qos,omitempty"`
	// Replicas is how many nodes keep a copy (0 means 1). Above 1 it needs
	// a cluster with that many nodes up (docs/cluster.md): else 422
	// NotEnoughNodes, and nothing is made.
	Replicas int `json:"replicas,omitempty"`
	// Tenant owns the volume (docs/security.md, "Tenants"). Only an admin
	// sets it; a tenant's token always makes volumes of its own tenant.
	Tenant string `json:"tenant,omitempty"`
	// Encrypt makes an encrypted volume (docs/encryption.md): its disks
	// are stored as ciphertext under a data key of its own, wrapped by the
	// server's key provider. Without a key provider: 422 NoKeyProvider.
	Encrypt bool `json:"encrypt,omitempty"`
}

// Source names where a clone came from.
type Source struct {
	Volume   string `json:"volume"`
	Snapshot string `json:"snapshot,omitempty"` // empty: cloned from the live volume
}

// Volume is the state of one volume as the API reports it.
type Volume struct {
	Name string `json:"name"`
	// Tenant owns the volume; empty for none. A tenant's token sees its
	// volumes by their own names; an admin by the pool's name
	// (<tenant>--<name>).
	Tenant    string            `json:"tenant,omitempty"`
	UID       string            `json:"uid"`
	Capacity  int64             `json:"capacity"`
	Labels    map[string]string `json:"labels,omitempty"`
	Disks     []Disk            `json:"disks"`
	Source    *Source           `json:"source,omitempty"`
	QoS       *QoS              `json:"qos,omitempty"`
	Snapshots int               `json:"snapshots"`
	CreatedAt time.Time         `json:"createdAt"`
	// Path is the directory holding the disk images (what CSI publishes).
	Path string `json:"path"`
	// Writer is the single-writer state: which attachment may write.
	Writer Writer `json:"writer"`
	// State is VolumeBroken for a volume quarantined at start-up because
	// its files are damaged or hostile (Reason says why; only Name is set
	// besides), and empty for a healthy volume.
	State  string `json:"state,omitempty"`
	Reason string `json:"reason,omitempty"`
	// Replicas is how many nodes keep a copy (1 on a single node).
	Replicas int `json:"replicas,omitempty"`
	// BackupPolicy is the volume's backup schedule and retention, when it
	// has one (PUT /v1/volumes/{volume}/backup-policy).
	BackupPolicy *BackupPolicy `json:"backupPolicy,omitempty"`
	// DRPolicy is the volume's DR relationship, when it has one (PUT
	// /v1/volumes/{volume}/dr-policy).
	DRPolicy *DRPolicy `json:"drPolicy,omitempty"`
	// DirectAccess names the nodes that hand a VM the image files
	// themselves (a single node's Filesystem-mode PVC): change tracking
	// counts every disk changed meanwhile, so backups read them whole.
	DirectAccess []string `json:"directAccess,omitempty"`
	// Encryption, for an encrypted volume, names the key-encryption key
	// that wraps its data key; never any key material.
	Encryption *Encryption `json:"encryption,omitempty"`
	// Restore reports an instant restore still copying the volume's
	// content in: the volume is served meanwhile, but snapshots, clones
	// and backups of it wait until the copy is done.
	Restore *RestoreProgress `json:"restore,omitempty"`
	// Copies, Primary and Term say where a cluster keeps the volume: absent
	// on a single node.
	Copies  []Copy `json:"copies,omitempty"`
	Primary string `json:"primary,omitempty"`
	Term    uint64 `json:"term,omitempty"`
}

// Encryption names the key that wraps an encrypted volume's data key.
type Encryption struct {
	Provider string `json:"provider"` // the key provider: "keyfile" or "kmip"
	KeyID    string `json:"keyId"`    // the key-encryption key's id in that provider
	// Rekey reports a deep rekey in progress, or interrupted (Running
	// false: run it again to finish it).
	Rekey *RekeyProgress `json:"rekey,omitempty"`
}

// RekeyProgress is a deep rekey's progress: the bytes of the disks under
// the new data key so far.
type RekeyProgress struct {
	Started    time.Time `json:"started"`
	DoneBytes  int64     `json:"doneBytes"`
	TotalBytes int64     `json:"totalBytes"`
	Running    bool      `json:"running"`
}

// RekeySpec asks for a rekey of an encrypted volume (POST
// /v1/volumes/{volume}/rekey). Shallow (the default): the data key is
// wrapped under a new key-encryption key, in Provider if given, and the old
// KEK is destroyed; no block changes. Deep: a new data key, every block
// re-encrypted while the VM runs, at most Rate bytes per second (0: the
// server's default), as a job; an interrupted one goes on where it
// stopped when asked again.
type RekeySpec struct {
	Deep     bool   `json:"deep,omitempty"`
	Provider string `json:"provider,omitempty"`
	Rate     int64  `json:"rate,omitempty"`
}

// RestoreProgress is an instant restore's copy (Volume.Restore).
type RestoreProgress struct {
	Source      string    `json:"source"` // backup:<target>:<id>
	Started     time.Time `json:"started"`
	CopiedBytes int64     `json:"copiedBytes"`
	TotalBytes  int64     `json:"totalBytes"`
}

// Copy states (Copy.State).
const (
	CopyInSync = "in-sync" // holds every acknowledged write
	CopyFailed = "failed"  // could not be made (Reason says why)
	// CopyDegraded: left the in-sync set (unreachable, or a write failed
	// there); it lacks writes acknowledged since, and Reason says why.
	CopyDegraded = "degraded"
	// CopyResyncing: a degraded copy being brought back by its primary
	// (Copy.Progress says how far).
	CopyResyncing = "resyncing"
	// CopyDeleted: a copy of a volume being deleted (VolumeDeleting) that
	// its node has deleted; the volume goes once its other copies have.
	CopyDeleted = "deleted"
)

// Copy is one node's copy of a volume.
type Copy struct {
	Node string `json:"node"`
	// State is CopyInSync, CopyDegraded, CopyResyncing, CopyFailed,
	// CopyDeleted, a word of the cluster's own for a copy being moved
	// ("rebuilding", "removing") or not deleted ("delete-failed"), or ""
	// while its node makes it.
	State  string `json:"state"`
	Reason string `json:"reason,omitempty"`
	// Progress is a resync's, in percent of the bytes to copy, with those
	// bytes (CopyResyncing only).
	Progress   *float64 `json:"progress,omitempty"`
	DoneBytes  int64    `json:"doneBytes,omitempty"`
	TotalBytes int64    `json:"totalBytes,omitempty"`
}

// Node states (Node.State).
const (
	NodeUp   = "up"   // holds its etcd lease
	NodeDown = "down" // a member whose lease expired or that left
)

// Node is one storage node, the body of GET /v1/nodes (in a List). A single
// node without cluster flags lists itself.
type Node struct {
	Name          string `json:"name"`
	Address       string `json:"address,omitempty"` // host:port of its API; empty while down
	NBD           string `json:"nbd,omitempty"`     // host:port of its NBD server, when served
	State         string `json:"state"`
	FailureDomain string `json:"failureDomain,omitempty"`
	CapacityBytes int64  `json:"capacityBytes"` // the pool's filesystem size, as last reported
	FreeBytes     int64  `json:"freeBytes"`
	Volumes       int    `json:"volumes"` // volumes with a copy on the node
	// Self marks the node that answered.
	Self bool `json:"self,omitempty"`
	// Drain is NodeDraining or NodeDrained while the node is drained
	// (`quiver node drain`): no new copy is placed on it.
	Drain string `json:"drain,omitempty"`
}

// NodeAdd is the body of POST /v1/nodes: a node to add to the cluster's
// embedded etcd (docs/cluster.md, "Adding and removing nodes").
type NodeAdd struct {
	Name string `json:"name"`
	// PeerURLs are the URLs the new node's etcd member listens on for its
	// peers (its --initial-cluster entry), e.g. https://10.0.0.14:2380.
	PeerURLs []string `json:"peerURLs"`
}

// NodeAdded answers POST /v1/nodes: the etcd member added (a learner until
// the new node has caught up and promoted itself) and the flags the new
// node starts with, besides its own (--cluster-name, --node-name, its
// certificates).
type NodeAdded struct {
	Name     string   `json:"name"`
	MemberID string   `json:"memberID"` // etcd's member ID, hex
	PeerURLs []string `json:"peerURLs"`
	// InitialCluster is the new node's --initial-cluster.
	InitialCluster string `json:"initialCluster"`
	// InitialClusterState is its --initial-cluster-state: "existing".
	InitialClusterState string `json:"initialClusterState"`
	// Flags are both, as arguments of quiver server.
	Flags []string `json:"flags"`
}

// NodeRemoved answers DELETE /v1/nodes/{node}: the node's records are
// gone, its identity is refused from now on, and its etcd member is
// removed.
type NodeRemoved struct {
	Name   string `json:"name"`
	NodeID string `json:"nodeID,omitempty"`
	// MemberID is the etcd member removed, hex ("" when it had none).
	MemberID string `json:"memberID,omitempty"`
	// EtcdMembers is how many voting etcd members are left.
	EtcdMembers int `json:"etcdMembers"`
}

// NodeReplace is the body of POST /v1/nodes/{node}/replace: the node that
// takes the copies of the node replaced, which is gone (docs/cluster.md,
// "Replacing a dead node"). The answer is the job (kind "replace"), or
// without ?async=true the NodeRemoved once it is done.
type NodeReplace struct {
	New string `json:"new"`
}

// Drain states (Node.Drain).
const (
	NodeDraining = "draining" // a drain job moves its copies away
	NodeDrained  = "drained"  // it holds no copy; placement skips it until undrained
)

// VolumeBroken is the State of a quarantined volume: listed, not served,
// every operation refused with CodeBroken.
const VolumeBroken = "broken"

// VolumeDeleting is the State of a cluster volume being deleted whose
// copies are not all gone yet (a copy's node is down): listed, and
// refused for attach, snapshot, clone and a new volume of its name with
// CodeDeleting; it goes by itself when the last copy is gone.
const VolumeDeleting = "deleting"

// Writer is a volume's single-writer state. Epoch grows by one each time the
// writer role moves; Attachment is the attachment holding it ("" for none,
// "implicit" for tokenless loopback connections).
type Writer struct {
	Epoch      uint64 `json:"epoch"`
	Attachment string `json:"attachment,omitempty"`
}

// Attachment modes.
const (
	ModeReadWrite = "rw"
	ModeReadOnly  = "ro"
)

// Attachment states (Attachment.State).
const (
	AttachmentWriter   = "writer"    // holds the writer role
	AttachmentStandby  = "standby"   // rw; its first write takes the writer role
	AttachmentFenced   = "fenced"    // lost the writer role; reads still work
	AttachmentReadOnly = "read-only" // never writes: an ro attachment, or a tokenless connection while an rw attachment exists
)

// AttachmentSpec is the body of POST /v1/volumes/{volume}/attachments: attach
// every disk of the volume for one node. Attaching the same node again with
// the same mode returns the existing attachment and its token.
type AttachmentSpec struct {
	Node string `json:"node"`
	Mode string `json:"mode,omitempty"` // "rw" (default) or "ro"
}

// Attachment lets one node reach a volume's disks over NBD. NBD clients
// present Token in the export name: <volume>/<disk>/<token>.
type Attachment struct {
	ID     string `json:"id"`
	Volume string `json:"volume"`
	Node   string `json:"node"`
	Mode   string `json:"mode"`
	Token  string `json:"token,omitempty"` // only in create responses
	// URIs are the NBD URIs of the volume's disks for this attachment, by
	// disk name (nbd://host:port/<volume>/<disk>/<token>, nbds:// when the
	// node requires TLS, nbd+unix:// on a socket): only in create
	// responses, as they hold the token.
	URIs     map[string]string `json:"uris,omitempty"`
	Implicit bool              `json:"implicit,omitempty"`
	Writer   bool              `json:"writer"` // holds the writer role now
	Fenced   bool              `json:"fenced"` // lost the writer role: its writes are refused
	// State is what the attachment may do now: AttachmentWriter,
	// AttachmentStandby, AttachmentFenced or AttachmentReadOnly.
	State     string    `json:"state"`
	Conns     int       `json:"connections"`
	CreatedAt time.Time `json:"createdAt"`
}

// Disk is one disk of a volume or snapshot.
type Disk struct {
	Name      string `json:"name"`
	Size      int64  `json:"size"`
	Allocated int64  `json:"allocated"` // bytes the file occupies on the pool
	Path      string `json:"path"`
	Shared    bool   `json:"shared,omitempty"`
}

// VolumeUpdate is the body of PATCH /v1/volumes/{volume}. Capacity can only
// grow; absent or null leaves it. Labels replaces the whole label map: absent
// or null leaves the labels, {} removes them all.
type VolumeUpdate struct {
	Capacity *int64            `json:"capacity,omitempty"`
	Labels   map[string]string `json:"labels"`
	QoS      *QoS              `json:"qos,omitempty"` // replaces all limits; {} removes them
}

// DiskUpdate is the body of PATCH /v1/volumes/{volume}/disks/{disk}. The size
// can only grow.
type DiskUpdate struct {
	Size int64 `json:"size"`
}

// SnapshotSpec is the body of POST /v1/volumes/{volume}/snapshots.
type SnapshotSpec struct {
	Name string `json:"name"`
}

// Snapshot is a crash-consistent image of every disk of a volume taken at one
// instant.
type Snapshot struct {
	Name      string    `json:"name"`
	UID       string    `json:"uid"`
	Volume    string    `json:"volume"`
	Disks     []Disk    `json:"disks"`
	Method    string    `json:"method"` // "reflink" or "copy"
	CreatedAt time.Time `json:"createdAt"`
	// GateHeld is how long new writes were held while the snapshot was taken.
	GateHeld time.Duration `json:"gateHeldNs"`
}

// SnapshotChanges is GET /v1/volumes/{volume}/snapshots/{snapshot}/changes:
// what changed in each disk between the snapshot (From) and another one
// (To), or the live disks (To empty). Every byte that differs is in a
// disk's Ranges; more may be (tracking is per 64 KiB, per 1 MiB for the
// writes just before a crash).
type SnapshotChanges struct {
	Volume string        `json:"volume"`
	From   string        `json:"from"`
	To     string        `json:"to,omitempty"`
	Disks  []DiskChanges `json:"disks"`
}

// DiskChanges is one disk's part of SnapshotChanges. Whole: every byte may
// differ (the disk is new since From, or was replaced by a rollback).
type DiskChanges struct {
	Disk     string  `json:"disk"`
	Size     int64   `json:"size"`
	BaseSize int64   `json:"baseSize"` // 0: the disk is not in From
	Whole    bool    `json:"whole"`
	Changed  int64   `json:"changed"` // bytes in Ranges
	Ranges   []Range `json:"ranges"`
}

// Range is a byte range of a disk.
type Range struct {
	Offset int64 `json:"offset"`
	Length int64 `json:"length"`
}

// BackupTarget is a backup target of the server (GET /v1/backup-targets):
// an object store holding a backup repository.
type BackupTarget struct {
	Name       string `json:"name"`
	Store      string `json:"store"`                // s3://endpoint/bucket/prefix
	Repository string `json:"repository,omitempty"` // the repository's id, once it opens
	Error      string `json:"error,omitempty"`      // why it does not open now
}

// BackupPolicy is a volume's backup schedule and retention (the body of
// PUT /v1/volumes/{volume}/backup-policy). Every is a Go duration ("1h",
// "30m"), at least a minute. Keep*: the newest N backups, and the newest
// of each of the last N days, ISO weeks and months; all zero keeps every
// backup.
type BackupPolicy struct {
	Every       string `json:"every"`
	Target      string `json:"target,omitempty"` // "" for the server's only target
	KeepLast    int    `json:"keepLast,omitempty"`
	KeepDaily   int    `json:"keepDaily,omitempty"`
	KeepWeekly  int    `json:"keepWeekly,omitempty"`
	KeepMonthly int    `json:"keepMonthly,omitempty"`
}

// BackupStatus is a volume's backups to a target (GET /v1/backup-status).
type BackupStatus struct {
	Volume      string    `json:"volume"`
	Target      string    `json:"target"`
	Every       string    `json:"every,omitempty"` // the policy's, "" without one
	LastSuccess time.Time `json:"lastSuccess,omitzero"`
	LastBackup  string    `json:"lastBackup,omitempty"`
	LastError   string    `json:"lastError,omitempty"` // of the last attempt, when it failed
	Overdue     bool      `json:"overdue"`             // older than 1.5 times the policy's interval
	BytesSent   int64     `json:"bytesSent"`           // by the newest backup
	Dedup       float64   `json:"dedup"`               // share of its chunks already stored
	Failures    int64     `json:"failures"`            // since the server started
}

// BackupSpec is the body of POST /v1/volumes/{volume}/backups.
type BackupSpec struct {
	Target string `json:"target,omitempty"` // "" when the server has one target
	Full   bool   `json:"full,omitempty"`   // read every disk whole, even with a base
}

// Backup is one whole-VM backup in a target.
type Backup struct {
	ID        string            `json:"id"`
	Target    string            `json:"target"`
	Volume    string            `json:"volume"`
	Snapshot  string            `json:"snapshot"`
	Parent    string            `json:"parent,omitempty"` // the backup it is incremental from
	CreatedAt time.Time         `json:"createdAt"`
	Labels    map[string]string `json:"labels,omitempty"`
	Disks     []Disk            `json:"disks"`
	Stats     BackupStats       `json:"stats"`
}

// BackupStats say what a backup cost.
type BackupStats struct {
	Logical      int64         `json:"logical"`      // the disks' total size
	BytesRead    int64         `json:"bytesRead"`    // read from the disks
	BytesSent    int64         `json:"bytesSent"`    // stored, compressed and encrypted
	ChunksNew    int           `json:"chunksNew"`    // 64 KiB blocks stored
	ChunksReused int           `json:"chunksReused"` // blocks deduplicated
	ChunksZero   int           `json:"chunksZero"`   // blocks of zeros, not stored
	Duration     time.Duration `json:"durationNs"`
}

// RestoreSpec is the body of POST /v1/backups/{id}/restore.
type RestoreSpec struct {
	Volume string   `json:"volume"`          // the new volume
	Disks  []string `json:"disks,omitempty"` // only these disks (all when empty)
	// Instant makes the volume at once, served while its content is
	// copied in (Volume.Fill reports the copy); the answer is the volume
	// (201), not a job.
	Instant bool `json:"instant,omitempty"`
}

// BackupVerify is the result of POST /v1/backups/{id}/verify.
type BackupVerify struct {
	Backup string     `json:"backup"`
	Bad    []BadChunk `json:"bad"`
}

// BadChunk is a block of a backup that does not read back intact: its id,
// the pack that holds it, and the first disk and offset that use it.
type BadChunk struct {
	ID     string `json:"id"`
	Pack   string `json:"pack,omitempty"`
	Disk   string `json:"disk"`
	Offset int64  `json:"offset"`
	Error  string `json:"error"`
}

// SnapshotAllocated is GET
// /v1/volumes/{volume}/snapshots/{snapshot}/allocated?disk=D[&offset=O][&limit=N]:
// the data ranges of one disk of a snapshot from Offset on, as the pool's
// filesystem reports them (SEEK_DATA and SEEK_HOLE, so per filesystem
// block): every byte outside Ranges reads as zero. A filesystem that cannot
// report holes gives one range to the disk's end. Ranges are sorted and
// never adjacent, and the first one starts at Offset or after it. At most
// limit ranges (default and at most MaxAllocatedRanges) are returned; Next,
// when not 0, is the offset to ask from for the rest.
type SnapshotAllocated struct {
	Volume   string  `json:"volume"`
	Snapshot string  `json:"snapshot"`
	Disk     string  `json:"disk"`
	Size     int64   `json:"size"`
	Offset   int64   `json:"offset"`
	Ranges   []Range `json:"ranges"`
	Next     int64   `json:"next,omitempty"`
}

// MaxAllocatedRanges bounds the ranges of one SnapshotAllocated answer.
const MaxAllocatedRanges = 4096

// RollbackSpec is the body of POST /v1/volumes/{volume}/rollback.
type RollbackSpec struct {
	Snapshot string `json:"snapshot"`
}

// CloneSpec is the body of POST /v1/clones: one or many new volumes from a
// snapshot, or from a live volume through an implicit snapshot.
type CloneSpec struct {
	Source Source            `json:"source"`
	Names  []string          `json:"names"`
	Labels map[string]string `json:"labels,omitempty"`
}

// MaxBulkClones bounds the names of one clone request.
const MaxBulkClones = 5000

// Job states.
const (
	JobRunning   = "running"
	JobSucceeded = "succeeded"
	JobFailed    = "failed"
	JobCancelled = "cancelled"
	// JobInterrupted: the server stopped while the job ran; shown after a
	// restart, with its partial work discarded.
	JobInterrupted = "interrupted"
)

// Job is a long operation (snapshot, rollback, clone) with its progress.
type Job struct {
	ID         string    `json:"id"`
	Kind       string    `json:"kind"`   // "snapshot", "rollback", "clone"
	Target     string    `json:"target"` // e.g. "web01@nightly" or "golden@v1 -> vdi-001..vdi-500"
	State      string    `json:"state"`
	BytesDone  int64     `json:"bytesDone"`
	BytesTotal int64     `json:"bytesTotal"`
	ItemsDone  int       `json:"itemsDone"`
	ItemsTotal int       `json:"itemsTotal"`
	Error      *Error    `json:"error,omitempty"`
	Result     []string  `json:"result,omitempty"` // names made so far
	StartedAt  time.Time `json:"startedAt"`
	EndedAt    time.Time `json:"endedAt,omitzero"`
}

// Capabilities are what the pool's filesystem can do, probed at start.
type Capabilities struct {
	Reflink         bool `json:"reflink"`
	CopyFileRange   bool `json:"copyFileRange"`
	SeekHole        bool `json:"seekHole"`
	BtrfsSubvolumes bool `json:"btrfsSubvolumes"`
	ExtentSizeHint  bool `json:"extentSizeHint"`
}

// PoolInfo is the body of GET /v1/pool. Its top-level fields are the
// answering node's own pool (identity, filesystem, capabilities, space and
// volumes), on a cluster node too; an admin's answer on a cluster adds
// ClusterPool, the cluster's figures, the same through every node.
type PoolInfo struct {
	ID           string       `json:"id"`
	Path         string       `json:"path"`
	Filesystem   string       `json:"filesystem"`
	Capabilities Capabilities `json:"capabilities"`
	TotalBytes   int64        `json:"totalBytes"`
	FreeBytes    int64        `json:"freeBytes"`
	// ProvisionedBytes is the sum of the virtual sizes of every disk: what
	// the VMs may write. Above TotalBytes the pool is overcommitted.
	ProvisionedBytes int64     `json:"provisionedBytes"`
	Volumes          int       `json:"volumes"`
	CreatedAt        time.Time `json:"createdAt"`
	// ChunkSize is the unit in which disks are kept cheap to snapshot
	// (docs/design/0001-pool-layout.md, chunk ownership); 0 when off.
	ChunkSize int64 `json:"chunkSize"`
	// ReadOnly: the pool cannot be written (read-only mount or no write
	// permission) and is served read-only.
	ReadOnly bool `json:"readOnly,omitempty"`
	// Broken counts the volumes quarantined at start-up.
	Broken int `json:"broken,omitempty"`
	// Cluster is the name of the cluster the answering node belongs to,
	// empty on a single node: on a cluster every volume is kept by the
	// cluster's nodes (replicated, fenced), and its disks reach a VM
	// through the compute node's endpoint, never as a copy's files.
	Cluster string `json:"cluster,omitempty"`
	// Tenant is set for a tenant's token: its quota and its use (on a
	// cluster, counted cluster-wide). Volumes and ProvisionedBytes are
	// then the tenant's own (docs/security.md, "Tenants").
	Tenant *Tenant `json:"tenant,omitempty"`
	// ClusterPool is the cluster's pool, for a caller without a tenant on
	// a cluster node (absent on a single node and for a tenant).
	ClusterPool *ClusterPool `json:"clusterPool,omitempty"`
}

// ClusterPool is the pool of a whole cluster (PoolInfo.ClusterPool): the
// space its nodes report in etcd and the volumes placed on them, the same
// answer whichever node is asked. A node's own volumes that are not placed
// (made before it joined) count in its PoolInfo, not here.
type ClusterPool struct {
	// TotalBytes and FreeBytes are the sums of the nodes' pool filesystems
	// as each last reported them (a node down reports nothing: 0).
	TotalBytes int64 `json:"totalBytes"`
	FreeBytes  int64 `json:"freeBytes"`
	// ProvisionedBytes is the sum of the disk sizes of the placed volumes,
	// once per volume whatever its number of copies; Volumes counts them
	// once each (those being deleted among them: they hold their space
	// until their last copy is gone).
	ProvisionedBytes int64 `json:"provisionedBytes"`
	Volumes          int   `json:"volumes"`
	// Nodes are the cluster's nodes by name.
	Nodes []PoolNode `json:"nodes"`
	// Unavailable says why the cluster's figures are missing (etcd out of
	// reach); the node's own in PoolInfo still hold.
	Unavailable string `json:"unavailable,omitempty"`
}

// PoolNode is one node's pool in a ClusterPool.
type PoolNode struct {
	Name  string `json:"name"`
	State string `json:"state"`           // NodeUp or NodeDown
	Drain string `json:"drain,omitempty"` // NodeDraining or NodeDrained while drained
	// CapacityBytes and FreeBytes are its pool filesystem's, as last
	// reported; 0 while down.
	CapacityBytes int64 `json:"capacityBytes"`
	FreeBytes     int64 `json:"freeBytes"`
	// Copies counts the copies of placed volumes it holds.
	Copies int `json:"copies"`
	// Self marks the node that answered.
	Self bool `json:"self,omitempty"`
}

// SpaceUsage is how the pool's space divides among volumes and snapshots
// (GET /v1/usage, `quiver volume du`).
type SpaceUsage struct {
	Items []ObjectUsage `json:"items"`
	// SharedBytes is held by more than one object, counted once: the sum
	// of every object's UniqueBytes and SharedBytes is the data in the pool.
	SharedBytes int64 `json:"sharedBytes"`
	// Exact: the filesystem gave extent maps; without them (tmpfs, NFS)
	// each image's data counts as its own.
	Exact bool `json:"exact"`
	// PoolSizeBytes and PoolUsedBytes are the filesystem's (df); on a
	// cluster, the sums of the Nodes' that answered.
	PoolSizeBytes int64 `json:"poolSizeBytes"`
	PoolUsedBytes int64 `json:"poolUsedBytes"`
	// Nodes is set on a cluster node: the nodes whose pools measured the
	// Items, each placed volume on its primary's copy (the same answer
	// through every node) and a volume of the answering node alone there.
	// SharedBytes and Exact above are then their sum and their and.
	Nodes []NodeSpaceUsage `json:"nodes,omitempty"`
}

// NodeSpaceUsage is one node's part of a cluster's SpaceUsage.
type NodeSpaceUsage struct {
	Node string `json:"node"`
	// SharedBytes, Exact, PoolSizeBytes and PoolUsedBytes are the node's
	// pool's, as in SpaceUsage.
	SharedBytes   int64 `json:"sharedBytes"`
	Exact         bool  `json:"exact"`
	PoolSizeBytes int64 `json:"poolSizeBytes"`
	PoolUsedBytes int64 `json:"poolUsedBytes"`
	// Error says why the node did not answer (down, unreachable); Missing
	// are the volumes it is the primary of that are not in Items (it did
	// not answer, or holds no copy of them any more).
	Error   string   `json:"error,omitempty"`
	Missing []string `json:"missing,omitempty"`
}

// ObjectUsage is the space of a volume, or of a snapshot (Snapshot set).
type ObjectUsage struct {
	Volume   string `json:"volume"`
	Snapshot string `json:"snapshot,omitempty"`
	// Node is the node whose copy was measured, on a cluster: a placed
	// volume's primary (empty on a single node).
	Node string `json:"node,omitempty"`
	// ProvisionedBytes: the disks' virtual sizes; AllocatedBytes: what the
	// images occupy (shared extents in full); UniqueBytes: what no other
	// object references, what deleting it frees.
	ProvisionedBytes int64       `json:"provisionedBytes"`
	AllocatedBytes   int64       `json:"allocatedBytes"`
	UniqueBytes      int64       `json:"uniqueBytes"`
	Disks            []DiskUsage `json:"disks"`
}

// DiskUsage is the space of one disk image of an object.
type DiskUsage struct {
	Name             string `json:"name"`
	ProvisionedBytes int64  `json:"provisionedBytes"`
	AllocatedBytes   int64  `json:"allocatedBytes"`
	UniqueBytes      int64  `json:"uniqueBytes"`
}

// List wraps collections.
type List[T any] struct {
	Items []T `json:"items"`
}

// Error is the body of every non-2xx response: {"error": {...}}.
type Error struct {
	Code    string `json:"code"`
	Message string `json:"message"`
	Field   string `json:"field,omitempty"`
}

// ErrorBody is the envelope of an error response.
type ErrorBody struct {
	Error Error `json:"error"`
}

// Stable error codes. Clients branch on these, never on messages.
const (
	CodeInvalid        = "Invalid"          // 400: a field breaks a rule
	CodeUnauthorized   = "Unauthorized"     // 401: missing or wrong bearer token
	CodeNotFound       = "NotFound"         // 404: volume, disk, snapshot or job
	CodeConflict       = "AlreadyExists"    // 409: the name is taken
	CodeBusy           = "Busy"             // 409: another operation holds the volume
	CodeCapacity       = "CapacityExceeded" // 422: disks would not fit the capacity
	CodeNoSpace        = "NoSpace"          // 507: the pool is full
	CodeCancelled      = "Cancelled"        // 499-like: job was cancelled
	CodeInUse          = "InUse"            // 409: the volume has attachments or connected writers
	CodeHasSnapshots   = "HasSnapshots"     // 409: deleting a volume with snapshots without recursive=true
	CodeNoCheckpoint   = "NoCheckpoint"     // 409: a snapshot without change tracking (taken before it, or its record lost)
	CodeNoRepository   = "NoRepository"     // 409: the backup target holds no repository yet (quiver backup init)
	CodeWrongKey       = "WrongKey"         // 409: the repository key does not open the backup repository
	CodeBackupDamaged  = "BackupDamaged"    // 409: a backup's data fails its check in the store (the message names it)
	CodeStoreDenied    = "StoreDenied"      // 502: the object store refused the credentials
	CodeInterrupted    = "Interrupted"      // a job's error: the server stopped while it ran
	CodeBroken         = "Broken"           // 409: the volume is quarantined (damaged or hostile files)
	CodeReadOnly       = "ReadOnly"         // 409: the pool is read-only
	CodeNotEnoughNodes = "NotEnoughNodes"   // 422: fewer nodes up than the replicas asked
	CodeUnavailable    = "Unavailable"      // 503: the cluster state (etcd), an object store or the key manager cannot be reached
	CodeNotPrimary     = "NotPrimary"       // 409: ask the volume's primary node (the message names it)
	CodeNotSupported   = "NotSupported"     // 422: not built for replicated volumes yet
	CodeDegraded       = "Degraded"         // 409: a copy is out of sync; wait for its resync
	CodeWrongNode      = "WrongNode"        // 409: ask another node (the message names it and its address)
	CodeCopyMismatch   = "CopyMismatch"     // 409: a copy lacks what the operation needs (the message names it)
	CodeNodeInUse      = "NodeInUse"        // 409: the node to remove is not drained or holds a copy
	CodeQuorum         = "Quorum"           // 409: removing the node's etcd member would risk etcd's quorum
	CodeDeleting       = "Deleting"         // 409: the volume is being deleted (the message names the copies left)
	CodeDiverged       = "Diverged"         // 409: a DR target does not hold the point a delta starts from
	CodeNoKeyProvider  = "NoKeyProvider"    // 422: an encrypted volume asked of a server without a key provider
	CodeKeyUnavailable = "KeyUnavailable"   // 503: an encrypted volume's data key cannot be unwrapped (the message says why)
	CodeEncrypted      = "Encrypted"        // 409: refused for an encrypted volume (direct access to its image files)
	CodeKeyShared      = "KeyShared"        // 409: shredding a volume whose clones share its data key, not named
	CodeInternal       = "Internal"         // 500
	CodeForbidden      = "Forbidden"        // 403: the token's role does not allow it
	CodeQuota          = "QuotaExceeded"    // 403: a tenant quota would be exceeded (the message names it)
)

// BuildInfo says which quiver a binary is (GET /v1/version, `quiver version`).
type BuildInfo struct {
	Version    string `json:"version"`              // the release, or "dev"
	Commit     string `json:"commit,omitempty"`     // the git commit it was built from
	CommitTime string `json:"commitTime,omitempty"` // RFC 3339
	Modified   bool   `json:"modified,omitempty"`   // built from a tree with uncommitted changes
	GoVersion  string `json:"goVersion"`
	Platform   string `json:"platform"` // GOOS/GOARCH
}

// ReadyFile is what `quiver server --ready-file PATH` writes, atomically,
// once it serves: the addresses it is bound to, so that scripts and tests can
// start it on port 0 and learn the port it got.
type ReadyFile struct {
	PID       int    `json:"pid"`
	API       string `json:"api"`                 // host:port of the HTTP API
	NBD       string `json:"nbd,omitempty"`       // host:port of NBD over TCP, when served
	NBDSocket string `json:"nbdSocket,omitempty"` // NBD unix socket, when served
}

// Roles of API tokens (docs/security.md, "Tenants").
const (
	RoleAdmin   = "admin"
	RoleTenant  = "tenant"
	RoleAttach  = "attach"
	RoleMonitor = "monitor"
)

// TokenSpec asks for a new API token (POST /v1/tokens, admin only).
type TokenSpec struct {
	Tenant      string `json:"tenant,omitempty"` // required for tenant and attach, optional for monitor, none for admin
	Role        string `json:"role"`
	Description string `json:"description,omitempty"`
	// Certificate, a PEM client certificate, makes a certificate token:
	// no secret; that certificate, presented over NBD with mutual TLS,
	// acts for Tenant with Role. Only its SHA-256 fingerprint is stored.
	Certificate string `json:"certificate,omitempty"`
}

// Token is a stored API token; its secret is never shown but once.
type Token struct {
	ID          string    `json:"id"`
	Tenant      string    `json:"tenant,omitempty"`
	Role        string    `json:"role"`
	Description string    `json:"description,omitempty"`
	CreatedAt   time.Time `json:"createdAt"`
	// CertSHA256 is a certificate token's certificate fingerprint (SHA-256
	// of its DER, hex); such a token has no secret.
	CertSHA256 string `json:"certSha256,omitempty"`
	// Secret is the bearer token, set only in the answer to its creation.
	Secret string `json:"secret,omitempty"`
}

// Quota bounds one tenant; 0 is unlimited.
type Quota struct {
	Volumes   int64 `json:"volumes,omitempty"`
	Capacity  int64 `json:"capacity,omitempty"` // bytes: the sum of the volumes' capacities
	Snapshots int64 `json:"snapshots,omitempty"`
	IOPS      int64 `json:"iops,omitempty"` // the sum of the volumes' QoS IOPS (rw_iops, else read_iops+write_iops)
}

// Tenant is a tenant with its quota and what it uses (GET /v1/tenants,
// PUT /v1/tenants/{tenant} with a TenantSpec).
type Tenant struct {
	Name  string `json:"name"`
	Quota Quota  `json:"quota"`
	Used  Quota  `json:"used"`
}

// TenantSpec sets a tenant's quota.
type TenantSpec struct {
	Quota Quota `json:"quota"`
}

// VolumeStats is what a volume's data path has done (GET
// /v1/volumes/{volume}/stats): reads and writes of all its disks through
// its exports on the node that serves its VM (its primary), counted since
// the first of them after that node started. Two answers give the IOPS and
// bytes per second between their times.
type VolumeStats struct {
	Volume     string    `json:"volume"`
	Time       time.Time `json:"time"`
	ReadOps    int64     `json:"readOps"`
	ReadBytes  int64     `json:"readBytes"`
	WriteOps   int64     `json:"writeOps"`
	WriteBytes int64     `json:"writeBytes"`
}

// WhoAmI is what the caller's credential is (GET /v1/whoami).
type WhoAmI struct {
	TokenID string `json:"tokenID,omitempty"` // empty: no token (a tokenless loopback node, or its socket)
	Tenant  string `json:"tenant,omitempty"`
	Role    string `json:"role"`
	// MaxVolumeName is the longest volume name this caller may create:
	// 63, less the tenant's prefix (docs/security.md).
	MaxVolumeName int `json:"maxVolumeName"`
}

// Primary is where a volume's disks are served now, the body of GET
// /v1/volumes/{volume}/primary: the node and its NBD address (host:port).
// A compute node's endpoint (`quiver endpoint`) connects there directly and
// asks again when the connection breaks or Term changes. On a single node
// Node is "local" and Term 0.
type Primary struct {
	Volume string `json:"volume"`
	Node   string `json:"node"`
	NBD    string `json:"nbd"`
	TLS    bool   `json:"tls,omitempty"` // the node requires TLS on NBD
	Term   uint64 `json:"term,omitempty"`
}

// Event is one line of a node's audit log (`quiver events`, GET /v1/events):
// a request that changed or tried to change something, or one refused for
// its credential. It never holds a request's body, only the names of what
// the request acted on.
type Event struct {
	// Seq numbers the node's events from 1, in the order they were
	// written; ?after=SEQ reads those after it.
	Seq  int64     `json:"seq"`
	Time time.Time `json:"time"`
	Who  EventWho  `json:"who"`
	// Method and Route are the request's method and the route's pattern
	// ("DELETE /v1/volumes/{volume}"); Route is empty for a request that
	// matched none.
	Method string `json:"method"`
	Route  string `json:"route,omitempty"`
	// Names are the route's names (volume, disk, snapshot, id, node,
	// tenant) and, for a create, the name of what it makes ("name").
	Names map[string]string `json:"names,omitempty"`
	// Status is the HTTP status answered; Code the error's code when it
	// was an error.
	Status int    `json:"status"`
	Code   string `json:"code,omitempty"`
}

// EventWho is who a request acted for: never a secret.
type EventWho struct {
	TokenID string `json:"tokenId,omitempty"`
	Role    string `json:"role,omitempty"`
	Tenant  string `json:"tenant,omitempty"`
	// Cert is the subject of the client certificate a TLS handshake
	// verified, when the client presented one.
	Cert string `json:"cert,omitempty"`
	// Remote is the client's address; "local" for the unix socket.
	Remote string `json:"remote,omitempty"`
}

// DRPoint is one point of a DR relationship: a whole-VM snapshot of the
// same name on both sites.
type DRPoint struct {
	Seq      uint64 `json:"seq"`
	Snapshot string `json:"snapshot"`
}

// DRTarget is a relationship this site is the target of (GET /v1/dr/targets).
type DRTarget struct {
	Relationship string    `json:"relationship"`
	Volume       string    `json:"volume"`
	Points       []DRPoint `json:"points"` // oldest first
}

// DRAccept is the body of POST /v1/dr/targets: make a new, empty volume the
// target of a relationship.
type DRAccept struct {
	Relationship string `json:"relationship"`
	Volume       string `json:"volume"`
}

// DRDemote is the body of POST /v1/volumes/{volume}/dr/demote: the volume,
// a source of the relationship until now, becomes its target on this site
// (a failback, or a planned migration's first step).
type DRDemote struct {
	Relationship string `json:"relationship"`
}

// DRBegin is the body of POST /v1/dr/targets/{rel}/begin: a source starts
// applying a point on top of base (none: every byte comes).
type DRBegin struct {
	Point DRPoint    `json:"point"`
	Base  *DRPoint   `json:"base,omitempty"`
	Disks []DiskSpec `json:"disks"`
	// Replace lets a full point (no base) replace the points the target
	// holds; without it that is refused (Diverged).
	Replace bool `json:"replace,omitempty"`
	// Key, for an encrypted volume, is its data key wrapped under its
	// backup KEK: the point's bytes are its ciphertext.
	Key *DRKey `json:"key,omitempty"`
}

// DRKey is a data key wrapped under a key-encryption key, as a DR point
// of an encrypted volume carries it (never the key itself).
type DRKey struct {
	Provider  string `json:"provider"`
	KeyID     string `json:"keyId"`
	Algorithm string `json:"algorithm"`
	Wrapped   []byte `json:"wrapped"`
	KeyUID    string `json:"keyUID"`
}

// DRZero is the body of POST /v1/dr/targets/{rel}/disks/{disk}/zero.
type DRZero struct {
	Offset int64 `json:"offset"`
	Length int64 `json:"length"`
}

// DRSync is the body of POST /v1/volumes/{volume}/dr/sync: ship a point of
// the volume to a site's target of a relationship (both may be left out
// for a volume with a DR policy: the policy's).
type DRSync struct {
	Site         string `json:"site"`
	Relationship string `json:"relationship"`
	// Replace lets a full point replace the points the target holds when
	// they are not this volume's (DRBegin.Replace).
	Replace bool `json:"replace,omitempty"`
}

// DRPolicy is a volume's DR relationship (the body of PUT
// /v1/volumes/{volume}/dr-policy): its points are shipped to the target of
// Relationship on Site often enough that the target's last point is never
// older than RPO, a Go duration from 10s to 24h.
type DRPolicy struct {
	Site         string `json:"site"`
	Relationship string `json:"relationship"`
	RPO          string `json:"rpo"`
}

// DRStatus is a volume's relationship as its source sees it (GET
// /v1/dr/status).
type DRStatus struct {
	Volume       string `json:"volume"`
	Site         string `json:"site"`
	Relationship string `json:"relationship"`
	RPO          string `json:"rpo"`
	// LastPoint is the newest point the target committed, LastPointAt
	// when the source took it; Lag its age now (since the policy was set,
	// without one), Missed whether that is beyond the RPO.
	LastPoint   string        `json:"lastPoint,omitempty"`
	LastPointAt time.Time     `json:"lastPointAt,omitzero"`
	Lag         time.Duration `json:"lagNs"`
	Missed      bool          `json:"missed"`
	Running     bool          `json:"running"`
	LastAttempt time.Time     `json:"lastAttempt,omitzero"`
	LastError   string        `json:"lastError,omitempty"` // of the last cycle, when it failed
	LastSent    int64         `json:"lastSent"`            // bytes the last successful cycle wrote
	LastChanged int64         `json:"lastChanged"`         // bytes its change tracking reported
	LastTook    time.Duration `json:"lastTookNs"`
	Cycles      int64         `json:"cycles"`   // successful, since the server started
	Failures    int64         `json:"failures"` // since the server started
	SentTotal   int64         `json:"sentTotal"`
}

// DRCycle is what a sync did.
type DRCycle struct {
	Point    DRPoint       `json:"point"`
	Base     string        `json:"base,omitempty"` // empty: every byte was shipped
	Changed  int64         `json:"changed"`
	Sent     int64         `json:"sent"`
	Zeroed   int64         `json:"zeroed"`
	Duration time.Duration `json:"durationNs"`
}

// DRSite is a site this server ships to (GET /v1/dr/sites).
type DRSite struct {
	Name string `json:"name"`
	URL  string `json:"url"`
}
