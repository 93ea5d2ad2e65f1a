// Package sanitytest runs csi-sanity (kubernetes-csi/csi-test) against a
// CSI endpoint inside a Go test, with quiver's rule on skips: only the
// capabilities quiver does not advertise may skip (AllowedSkips), any other
// skip fails the test, so a capability cannot stop being tested silently.
// The single-node test (internal/csi) and the cluster test (test/cluster)
// both run it.
//
// sanitytest is for tests only (it imports testing and ginkgo, and calls
// ginkgo.RunSpecs, which a test binary may do once).
//
// Imports from quiver: nothing.
package sanitytest
