// Package manifests holds the Kubernetes manifests of the quiver CSI driver
// (the YAML files beside this one, for kubectl apply, with placeholders for
// the secrets) and the tests that decode each strictly with the Kubernetes
// API types. The same tests render the Helm chart (../helm/quiver) with the
// Helm CLI of scripts/helm, check each install mode of it, and check that
// its default install is what these manifests install. It has no code of
// its own.
//
// Imports from quiver: nothing.
package manifests
