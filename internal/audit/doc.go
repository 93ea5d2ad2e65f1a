// Package audit owns a node's audit log: every change asked of the API and
// every refusal of a credential, one JSON line each, in the pool's audit/
// directory, rotated by size within a bounded number of files
// (docs/security.md, "Audit log"). It never holds a request's body or a
// secret.
//
// It must not import the transports (apiserver, nbd).
//
// Imports from quiver: api, storage.
package audit
