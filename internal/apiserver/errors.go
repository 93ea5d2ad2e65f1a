package apiserver

import (
	"context"
	"errors"
	"net/http"
	"regexp"

	"github.com/quiverstorage/quiver/internal/api"
	"github.com/quiverstorage/quiver/internal/auth"
	"github.com/quiverstorage/quiver/internal/backup"
	"github.com/quiverstorage/quiver/internal/cluster"
	"github.com/quiverstorage/quiver/internal/crypt"
	"github.com/quiverstorage/quiver/internal/dr"
	"github.com/quiverstorage/quiver/internal/job"
	"github.com/quiverstorage/quiver/internal/objstore"
	"github.com/quiverstorage/quiver/internal/pool"
)

// errUnauthorized is returned by the auth check.
var errUnauthorized = errors.New("missing or wrong bearer token: pass the server's token with --token-file")

// errorMapping maps domain sentinels to an HTTP status and stable code. The
// first match wins; it is the only place where errors meet HTTP.
var errorMapping = []struct {
	err    error
	status int
	code   string
}{
	{auth.ErrQuota, http.StatusForbidden, api.CodeQuota},
	{auth.ErrForbidden, http.StatusForbidden, api.CodeForbidden},
	{auth.ErrInvalid, http.StatusBadRequest, api.CodeInvalid},
	{auth.ErrTokenNotFound, http.StatusNotFound, api.CodeNotFound},
	{pool.ErrInvalid, http.StatusBadRequest, api.CodeInvalid},
	{errBadRequest, http.StatusBadRequest, api.CodeInvalid},
	{errUnauthorized, http.StatusUnauthorized, api.CodeUnauthorized},
	{pool.ErrVolumeNotFound, http.StatusNotFound, api.CodeNotFound},
	{pool.ErrDiskNotFound, http.StatusNotFound, api.CodeNotFound},
	{pool.ErrSnapshotNotFound, http.StatusNotFound, api.CodeNotFound},
	{pool.ErrAttachmentNotFound, http.StatusNotFound, api.CodeNotFound},
	{pool.ErrInUse, http.StatusConflict, api.CodeInUse},
	{pool.ErrHasSnapshots, http.StatusConflict, api.CodeHasSnapshots},
	{pool.ErrNoCheckpoint, http.StatusConflict, api.CodeNoCheckpoint},
	{pool.ErrNoKeyProvider, http.StatusUnprocessableEntity, api.CodeNoKeyProvider},
	{pool.ErrKeyUnavailable, http.StatusServiceUnavailable, api.CodeKeyUnavailable},
	{crypt.ErrUnreachable, http.StatusServiceUnavailable, api.CodeUnavailable}, // the KMS, creating a volume's KEK
	{pool.ErrEncrypted, http.StatusConflict, api.CodeEncrypted},
	{pool.ErrKeyShared, http.StatusConflict, api.CodeKeyShared},
	{backup.ErrNoTarget, http.StatusNotFound, api.CodeNotFound},
	{backup.ErrNotFound, http.StatusNotFound, api.CodeNotFound},
	{backup.ErrInvalid, http.StatusBadRequest, api.CodeInvalid},
	{backup.ErrExists, http.StatusConflict, api.CodeConflict},
	{backup.ErrLocked, http.StatusConflict, api.CodeBusy},
	{backup.ErrNoRepository, http.StatusConflict, api.CodeNoRepository},
	{backup.ErrWrongKey, http.StatusConflict, api.CodeWrongKey},
	{backup.ErrCorrupt, http.StatusConflict, api.CodeBackupDamaged},
	{objstore.ErrDenied, http.StatusBadGateway, api.CodeStoreDenied},
	{objstore.ErrUnreachable, http.StatusServiceUnavailable, api.CodeUnavailable},
	{pool.ErrFillSource, http.StatusServiceUnavailable, api.CodeUnavailable},
	{dr.ErrNoTarget, http.StatusNotFound, api.CodeNotFound},
	{dr.ErrNoSite, http.StatusNotFound, api.CodeNotFound},
	{dr.ErrDiverged, http.StatusConflict, api.CodeDiverged},
	{pool.ErrNotSupported, http.StatusUnprocessableEntity, api.CodeNotSupported},
	{pool.ErrBroken, http.StatusConflict, api.CodeBroken},
	{pool.ErrReadOnly, http.StatusConflict, api.CodeReadOnly},
	{job.ErrNotFound, http.StatusNotFound, api.CodeNotFound},
	{job.ErrInterrupted, http.StatusConflict, api.CodeInterrupted},
	{errRouteNotFound, http.StatusNotFound, api.CodeNotFound},
	{errMethod, http.StatusMethodNotAllowed, api.CodeInvalid},
	{pool.ErrExists, http.StatusConflict, api.CodeConflict},
	{pool.ErrBusy, http.StatusConflict, api.CodeBusy},
	{context.Canceled, http.StatusConflict, api.CodeCancelled},
	{pool.ErrCapacity, http.StatusUnprocessableEntity, api.CodeCapacity},
	{pool.ErrNoSpace, http.StatusInsufficientStorage, api.CodeNoSpace},
	{cluster.ErrNotEnoughNodes, http.StatusUnprocessableEntity, api.CodeNotEnoughNodes},
	{cluster.ErrVolumeExists, http.StatusConflict, api.CodeConflict},
	{cluster.ErrVolumeDeleting, http.StatusConflict, api.CodeDeleting},
	{cluster.ErrDeleteRefused, http.StatusConflict, api.CodeInUse},
	{cluster.ErrVolumeNotFound, http.StatusNotFound, api.CodeNotFound},
	{cluster.ErrTimeout, http.StatusServiceUnavailable, api.CodeUnavailable},
	{cluster.ErrNoSession, http.StatusServiceUnavailable, api.CodeUnavailable},
	{cluster.ErrUnknownOutcome, http.StatusServiceUnavailable, api.CodeUnavailable},
	{cluster.ErrNotPrimary, http.StatusConflict, api.CodeNotPrimary},
	{cluster.ErrNotSupported, http.StatusUnprocessableEntity, api.CodeNotSupported},
	{cluster.ErrDegraded, http.StatusConflict, api.CodeDegraded},
	{cluster.ErrNodeNotFound, http.StatusNotFound, api.CodeNotFound},
	{errWrongNode, http.StatusConflict, api.CodeWrongNode},
	{cluster.ErrCopyMismatch, http.StatusConflict, api.CodeCopyMismatch},
	{cluster.ErrInvalidMember, http.StatusBadRequest, api.CodeInvalid},
	{cluster.ErrNameTaken, http.StatusConflict, api.CodeConflict},
	{cluster.ErrMemberPending, http.StatusConflict, api.CodeBusy},
	{cluster.ErrNodeInUse, http.StatusConflict, api.CodeNodeInUse},
	{cluster.ErrQuorum, http.StatusConflict, api.CodeQuorum},
	{errUnavailable, http.StatusServiceUnavailable, api.CodeUnavailable},
	{errNoPrimary, http.StatusServiceUnavailable, api.CodeUnavailable},
	{errNoNBD, http.StatusUnprocessableEntity, api.CodeNotSupported},
}

