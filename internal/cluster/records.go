package cluster

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"time"

	"github.com/quiverstorage/quiver/internal/api"
)

// Records stored in etcd, as JSON, under Config.Prefix (docs/cluster.md,
// "Keys").

// clusterRecord is the key "cluster": written once by the first node.
type clusterRecord struct {
	Name          string    `json:"name"`
	ID            string    `json:"id"`
	TokenVerifier string    `json:"tokenVerifier"`
	CreatedAt     time.Time `json:"createdAt"`
}

// memberRecord is "members/<node>": the node belongs, up or down.
type memberRecord struct {
	NodeID        string    `json:"nodeID"`
	PoolID        string    `json:"poolID"`
	FailureDomain string    `json:"failureDomain,omitempty"`
	JoinedAt      time.Time `json:"joinedAt"`
}

// aliveRecord is "alive/<node>", under the node's lease.
type aliveRecord struct {
	NodeID        string    `json:"nodeID"`
	API           string    `json:"api"`
	NBD           string    `json:"nbd,omitempty"`
	FailureDomain string    `json:"failureDomain,omitempty"`
	TotalBytes    int64     `json:"totalBytes"`
	FreeBytes     int64     `json:"freeBytes"`
	StartedAt     time.Time `json:"startedAt"`
	// Instance is random per process (Node.Instance): replication
	// sessions are signed for it.
	Instance string `json:"instance,omitempty"`
}

// Volume states (volumeRecord.State).
const (
	volumeActive   = ""
	volumeDeleting = "deleting"
)

// volumeRecord is "volumes/<volume>": placement, primary and term.
type volumeRecord struct {
	UID            string         `json:"uid"`
	Spec           api.VolumeSpec `json:"spec"`
	IdempotencyKey string         `json:"idempotencyKey,omitempty"`
	Copies         []string       `json:"copies"`
	Primary        string         `json:"primary"`
	Term           uint64         `json:"term"`
	InSync         []string       `json:"inSync"`
	State          string         `json:"state,omitempty"`
	// Refused is why the primary's copy refused the last delete (which
	// put the volume back to active).
	Refused string `json:"refused,omitempty"`
	// Removing are the nodes whose copies left the placement (a drain)
	// and that have not deleted them yet (drain.go).
	Removing []string `json:"removing,omitempty"`
	// Charge is what the volume counts in its tenant's usage
	// (tenants/<tenant>/use), given back when the record is removed.
	Charge    *Usage    `json:"charge,omitempty"`
	CreatedAt time.Time `json:"createdAt"`
}

// Copy states (copyRecord.State, api.Copy.State).
const (
	CopyInSync = "in-sync"
	CopyFailed = "failed"
	// copyDeleteFailed: the node could not delete its copy (attached).
	copyDeleteFailed = "delete-failed"
)

// copyRecord is "copies/<volume>/<node>", written by the node holding it.
// LocalUID is the UID of the volume in that node's pool: only a copy with
// a LocalUID was made, and only that volume is ever deleted for it.
type copyRecord struct {
	State    string `json:"state"`
	Reason   string `json:"reason,omitempty"`
	LocalUID string `json:"localUID,omitempty"`
	// Progress of the resync, while State is CopyResyncing.
	Progress *Progress `json:"progress,omitempty"`
	// Term is the primary's term the copy follows: it made its
	// replication attachment for that term's primary, giving it the
	// writer role and fencing the older terms' (the attachment and its
	// token never leave the copy's node: secrets.go).
	Term uint64 `json:"term,omitempty"`
	// Whole: the copy may hold changes that no in-sync copy has (it was
	// the primary, and went down with writes in flight that it never
	// acknowledged): its resync copies every granule, not only the dirty
	// ones. Cleared when it is back in sync.
	Whole bool `json:"whole,omitempty"`
	// WasPrimary is the term at which the copy's node was the primary and
	// went down (set by the promotion that followed, with Whole): what it
	// may hold that the new primary lacks is in its activity logs of that
	// term, and what it misses is in the new primary's dirty bitmaps, if
	// the new primary is the one promoted then (term WasPrimary+1).
	// Cleared when the copy is recorded diverged, follows a later term, or
	// is back in sync.
	WasPrimary uint64 `json:"wasPrimary,omitempty"`
	// Activity is the copy node's activity logs of term WasPrimary, which
	// it publishes when it follows the new primary's term (after its
	// attachment for that primary fenced every older writer).
	Activity  *CopyActivity `json:"activity,omitempty"`
	UpdatedAt time.Time     `json:"updatedAt"`
}

// CopyActivity is what an old primary's activity logs say (replica's
// ActivityLog): per disk, the extents (of Extent bytes, by index) in which
// it may differ from the copies it wrote at Term. A disk whose log is
// missing, damaged, untrusted or of another term is not listed: its resync
// is whole.
type CopyActivity struct {
	Term   uint64             `json:"term"`
	Extent int64              `json:"extent"`
	Disks  map[string][]int64 `json:"disks"`
}

// verifier is what etcd holds instead of the cluster token.
func verifier(token, clusterName string) string {
	m := hmac.New(sha256.New, []byte(token))
	m.Write([]byte("quiver cluster " + clusterName))
	return hex.EncodeToString(m.Sum(nil))
}

func newID() string {
	var b [12]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}
