// Package testserver is test support for the process-level test suites
// (test/crash, test/interop, test/nbdcrash, test/qos, internal/csi): it
// builds the quiver binary once, finds free loopback ports and collects a
// server's log. Each suite keeps its own server type, since each starts
// quiver differently.
//
// It imports only the Go client (to wait for a server's API) and is
// imported only by tests.
//
// Imports from quiver: client.
package testserver
