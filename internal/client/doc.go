// Package client is the Go client of the quiver HTTP API (docs/api.md): one
// method per route, with the wire types of internal/api, and Metrics, which
// scrapes the server's /metrics and parses the Prometheus text format
// (prometheus/common/expfmt).
//
// It speaks to a server at http://host:port, https://host:port or over a
// unix socket (unix:///path/to.sock). Non-2xx answers come back as *Error,
// so callers branch with errors.As or IsNotFound, IsConflict and IsBusy,
// never on messages.
//
// Of quiver it imports internal/api, for the wire types only; it must not
// import the server side (internal/server, internal/pool, internal/job)
// itself.
//
// Imports from quiver: api.
package client
