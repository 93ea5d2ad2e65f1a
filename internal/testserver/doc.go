// Package testserver is test support for the process-level test suites
// (test/crash, test/interop, test/nbdcrash, test/qos, internal/csi): it
// builds the quiver binary once per flavour (with or without the race
// detector), runs `quiver server` on loopback port 0 and learns its
// addresses from the ready file (--ready-file), kills it or stops it
// gracefully, and collects and checks its log. Every process-level test
// runs its servers through Process.
//
// It imports the wire types and the Go client (to read the ready file and
// talk to the API) and testfs (to skip or fail when go is missing), and is
// imported only by tests.
//
// Imports from quiver: api, client, testfs.
package testserver
