package pool

import "fmt"

// Idempotency says when a create may answer with an object that already
// exists under the name asked for. The zero value allows none: a create of
// a taken name fails with ErrExists, whatever the spec, so a job that reuses
// a name (a nightly snapshot) learns it instead of getting the old object.
// Retries belong to callers that name their request.
type Idempotency struct {
	// Key names the request. It is stored with the object made; a create
	// with the same key that finds the object made with it, of the same
	// spec, returns it (a retry after a lost answer).
	Key string
	// SameSpec returns an existing object of the same spec whatever key it
	// was made with: the opt-in idempotent create.
	SameSpec bool
	// UID, when set, is the UID of the snapshot made (instead of a new
	// one): a cluster's copies take the one their primary gave its own
	// snapshot (docs/cluster.md).
	UID string
}

// MaxIdempotencyKey bounds the length of an idempotency key.
const MaxIdempotencyKey = 256

// ValidateIdempotencyKey checks a key: at most MaxIdempotencyKey printable
// ASCII characters (it is stored in manifests and compared byte for byte).
func ValidateIdempotencyKey(field, key string) error {
	if len(key) > MaxIdempotencyKey {
		return invalid(field, "", fmt.Sprintf("must be at most %d characters", MaxIdempotencyKey))
	}
	for _, r := range key {
		if r < 0x20 || r > 0x7e {
			return invalid(field, "", "must be printable ASCII")
		}
	}
	return nil
}

// allows reports whether a create with i may return an existing object of
// the same spec that was made with the key stored.
func (i Idempotency) allows(stored string) bool {
	return i.SameSpec || (i.Key != "" && i.Key == stored)
}

// existsError is the ErrExists of a create that found name taken: what to
// do about it, and why an identical retry was not enough.
func (i Idempotency) existsError(what string, sameSpec bool) error {
	switch {
	case !sameSpec:
		return fmt.Errorf("%s already exists with another spec; pick another name, or delete it first: %w", what, ErrExists)
	case i.Key != "":
		return fmt.Errorf("%s already exists and was not made by a request with this idempotency key; pick another name, or delete it first: %w", what, ErrExists)
	}
	return fmt.Errorf("%s already exists; pick another name, or delete it first: %w", what, ErrExists)
}
