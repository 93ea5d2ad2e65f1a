// Package apiserver serves quiver's v1 HTTP/JSON API (wire types in package
// api) over a pool and a job manager.
//
// It is a transport: it decodes and validates requests, calls the domain
// (pool) and maps domain errors to HTTP statuses and stable codes in exactly
// one place (errors.go). It imports api, pool and job; nothing in the domain
// imports it.
//
// With a Cluster (a node of a cluster, internal/cluster) it creates, deletes
// and looks up volumes cluster-wide and lists the nodes, and with Peers it
// carries the requests that must run on a volume's primary to it, for the
// caller, and returns the primary's answer unchanged (forward.go).
//
// Every request acts for an auth.Principal (tenancy.go), from its bearer
// token or its client certificate (certauth.go): routes name the action
// they need, and a tenant's token sees only its tenant's volumes, by its
// own names (docs/security.md, "Tenants").
//
// Imports from quiver: api, audit, auth, backup, buildinfo, cluster, crypt, dr, job, metrics, objstore, pool, qos, quantity.
package apiserver
