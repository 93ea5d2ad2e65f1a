// Package kubevirt is the contract between quiver's KubeVirt admission
// webhook and its hook sidecar: the annotation keys under quiver.io/ that
// name, per KubeVirt volume, the quiver disks a VM gets besides the one
// KubeVirt boots (disk.img), their bus, and the minimal subset of KubeVirt's
// VirtualMachineInstance JSON both read. KubeVirt's Go API module is not
// available to this build, so the types here mirror the upstream field
// names of just the fields quiver needs.
//
// The sidecar (internal/kubevirt/hook) and the webhook
// (internal/kubevirt/webhook) import it; it imports no transport.
//
// Imports from quiver: nothing.
package kubevirt
