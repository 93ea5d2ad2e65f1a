// Package apiserver serves quiver's v1 HTTP/JSON API (wire types in package
// api) over a pool and a job manager.
//
// It is a transport: it decodes and validates requests, calls the domain
// (pool) and maps domain errors to HTTP statuses and stable codes in exactly
// one place (errors.go). It imports api, pool and job; nothing in the domain
// imports it.
//
// With a Cluster (a node of a cluster, internal/cluster) it creates, deletes
// and looks up volumes cluster-wide and lists the nodes.
//
// Imports from quiver: api, buildinfo, cluster, job, pool, qos, quantity.
package apiserver
