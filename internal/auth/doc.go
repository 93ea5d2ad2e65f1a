// Package auth owns who may use a node: tenants, their quotas, and the API
// tokens that act for them, each with a role (docs/security.md, "Tenants").
//
// Tokens are stored hashed (SHA-256 of a 256-bit random secret) in the
// pool's tokens.json, which is replaced atomically and durably
// (durable.WriteJSON) on every change. A token's secret is shown once, when
// it is created. Revoking a token closes its Done channel, which the API and
// NBD servers watch to end the token's connections.
//
// It must not import the transports (apiserver, nbd).
//
// Imports from quiver: pool.
package auth
