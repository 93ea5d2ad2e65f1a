package csi

import (
	"context"
	"errors"
	"fmt"
	"net"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/quiverstorage/quiver/internal/api"
	"github.com/quiverstorage/quiver/internal/client"
)

func apiErr(code string) error {
	return fmt.Errorf("call: %w", &client.Error{Status: 400, Detail: api.Error{Code: code, Message: "server says " + code}})
}

func TestToStatus(t *testing.T) {
	cases := []struct {
		err  error
		code codes.Code
	}{
		{fmt.Errorf("x: %w", ErrInvalid), codes.InvalidArgument},
		{fmt.Errorf("x: %w", ErrNotFound), codes.NotFound},
		{fmt.Errorf("x: %w", ErrExists), codes.AlreadyExists},
		{fmt.Errorf("x: %w", ErrBusy), codes.Aborted},
		{fmt.Errorf("x: %w", ErrBadToken), codes.Aborted},
		{fmt.Errorf("x: %w", ErrOutOfRange), codes.OutOfRange},
		{fmt.Errorf("x: %w", ErrOffset), codes.OutOfRange},
		{fmt.Errorf("x: %w", ErrPrecondition), codes.FailedPrecondition},
		{fmt.Errorf("x: %w", ErrUnauthenticated), codes.Unauthenticated},
		{fmt.Errorf("x: %w", ErrNoSpace), codes.ResourceExhausted},
		{fmt.Errorf("x: %w", ErrUnimplemented), codes.Unimplemented},
		{fmt.Errorf("x: %w", context.DeadlineExceeded), codes.DeadlineExceeded},
		{apiErr(api.CodeInvalid), codes.InvalidArgument},
		{apiErr(api.CodeUnauthorized), codes.Unauthenticated},
		{apiErr(api.CodeNotFound), codes.NotFound},
		{apiErr(api.CodeConflict), codes.AlreadyExists},
		{apiErr(api.CodeBusy), codes.Aborted},
		{apiErr(api.CodeCapacity), codes.OutOfRange},
		{apiErr(api.CodeNoSpace), codes.ResourceExhausted},
		{apiErr(api.CodeInUse), codes.FailedPrecondition},
		{apiErr(api.CodeNotEnoughNodes), codes.ResourceExhausted},
		{apiErr(api.CodeUnavailable), codes.Unavailable},
		{apiErr(api.CodeNotPrimary), codes.FailedPrecondition},
		{apiErr(api.CodeNotSupported), codes.FailedPrecondition},
		{apiErr(api.CodeNoCheckpoint), codes.FailedPrecondition},
		{apiErr(api.CodeDiverged), codes.FailedPrecondition},
		{apiErr(api.CodeForbidden), codes.PermissionDenied},
		{apiErr(api.CodeEncrypted), codes.FailedPrecondition},
		{apiErr(api.CodeKeyUnavailable), codes.Unavailable},
		{apiErr(api.CodeNoKeyProvider), codes.FailedPrecondition},
		{apiErr(api.CodeInternal), codes.Internal},
		{apiErr("SomethingNew"), codes.Internal},
		// A sentinel wins over the API code it wraps.
		{fmt.Errorf("%w (%w)", ErrBusy, apiErr(api.CodeConflict)), codes.Aborted},
		{&net.OpError{Op: "dial", Net: "tcp", Err: errors.New("connection refused")}, codes.Unavailable},
		{errors.New("something else"), codes.Internal},
		{status.Error(codes.PermissionDenied, "kept"), codes.PermissionDenied},
	}
	for _, c := range cases {
		got := toStatus(c.err)
		if st, _ := status.FromError(got); st.Code() != c.code || st.Message() != c.err.Error() && c.code != codes.PermissionDenied {
			t.Errorf("toStatus(%v) = %v %q, want %v with the error's message", c.err, st.Code(), st.Message(), c.code)
		}
	}
	if toStatus(nil) != nil {
		t.Error("toStatus(nil) is not nil")
	}
}
