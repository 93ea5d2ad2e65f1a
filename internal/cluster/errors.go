package cluster

import "errors"

// Sentinels of the cluster domain. Callers test them with errors.Is; the
// messages that wrap them name the conflict and what to do.
var (
	// ErrConfig is a flag combination that cannot work (a node name missing
	// from --initial-cluster, a short token).
	ErrConfig = errors.New("bad cluster configuration")
	// ErrPlaintextEtcd: etcd beyond loopback without TLS, and no
	// --etcd-insecure. It comes with ErrConfig.
	ErrPlaintextEtcd = errors.New("plaintext etcd beyond loopback")
	// ErrUnreachable: etcd did not answer in time.
	ErrUnreachable = errors.New("etcd unreachable")
	// ErrOtherCluster: etcd, or this node's pool, belongs to another
	// cluster.
	ErrOtherCluster = errors.New("belongs to another cluster")
	// ErrWrongToken: the cluster token does not match the cluster's.
	ErrWrongToken = errors.New("wrong cluster token")
	// ErrNameTaken: another node holds this node name.
	ErrNameTaken = errors.New("node name taken")
	// ErrNotEnoughNodes: fewer eligible nodes than the replicas asked.
	ErrNotEnoughNodes = errors.New("not enough nodes")
	// ErrNodeNotFound: no member of that name.
	ErrNodeNotFound = errors.New("node not found in the cluster")
	// ErrVolumeExists: a volume of that name is placed already.
	ErrVolumeExists = errors.New("volume already exists in the cluster")
	// ErrVolumeNotFound: no volume of that name is placed.
	ErrVolumeNotFound = errors.New("volume not found in the cluster")
	// ErrVolumeDeleting: the volume is being deleted (a copy's node was
	// out of reach): it takes no attachment, snapshot or clone, and its
	// name no new volume, until its last copy is gone.
	ErrVolumeDeleting = errors.New("volume is being deleted")
	// ErrDeletePending: a delete marked the volume deleting but could not
	// reach every copy (its node is down, or it could not delete it); the
	// node finishes it when it can (reconcile).
	ErrDeletePending = errors.New("delete pending")
	// ErrDeleteRefused: the primary's copy refused to go (a client has it
	// attached); no copy was deleted and the volume is active again.
	ErrDeleteRefused = errors.New("delete refused")
	// ErrCopyFailed: a node could not make or delete its copy.
	ErrCopyFailed = errors.New("copy failed")
	// ErrTimeout: the copies did not report in time.
	ErrTimeout = errors.New("copies did not report in time")
	// ErrNotPrimary: the operation must go to the volume's primary.
	ErrNotPrimary = errors.New("not the volume's primary")
	// ErrNotSupported: the operation is not built for replicated volumes
	// yet (docs/cluster.md).
	ErrNotSupported = errors.New("not supported on a replicated volume yet")
	// ErrUnknownOutcome: an etcd transaction that changes cluster state
	// may or may not have been applied (its answer was lost: a deadline,
	// a connection closed after the request was sent, etcd timing out a
	// proposal). The caller must not act as if it had failed: it finds
	// out by reading etcd, or acts as if it had been applied.
	ErrUnknownOutcome = errors.New("the outcome of the etcd transaction is unknown")
	// ErrNoSession: this node has lost its etcd session (partitioned from
	// etcd, or etcd lost quorum) and changes nothing until it has one.
	ErrNoSession = errors.New("no etcd session")
	// ErrDegraded: the operation needs every copy in sync (a snapshot
	// would be missing on the copy out of sync).
	ErrDegraded = errors.New("a copy of the volume is out of sync")
	// ErrCopyMismatch: a copy lacks what the operation needs (the
	// snapshot a rollback goes to); nothing was changed.
	ErrCopyMismatch = errors.New("a copy does not match the primary")
	// ErrInvalidMember: a node name or peer URL given to add a node
	// breaks its rule (the message names it).
	ErrInvalidMember = errors.New("invalid node to add")
	// ErrMemberPending: an etcd member added for a new node has not
	// joined yet; etcd takes one learner at a time.
	ErrMemberPending = errors.New("an added node has not joined yet")
	// ErrNodeInUse: the node to remove is not drained or still holds a
	// copy; nothing was changed.
	ErrNodeInUse = errors.New("node not drained")
	// ErrQuorum: removing the node's etcd member would leave too few
	// members, or too few of them up, for a safe quorum.
	ErrQuorum = errors.New("etcd quorum at risk")
	// ErrNodeRemoved: this node was removed from the cluster (quiver
	// node remove); its pool cannot join again.
	ErrNodeRemoved = errors.New("node removed from the cluster")
)
