package replica

import "errors"

var (
	// ErrCopyDown: a copy did not answer (connection lost, or no answer
	// within the timeout).
	ErrCopyDown = errors.New("copy unreachable")
	// ErrCopyRefused: a copy answered a request with an NBD error.
	ErrCopyRefused = errors.New("copy refused the request")
	// ErrHandshake: the copy's NBD server refused the export.
	ErrHandshake = errors.New("nbd handshake with the copy failed")
	// ErrNotAcknowledged: a copy failed and could not be recorded out of
	// sync, so the request is not acknowledged (the primary may be
	// partitioned from etcd).
	ErrNotAcknowledged = errors.New("not acknowledged: a copy failed and could not be marked out of sync")
	// ErrSessionRefused: a copy node refused to open a replication
	// session (a credential not signed for it, not its volume's primary
	// and term now, or not newer than its disk's newest session).
	ErrSessionRefused = errors.New("replication session refused")
	// ErrSessionFenced: a request of a replication session that a newer
	// session of its disk replaced; it is refused, never applied.
	ErrSessionFenced = errors.New("replication session fenced by a newer one")
)
