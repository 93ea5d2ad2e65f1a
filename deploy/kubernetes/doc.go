// Package manifests holds the Kubernetes manifests of the quiver CSI driver
// (the YAML files beside this one) and the test that decodes each strictly
// with the Kubernetes API types. It has no code of its own.
//
// Imports from quiver: nothing.
package manifests
