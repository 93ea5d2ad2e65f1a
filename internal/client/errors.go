package client

import (
	"errors"
	"fmt"

	"github.com/quiverstorage/quiver/internal/api"
)

// Error is a failure the server reported: a non-2xx answer, or a job that
// ended failed or cancelled.
type Error struct {
	// Status is the HTTP status, or 0 when the error is a finished job's.
	Status int
	// Detail is the body's error; Detail.Code is empty when the body was
	// not the API's envelope (an answer from a proxy, say).
	Detail api.Error
}

// Error returns the server's message.
func (e *Error) Error() string {
	if e.Detail.Message != "" {
		return e.Detail.Message
	}
	if e.Detail.Code != "" {
		return e.Detail.Code
	}
	return fmt.Sprintf("HTTP status %d", e.Status)
}

// Code is the stable error code of err (api.CodeNotFound, …), or "" when
// err is not an *Error.
func Code(err error) string {
	var e *Error
	if errors.As(err, &e) {
		return e.Detail.Code
	}
	return ""
}

// IsNotFound reports whether the volume, disk, snapshot or job is unknown.
func IsNotFound(err error) bool { return Code(err) == api.CodeNotFound }

// IsConflict reports whether the name is taken by an object of another spec.
func IsConflict(err error) bool { return Code(err) == api.CodeConflict }

// IsBusy reports whether another operation holds the volume.
func IsBusy(err error) bool { return Code(err) == api.CodeBusy }

// IsUnauthorized reports whether the bearer token was missing or wrong.
func IsUnauthorized(err error) bool { return Code(err) == api.CodeUnauthorized }

// IsCancelled reports whether the job was cancelled.
func IsCancelled(err error) bool { return Code(err) == api.CodeCancelled }

// jobError is the *Error of a job that ended in state failed or cancelled.
func jobError(job api.Job) error {
	e := &Error{}
	if job.Error != nil {
		e.Detail = *job.Error
	}
	if job.State == api.JobCancelled && e.Detail.Code == "" {
		e.Detail.Code = api.CodeCancelled
	}
	if e.Detail.Message == "" {
		e.Detail.Message = fmt.Sprintf("job %s (%s %s) %s", job.ID, job.Kind, job.Target, job.State)
	}
	return e
}

// IsInUse reports whether the volume still has attachments.
func IsInUse(err error) bool { return Code(err) == api.CodeInUse }

// IsHasSnapshots reports a volume deletion refused because the volume has
// snapshots and Recursive was not given.
func IsHasSnapshots(err error) bool { return Code(err) == api.CodeHasSnapshots }

// IsKeyShared reports a shred refused because clones share the volume's
// data key and were not named.
func IsKeyShared(err error) bool { return Code(err) == api.CodeKeyShared }
