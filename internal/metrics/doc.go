// Package metrics exports quiver's Prometheus metrics (with the Prometheus
// Go client) and wraps disk handles to count, time and throttle (qos) every
// request of the data path. Per-request accounting is a few atomic
// operations: label values are resolved once per handle, never per request.
//
// It imports pool (the disk interface and pool state), qos and the
// Prometheus client; the NBD server uses it through its export resolver.
//
// Imports from quiver: pool, qos.
package metrics
