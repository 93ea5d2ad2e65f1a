package pool

import (
	"crypto/rand"
	"encoding/hex"
	"maps"
	"slices"
	"time"

	"github.com/quiverstorage/quiver/internal/crypt"
	"github.com/quiverstorage/quiver/internal/qos"
)

// DiskSpec is one disk: a sparse raw file <Name>.img of Size bytes.
type DiskSpec struct {
	Name string `json:"name"`
	Size int64  `json:"size"`
	// Shared exempts the disk from the single-writer rule (attach.go).
	Shared bool `json:"shared,omitempty"`
}

// VolumeSpec is what a caller asks for when creating a volume.
type VolumeSpec struct {
	Name     string
	Capacity int64
	Labels   map[string]string
	Disks    []DiskSpec
	QoS      qos.Limits // zero: unlimited
	// Replicas is how many nodes of a cluster keep a copy (0 means 1). The
	// pool only records it: placement is the cluster's (internal/cluster).
	Replicas int
	// Tenant owns the volume ("" for none); Name must then be
	// TenantVolumeName(Tenant, local name) (tenant.go).
	Tenant string
	// Idempotency says when an existing volume of that name is the answer.
	Idempotency Idempotency
	// Fill, when set, makes a volume that fills from a source of that name
	// (fill.go): Volume.Fill connects the source and copies it in.
	Fill string
	// Encrypt makes an encrypted volume (encrypt.go): a new data key,
	// wrapped by the pool's key provider (Options.Keyring).
	Encrypt bool
	// KeyFrom, with Encrypt, makes the volume's data key the one KeyFrom
	// wraps (a restore of a backup that holds ciphertext: the volume gets
	// its own KEK, as a clone does) instead of a new one; KeyUID names it.
	KeyFrom *crypt.WrappedKey
	KeyUID  string
}

// Source records what a volume was cloned from.
type Source struct {
	Volume   string `json:"volume"`
	Snapshot string `json:"snapshot,omitempty"`
}

const manifestVersion = 1

// volumeManifest is volume.json, the whole truth about a volume. It is only
// ever replaced atomically (durable.WriteJSON).
type volumeManifest struct {
	Kind      string            `json:"kind"`
	Version   int               `json:"version"`
	Name      string            `json:"name"`
	UID       string            `json:"uid"`
	Capacity  int64             `json:"capacity"`
	Labels    map[string]string `json:"labels,omitempty"`
	Disks     []DiskSpec        `json:"disks"`
	Source    *Source           `json:"source,omitempty"`
	QoS       *qos.Limits       `json:"qos,omitempty"`
	CreatedAt time.Time         `json:"createdAt"`
	// Replicas is how many nodes keep a copy, when above 1.
	Replicas int `json:"replicas,omitempty"`
	// Tenant owns the volume, set at creation and never changed; "" for
	// none (tenant.go).
	Tenant string `json:"tenant,omitempty"`
	// IdempotencyKey is the key of the request that made the volume;
	// DiskKeys those of the requests that added disks, by disk name.
	IdempotencyKey string            `json:"idempotencyKey,omitempty"`
	DiskKeys       map[string]string `json:"diskIdempotencyKeys,omitempty"`
	// BackupPolicy is the volume's backup schedule (policy.go); nil: none.
	BackupPolicy *BackupPolicy `json:"backupPolicy,omitempty"`
	// DRPolicy is the volume's disaster-recovery relationship (policy.go);
	// nil: none.
	DRPolicy *DRPolicy `json:"drPolicy,omitempty"`
	// DirectAccess names the holders of the image files themselves
	// (direct.go): change tracking counts every disk changed meanwhile.
	DirectAccess []string `json:"directAccess,omitempty"`
	// Fill is set while the volume fills from a source (fill.go).
	Fill *FillState `json:"fill,omitempty"`
	// Key is the wrapped data key of an encrypted volume (encrypt.go),
	// shared by its snapshots; nil for a volume stored in the clear.
	Key *crypt.WrappedKey `json:"key,omitempty"`
	// KeyUID names the data key under Key (not the key: a random id), the
	// same in the volume and every clone that shares the data key; a
	// deep rekey gives the volume a new one. Crypto-shredding finds the
	// clones that share a volume's data key by it (shred.go). "" in
	// volumes made before it was recorded: then only the volume itself.
	KeyUID string `json:"keyUID,omitempty"`
	// Rekey is set while a deep rekey re-encrypts the volume's disks under
	// a new data key (rekey.go); nil otherwise.
	Rekey *RekeyState `json:"rekey,omitempty"`
	// BackupKey is the data key wrapped under the volume's backup KEK,
	// which its backups carry (backupkey.go); nil until the first backup.
	BackupKey *crypt.WrappedKey `json:"backupKey,omitempty"`
}

