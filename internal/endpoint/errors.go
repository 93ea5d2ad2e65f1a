package endpoint

import "errors"

// Errors of the endpoint's control API, mapped to HTTP statuses once
// (control.go).
var (
	// ErrInvalid is a malformed publication: a bad name, no disk, no token.
	ErrInvalid = errors.New("invalid publication")
	// ErrNotFound is a volume not published on this endpoint.
	ErrNotFound = errors.New("volume not published on this endpoint")
)
