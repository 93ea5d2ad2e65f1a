package auth

import "errors"

var (
	// ErrUnauthenticated: no token, or one that is unknown or revoked.
	ErrUnauthenticated = errors.New("missing, unknown or revoked bearer token")
	// ErrForbidden: the token's role does not allow the operation.
	ErrForbidden = errors.New("forbidden for this token's role")
	// ErrQuota: the operation would take the tenant over one of its quotas.
	ErrQuota = errors.New("tenant quota exceeded")
	// ErrTokenNotFound: no token has that ID.
	ErrTokenNotFound = errors.New("token not found")
	// ErrInvalid: a field of a request or of tokens.json breaks a rule.
	ErrInvalid = errors.New("invalid")
)