// snapshotManifest is snapshot.json inside a snapshot directory.
type snapshotManifest struct {
	Kind      string        `json:"kind"`
	Version   int           `json:"version"`
	Name      string        `json:"name"`
	UID       string        `json:"uid"`
	Volume    string        `json:"volume"`
	VolumeUID string        `json:"volumeUID"`
	Capacity  int64         `json:"capacity"`
	Disks     []DiskSpec    `json:"disks"`
	Method    string        `json:"method"`
	GateHeld  time.Duration `json:"gateHeldNs"`
	CreatedAt time.Time     `json:"createdAt"`
	// IdempotencyKey is the key of the request that took the snapshot.
	IdempotencyKey string `json:"idempotencyKey,omitempty"`
	// Checkpoint is the change-tracking checkpoint taken at the snapshot's
	// cut (changes.go); 0 for a snapshot taken before change tracking.
	Checkpoint uint64 `json:"checkpoint,omitempty"`
	// CheckpointPool is the id of the pool whose change tracking took the
	// checkpoint: sequence numbers are a pool's own, so a snapshot that
	// came from another pool is no base here.
	CheckpointPool string `json:"checkpointPool,omitempty"`
}

// poolManifest is pool.json, the pool's identity.
type poolManifest struct {
	Kind      string    `json:"kind"`
	Version   int       `json:"version"`
	ID        string    `json:"id"`
	CreatedAt time.Time `json:"createdAt"`
}

// rollbackRecord is rollback.json: written once the new disk images are
// complete in staging, it is the commit point of a rollback; start-up redoes
// the remaining renames.
type rollbackRecord struct {
	Snapshot string `json:"snapshot"`
	Staging  string `json:"staging"` // directory name under <pool>/staging
}

func (m *volumeManifest) clone() volumeManifest {
	c := *m
	c.Labels = maps.Clone(m.Labels)
	c.Disks = slices.Clone(m.Disks)
	c.DiskKeys = maps.Clone(m.DiskKeys)
	if m.Source != nil {
		s := *m.Source
		c.Source = &s
	}
	if m.QoS != nil {
		q := *m.QoS
		c.QoS = &q
	}
	if m.Fill != nil {
		f := *m.Fill
		c.Fill = &f
	}
	if m.Key != nil {
		k := *m.Key
		k.Wrapped = slices.Clone(m.Key.Wrapped)
		c.Key = &k
	}
	if m.Rekey != nil {
		r := *m.Rekey
		r.NewKey.Wrapped = slices.Clone(m.Rekey.NewKey.Wrapped)
		c.Rekey = &r
	}
	if m.BackupKey != nil {
		k := *m.BackupKey
		k.Wrapped = slices.Clone(m.BackupKey.Wrapped)
		c.BackupKey = &k
	}
	return c
}

func (m *volumeManifest) disk(name string) (int, bool) {
	for i, d := range m.Disks {
		if d.Name == name {
			return i, true
		}
	}
	return -1, false
}

// sameSpec reports whether a create request matches an existing volume, for
// idempotent creates.
func (m *volumeManifest) sameSpec(s VolumeSpec) bool {
	return m.Capacity == s.Capacity && maps.Equal(m.Labels, s.Labels) && slices.Equal(m.Disks, s.Disks) &&
		m.Source == nil && limitsOf(m.QoS) == s.QoS && replicasOf(m.Replicas) == replicasOf(s.Replicas) &&
		m.Tenant == s.Tenant && (m.Key != nil) == s.Encrypt
}

// replicasOf normalizes a replica count: 0 means 1.
func replicasOf(n int) int { return max(n, 1) }

func newUID() string {
	var b [12]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// VolumeInfo is a point-in-time view of a volume.
type VolumeInfo struct {
	QoS       qos.Limits
	Name      string
	UID       string
	Capacity  int64
	Labels    map[string]string
	Disks     []DiskInfo
	Source    *Source
	Snapshots int
	CreatedAt time.Time
	Dir       string // directory holding the disk images
	Writer    WriterInfo
	Replicas  int    // 1 unless the volume was made by a cluster
	Tenant    string // the volume's tenant, from its manifest; "" for none
	// BackupPolicy is the volume's backup schedule; nil: none.
	BackupPolicy *BackupPolicy
	// DRPolicy is the volume's disaster-recovery relationship; nil: none.
	DRPolicy *DRPolicy
	// DirectAccess names who holds the image files themselves.
	DirectAccess []string
	// Fill reports a volume still filling from its source (an instant
	// restore); nil for a whole volume.
	Fill *FillInfo
	// Encryption says under which key the volume is encrypted; nil for a
	// volume stored in the clear. It holds no key material.
	Encryption *EncryptionInfo
	// Broken, when not empty, says why the volume was quarantined at
	// start-up; only Name is set then, and every operation fails with
	// ErrBroken.
	Broken string
}

// EncryptionInfo names the key-encryption key that wraps an encrypted
// volume's data key.
type EncryptionInfo struct {
	Provider string // the key provider ("keyfile", "kmip")
	KeyID    string // the KEK's id in that provider
	// Rekey reports a deep rekey in progress (or interrupted); nil when
	// none is.
	Rekey *RekeyInfo
}

// DiskInfo is a point-in-time view of a disk image.
type DiskInfo struct {
	Name      string
	Size      int64
	Allocated int64
	Path      string
	Shared    bool
}

// SnapshotInfo is a view of a snapshot.
type SnapshotInfo struct {
	Name      string
	UID       string
	Volume    string
	Capacity  int64
	Disks     []DiskInfo
	Method    string
	GateHeld  time.Duration
	CreatedAt time.Time
	// Checkpoint is the change-tracking checkpoint taken with it (0:
	// none, the snapshot predates change tracking).
	Checkpoint uint64
}
