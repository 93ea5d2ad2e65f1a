// Package objstore is quiver's view of an object store: named, immutable
// objects written whole, listed by prefix. Backups (internal/backup) keep
// their repository in one. The S3 implementation (s3.go) talks to any
// S3-compatible server through minio-go.
//
// Durability: Put returns once the store acknowledged the object whole (the
// PUT succeeded; a reader then sees all of it or nothing).
//
// Imports from quiver: nothing.
package objstore

import (
	"context"
	"errors"
)

// ErrNotFound: no object under that key.
var ErrNotFound = errors.New("object not found")

// ErrUnreachable: the store did not answer (network, DNS, TLS, a server
// error); the operation may be retried.
var ErrUnreachable = errors.New("object store unreachable")

// ErrShort: the object ends before the range read (a damaged or
// truncated object, or a wrong offset).
var ErrShort = errors.New("object shorter than the range read")

// ErrDenied: the store refused the credentials or the access.
var ErrDenied = errors.New("object store refused access")

// Store is an object store. Keys are slash-separated paths without a
// leading slash. Every method is safe for concurrent use.
type Store interface {
	// Put stores data under key, replacing any object there; durable as
	// the package comment says when it returns nil.
	Put(ctx context.Context, key string, data []byte) error
	// Get returns the object under key (ErrNotFound when there is none).
	// At most limit bytes are read; a larger object is an error.
	Get(ctx context.Context, key string, limit int64) ([]byte, error)
	// GetRange returns length bytes of the object under key from offset
	// off (ErrNotFound when there is none); fewer bytes there is ErrShort.
	GetRange(ctx context.Context, key string, off, length int64) ([]byte, error)
	// List calls fn with every key under prefix, in lexical order.
	List(ctx context.Context, prefix string, fn func(key string, size int64) error) error
	// Delete removes the object under key; a missing one is no error.
	Delete(ctx context.Context, key string) error
	// String names the store for messages (no secret in it).
	String() string
}
