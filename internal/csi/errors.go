package csi

import (
	"context"
	"errors"
	"net"
	"syscall"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/quiverstorage/quiver/internal/api"
	"github.com/quiverstorage/quiver/internal/client"
)

// Sentinels of the CSI plugin, wrapped with what failed; test with errors.Is.
// toStatus maps each to the gRPC code the CSI spec names for the case.
var (
	// ErrInvalid: a required field is missing or a field breaks a rule.
	ErrInvalid = errors.New("invalid argument")
	// ErrNotFound: the volume, snapshot, node or publication is unknown.
	ErrNotFound = errors.New("not found")
	// ErrExists: the name is taken by an object of another spec, or the
	// volume is already published with other attributes.
	ErrExists = errors.New("already exists")
	// ErrBusy: another operation on the same volume is in progress.
	ErrBusy = errors.New("an operation on this volume is in progress")
	// ErrBadToken: a pagination token this plugin did not make.
	ErrBadToken = errors.New("invalid starting token")
	// ErrOutOfRange: a capacity range the volume cannot satisfy.
	ErrOutOfRange = errors.New("capacity out of range")
	// ErrOffset: a starting offset negative or past the end of the
	// snapshot (SnapshotMetadata).
	ErrOffset = errors.New("offset out of range")
	// ErrPrecondition: the request is valid but the state forbids it now.
	ErrPrecondition = errors.New("failed precondition")
	// ErrUnauthenticated: no valid API token, neither configured nor in
	// the request's secrets.
	ErrUnauthenticated = errors.New("unauthenticated")
	// ErrNoSpace: the pool cannot hold the volume, or the topology asked
	// for cannot be met.
	ErrNoSpace = errors.New("resource exhausted")
	// ErrUnimplemented: an RPC whose capability this plugin does not
	// advertise.
	ErrUnimplemented = errors.New("not implemented by the quiver CSI plugin")
)

// sentinelCodes maps the plugin's sentinels to gRPC codes; the first match
// wins.
var sentinelCodes = []struct {
	err  error
	code codes.Code
}{
	{ErrInvalid, codes.InvalidArgument},
	{ErrNotFound, codes.NotFound},
	{ErrExists, codes.AlreadyExists},
	{ErrBusy, codes.Aborted},
	{ErrBadToken, codes.Aborted},
	{ErrOutOfRange, codes.OutOfRange},
	{ErrOffset, codes.OutOfRange},
	{ErrPrecondition, codes.FailedPrecondition},
	{ErrUnauthenticated, codes.Unauthenticated},
	{ErrNoSpace, codes.ResourceExhausted},
	{ErrUnimplemented, codes.Unimplemented},
	{context.DeadlineExceeded, codes.DeadlineExceeded},
	{context.Canceled, codes.Canceled},
}

// apiCodes maps the quiver API's stable error codes to gRPC codes, for API
// errors that reach the boundary without a sentinel.
var apiCodes = map[string]codes.Code{
	api.CodeInvalid:      codes.InvalidArgument,
	api.CodeUnauthorized: codes.Unauthenticated,
	api.CodeNotFound:     codes.NotFound,
	api.CodeConflict:     codes.AlreadyExists,
	api.CodeBusy:         codes.Aborted,
	api.CodeCapacity:     codes.OutOfRange,
	api.CodeNoSpace:      codes.ResourceExhausted,
	api.CodeCancelled:    codes.Aborted,
	api.CodeInUse:        codes.FailedPrecondition,
	// Fewer storage nodes than the StorageClass's replication: the
	// provisioner retries, and succeeds once enough nodes are up.
	api.CodeNotEnoughNodes: codes.ResourceExhausted,
	api.CodeUnavailable:    codes.Unavailable,
	api.CodeNotPrimary:     codes.FailedPrecondition,
	api.CodeNotSupported:   codes.FailedPrecondition,
	// A snapshot without change tracking: the spec's "changed block
	// tracking is not enabled" (GetMetadataDelta), for a full backup.
	api.CodeNoCheckpoint: codes.FailedPrecondition,
	// A DR target holding none of the points a delta could start from
	// (csi-addons Resync, Promote): the relationship needs an operator.
	api.CodeDiverged:  codes.FailedPrecondition,
	api.CodeForbidden: codes.PermissionDenied,
	// Direct access to an encrypted volume's image files.
	api.CodeEncrypted:      codes.FailedPrecondition,
	api.CodeKeyUnavailable: codes.Unavailable,
	api.CodeNoKeyProvider:  codes.FailedPrecondition,
	api.CodeInternal:       codes.Internal,
}

// toStatus is the one mapping from errors to gRPC status codes. An error
// that already carries a status keeps it; a plugin sentinel or an API error
// code gets its code; an unreachable API is Unavailable; anything else is
// Internal. The message is always the error's own text.
func toStatus(err error) error {
	if err == nil {
		return nil
	}
	if _, ok := status.FromError(err); ok {
		return err
	}
	return status.Error(codeOf(err), err.Error())
}

func codeOf(err error) codes.Code {
	for _, m := range sentinelCodes {
		if errors.Is(err, m.err) {
			return m.code
		}
	}
	if c := client.Code(err); c != "" {
		if code, ok := apiCodes[c]; ok {
			return code
		}
		return codes.Internal
	}
	var netErr net.Error
	if errors.Is(err, syscall.ECONNREFUSED) || errors.As(err, &netErr) {
		return codes.Unavailable
	}
	return codes.Internal
}
