package apiserver

import (
	"context"
	"errors"
	"fmt"
	"github.com/quiverstorage/quiver/internal/api"
	"net/http"
	"strings"
	"testing"

	"github.com/quiverstorage/quiver/internal/auth"
	"github.com/quiverstorage/quiver/internal/backup"
	"github.com/quiverstorage/quiver/internal/cluster"
	"github.com/quiverstorage/quiver/internal/crypt"
	"github.com/quiverstorage/quiver/internal/dr"
	"github.com/quiverstorage/quiver/internal/job"
	"github.com/quiverstorage/quiver/internal/objstore"
	"github.com/quiverstorage/quiver/internal/pool"
)

// TestToError checks the one mapping from errors to HTTP: each sentinel, as
// the domain wraps it, gets its documented status and code, the message is
// the error's own, and a FieldError or badRequest carries its field.
func TestToError(t *testing.T) {
	fieldErr := &pool.FieldError{Field: "disks[1].name", Value: "Root!", Rule: "must be a DNS label"}
	tests := []struct {
		name   string
		err    error
		status int
		code   string
		field  string
	}{
		{"invalid", fmt.Errorf("create: %w", pool.ErrInvalid), http.StatusBadRequest, api.CodeInvalid, ""},
		{"field error", fmt.Errorf("create volume: %w", fieldErr), http.StatusBadRequest, api.CodeInvalid, "disks[1].name"},
		{"bad request", &badRequest{field: "capacity", msg: "capacity: must be a number"}, http.StatusBadRequest, api.CodeInvalid, "capacity"},
		{"bad request without field", &badRequest{msg: "request body: malformed JSON"}, http.StatusBadRequest, api.CodeInvalid, ""},
		{"bad request sentinel", errBadRequest, http.StatusBadRequest, api.CodeInvalid, ""},
		{"unauthorized", errUnauthorized, http.StatusUnauthorized, api.CodeUnauthorized, ""},
		{"volume not found", fmt.Errorf("volume %q: %w", "web", pool.ErrVolumeNotFound), http.StatusNotFound, api.CodeNotFound, ""},
		{"disk not found", fmt.Errorf("disk %q: %w", "root", pool.ErrDiskNotFound), http.StatusNotFound, api.CodeNotFound, ""},
		{"snapshot not found", fmt.Errorf("snapshot %q: %w", "v1", pool.ErrSnapshotNotFound), http.StatusNotFound, api.CodeNotFound, ""},
		{"attachment not found", fmt.Errorf("attachment %q: %w", "att-1", pool.ErrAttachmentNotFound), http.StatusNotFound, api.CodeNotFound, ""},
		{"in use", fmt.Errorf("delete volume %q: %w", "web", pool.ErrInUse), http.StatusConflict, api.CodeInUse, ""},
		{"has snapshots", fmt.Errorf("delete volume %q: %w", "web", pool.ErrHasSnapshots), http.StatusConflict, api.CodeHasSnapshots, ""},
		{"no checkpoint", fmt.Errorf("snapshot vm@old: %w", pool.ErrNoCheckpoint), http.StatusConflict, api.CodeNoCheckpoint, ""},
		{"no key provider", fmt.Errorf("create volume %q: %w", "vm", pool.ErrNoKeyProvider), http.StatusUnprocessableEntity, api.CodeNoKeyProvider, ""},
		{"key unavailable", fmt.Errorf("volume %q: %w: %w", "vm", pool.ErrKeyUnavailable, crypt.ErrUnreachable), http.StatusServiceUnavailable, api.CodeKeyUnavailable, ""},
		{"KMS unreachable", fmt.Errorf("encrypted volume: key provider %q: %w", "kmip", crypt.ErrUnreachable), http.StatusServiceUnavailable, api.CodeUnavailable, ""},
		{"encrypted", fmt.Errorf("direct access: %w", pool.ErrEncrypted), http.StatusConflict, api.CodeEncrypted, ""},
		{"key shared", fmt.Errorf("shred: %w", pool.ErrKeyShared), http.StatusConflict, api.CodeKeyShared, ""},
		{"no backup target", fmt.Errorf("backup target %q: %w", "x", backup.ErrNoTarget), http.StatusNotFound, api.CodeNotFound, ""},
		{"backup not found", fmt.Errorf("backup %q: %w", "x", backup.ErrNotFound), http.StatusNotFound, api.CodeNotFound, ""},
		{"backup invalid", fmt.Errorf("backup id: %w", backup.ErrInvalid), http.StatusBadRequest, api.CodeInvalid, ""},
		{"repository exists", fmt.Errorf("target t: %w", backup.ErrExists), http.StatusConflict, api.CodeConflict, ""},
		{"repository locked", fmt.Errorf("collect: %w", backup.ErrLocked), http.StatusConflict, api.CodeBusy, ""},
		{"no repository", fmt.Errorf("target t: %w", backup.ErrNoRepository), http.StatusConflict, api.CodeNoRepository, ""},
		{"wrong key", fmt.Errorf("target t: %w", backup.ErrWrongKey), http.StatusConflict, api.CodeWrongKey, ""},
		{"backup damaged", fmt.Errorf("chunk c: %w", backup.ErrCorrupt), http.StatusConflict, api.CodeBackupDamaged, ""},
		{"store denied", fmt.Errorf("s3: %w", objstore.ErrDenied), http.StatusBadGateway, api.CodeStoreDenied, ""},
		{"store unreachable", fmt.Errorf("s3: %w", objstore.ErrUnreachable), http.StatusServiceUnavailable, api.CodeUnavailable, ""},
		{"no DR target", fmt.Errorf("relationship b: %w", dr.ErrNoTarget), http.StatusNotFound, api.CodeNotFound, ""},
		{"no DR site", fmt.Errorf("site x: %w", dr.ErrNoSite), http.StatusNotFound, api.CodeNotFound, ""},
		{"DR diverged", fmt.Errorf("point 3: %w", dr.ErrDiverged), http.StatusConflict, api.CodeDiverged, ""},
		{"not supported here", fmt.Errorf("DR here: %w", pool.ErrNotSupported), http.StatusUnprocessableEntity, api.CodeNotSupported, ""},
		{"restore source unavailable", fmt.Errorf("disk root: %w: store down", pool.ErrFillSource), http.StatusServiceUnavailable, api.CodeUnavailable, ""},
		{"job interrupted", job.ErrInterrupted, http.StatusConflict, api.CodeInterrupted, ""},
		{"broken", fmt.Errorf("volume %q is quarantined (volume.json: malformed JSON): %w", "web", pool.ErrBroken), http.StatusConflict, api.CodeBroken, ""},
		{"read-only", fmt.Errorf("snapshot web: pool /p is read-only: %w", pool.ErrReadOnly), http.StatusConflict, api.CodeReadOnly, ""},
		{"job not found", fmt.Errorf("job %q: %w", "0123", job.ErrNotFound), http.StatusNotFound, api.CodeNotFound, ""},
		{"route not found", errRouteNotFound, http.StatusNotFound, api.CodeNotFound, ""},
		{"method not allowed", errMethod, http.StatusMethodNotAllowed, api.CodeInvalid, ""},
		{"exists", fmt.Errorf("volume %q: %w", "web", pool.ErrExists), http.StatusConflict, api.CodeConflict, ""},
		{"busy", fmt.Errorf("snapshot: %w", pool.ErrBusy), http.StatusConflict, api.CodeBusy, ""},
		{"cancelled", fmt.Errorf("clone: %w", context.Canceled), http.StatusConflict, api.CodeCancelled, ""},
		{"capacity", fmt.Errorf("disks total: %w", pool.ErrCapacity), http.StatusUnprocessableEntity, api.CodeCapacity, ""},
		{"no space", fmt.Errorf("%w: write: no space left on device", pool.ErrNoSpace), http.StatusInsufficientStorage, api.CodeNoSpace, ""},
		{"not enough nodes", fmt.Errorf("create volume %q: %w", "web", cluster.ErrNotEnoughNodes), http.StatusUnprocessableEntity, api.CodeNotEnoughNodes, ""},
		{"placed already", fmt.Errorf("volume %q: %w", "web", cluster.ErrVolumeExists), http.StatusConflict, api.CodeConflict, ""},
		{"deleting", fmt.Errorf("volume %q is being deleted: %w", "web", cluster.ErrVolumeDeleting), http.StatusConflict, api.CodeDeleting, ""},
		{"delete refused", fmt.Errorf("delete volume %q: %w", "web", cluster.ErrDeleteRefused), http.StatusConflict, api.CodeInUse, ""},
		{"not placed", fmt.Errorf("volume %q: %w", "web", cluster.ErrVolumeNotFound), http.StatusNotFound, api.CodeNotFound, ""},
		{"copies late", fmt.Errorf("create volume %q: %w", "web", cluster.ErrTimeout), http.StatusServiceUnavailable, api.CodeUnavailable, ""},
		{"no session", fmt.Errorf("create: %w", cluster.ErrNoSession), http.StatusServiceUnavailable, api.CodeUnavailable, ""},
		{"not primary", fmt.Errorf("attach: %w", cluster.ErrNotPrimary), http.StatusConflict, api.CodeNotPrimary, ""},
		// As the cluster words a change asked of a node that is not the
		// primary at the term it gives (issue 29: it was ErrNoSession, 503).
		{"not primary at term", fmt.Errorf("record the disks of %q: this node is not the primary at term %d (primary %s, term %d): %w",
			"web", 1, "n2", 2, cluster.ErrNotPrimary), http.StatusConflict, api.CodeNotPrimary, ""},
		{"no longer primary at term", fmt.Errorf("mark copy %s of %q out of sync: this node is no longer primary at term %d (primary %s, term %d): %w",
			"n3", "web", 1, "n2", 2, cluster.ErrNotPrimary), http.StatusConflict, api.CodeNotPrimary, ""},
		{"unknown outcome", fmt.Errorf("hand over %q to %s: %w: %w", "web", "n2", cluster.ErrUnknownOutcome,
			errors.New("context deadline exceeded")), http.StatusServiceUnavailable, api.CodeUnavailable, ""},
		{"not built for replicas", fmt.Errorf("snapshot: %w", cluster.ErrNotSupported), http.StatusUnprocessableEntity, api.CodeNotSupported, ""},
		{"a copy out of sync", fmt.Errorf("snapshot: %w", cluster.ErrDegraded), http.StatusConflict, api.CodeDegraded, ""},
		{"no such node", fmt.Errorf("drain n9: %w", cluster.ErrNodeNotFound), http.StatusNotFound, api.CodeNotFound, ""},
		{"a drain sent to another node", fmt.Errorf("drain n1: %w", errWrongNode), http.StatusConflict, api.CodeWrongNode, ""},
		{"a copy lacking a snapshot", fmt.Errorf("rollback: %w", cluster.ErrCopyMismatch), http.StatusConflict, api.CodeCopyMismatch, ""},
		{"a bad node to add", fmt.Errorf("add node %q: %w", "N4", cluster.ErrInvalidMember), http.StatusBadRequest, api.CodeInvalid, ""},
		{"a node name taken", fmt.Errorf("add node n1: %w", cluster.ErrNameTaken), http.StatusConflict, api.CodeConflict, ""},
		{"an added node pending", fmt.Errorf("add node n5: %w", cluster.ErrMemberPending), http.StatusConflict, api.CodeBusy, ""},
		{"a node not drained", fmt.Errorf("remove node n4: %w", cluster.ErrNodeInUse), http.StatusConflict, api.CodeNodeInUse, ""},
		{"etcd quorum at risk", fmt.Errorf("remove node n3: %w", cluster.ErrQuorum), http.StatusConflict, api.CodeQuorum, ""},
		{"etcd unavailable", fmt.Errorf("%w: %w", errUnavailable, errors.New("context deadline exceeded")), http.StatusServiceUnavailable, api.CodeUnavailable, ""},
		{"no primary now", fmt.Errorf("volume \"v\" has no primary now: %w", errNoPrimary), http.StatusServiceUnavailable, api.CodeUnavailable, ""},
		{"no NBD over TCP", fmt.Errorf("volume \"v\": %w", errNoNBD), http.StatusUnprocessableEntity, api.CodeNotSupported, ""},
		{"quota", fmt.Errorf("tenant %q: quota volumes is 3: %w", "acme", auth.ErrQuota), http.StatusForbidden, api.CodeQuota, ""},
		{"forbidden", fmt.Errorf("a monitor token may not change volumes: %w", auth.ErrForbidden), http.StatusForbidden, api.CodeForbidden, ""},
		{"invalid token spec", fmt.Errorf("role %q: %w", "root", auth.ErrInvalid), http.StatusBadRequest, api.CodeInvalid, ""},
		{"token not found", fmt.Errorf("token %q: %w", "tk-000000000000", auth.ErrTokenNotFound), http.StatusNotFound, api.CodeNotFound, ""},
		{"unknown", errors.New("disk on fire"), http.StatusInternalServerError, api.CodeInternal, ""},
		{"unknown wrapped", fmt.Errorf("snapshot web@v1: %w", errors.New("input/output error")), http.StatusInternalServerError, api.CodeInternal, ""},
	}
	covered := map[error]bool{}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			status, e := toError(tt.err)
			if status != tt.status || e.Code != tt.code {
				t.Errorf("toError(%v) = %d %s, want %d %s", tt.err, status, e.Code, tt.status, tt.code)
			}
			if e.Message != tt.err.Error() {
				t.Errorf("message %q, want the error's own %q", e.Message, tt.err.Error())
			}
			if e.Field != tt.field {
				t.Errorf("field %q, want %q", e.Field, tt.field)
			}
		})
		for _, m := range errorMapping {
			if errors.Is(tt.err, m.err) {
				covered[m.err] = true
			}
		}
	}
	// A new row of errorMapping needs a row here.
	for _, m := range errorMapping {
		if !covered[m.err] {
			t.Errorf("errorMapping row %v (%d %s) has no test case", m.err, m.status, m.code)
		}
	}
}

// TestErrorsHideStaging: a file in the staging area of an operation shows
// as the object it becomes, not as a work directory.
func TestErrorsHideStaging(t *testing.T) {
	for in, want := range map[string]string{
		"clone vdi-001: open /srv/pool/staging/clone-3f2a/vdi-001/disks/root.img: no space left on device": "clone vdi-001: open vdi-001/disks/root.img: no space left on device",
		"write staging/snap-9/nightly/root.img: input/output error":                                        "write nightly/root.img: input/output error",
		"volume \"web01\": staging is full":                                                                "volume \"web01\": staging is full",
	} {
		if _, e := toError(fmt.Errorf("%s: %w", in, pool.ErrNoSpace)); !strings.HasPrefix(e.Message, want) {
			t.Errorf("message %q, want it to start %q", e.Message, want)
		}
	}
}