// stagingPath matches the part of a file name in a message that lies in
// the pool's staging area ("/srv/pool/staging/clone-3f2a/", or relative):
// the work directory of an operation, which means nothing to a user and is
// gone by the time they read it.
var stagingPath = regexp.MustCompile(`[^\s"':]*\bstaging/[^/\s"':]+/`)

// toError maps any error to its HTTP status and wire error. File names in
// the pool's staging area are shown without it: "open vdi-001/disks/root.img".
func toError(err error) (int, api.Error) {
	e := api.Error{Code: api.CodeInternal, Message: stagingPath.ReplaceAllString(err.Error(), "")}
	var fe *pool.FieldError
	if errors.As(err, &fe) {
		e.Field = fe.Field
	}
	var be *badRequest
	if errors.As(err, &be) {
		e.Field = be.field
	}
	for _, m := range errorMapping {
		if errors.Is(err, m.err) {
			e.Code = m.code
			return m.status, e
		}
	}
	return http.StatusInternalServerError, e
}

var (
	errBadRequest    = errors.New("bad request")
	errRouteNotFound = errors.New("no such API route; see docs/api.md")
	errMethod        = errors.New("method not allowed on this route")
	// errUnavailable wraps a failure to reach the cluster's state (etcd).
	errUnavailable = errors.New("cluster state unavailable")
	// errNoPrimary: no node serves the volume now (a failover is under
	// way); asking again later finds the new primary.
	errNoPrimary = errors.New("ask again in a moment")
	// errNoNBD: the node serves NBD on no TCP address.
	errNoNBD = errors.New("NBD is not served over TCP")
)

// badRequest is a malformed request (body, query) that never reached the
// domain. It matches errBadRequest.
type badRequest struct {
	field string
	msg   string
}

func (e *badRequest) Error() string        { return e.msg }
func (e *badRequest) Is(target error) bool { return target == errBadRequest }
