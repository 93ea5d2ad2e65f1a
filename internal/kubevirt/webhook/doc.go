// Package webhook is quiver's optional KubeVirt mutating admission webhook.
// For a VirtualMachineInstance (or a VirtualMachine's template) whose PVC is
// a quiver volume in Filesystem mode, it names the volume's other disks in
// the quiver.io/extra-disks annotation and adds the quiver hook sidecar to
// hooks.kubevirt.io/hookSidecars (for a one-disk volume too: on a compute
// node whose endpoint serves the volume, the hook gives QEMU the disks on
// the endpoint's socket), so an ordinary VM with one PVC boots with every
// disk of its volume. A Block-mode quiver PVC is one device holding every
// disk of its volume (the compute node's endpoint serves disk i at
// i*endpoint.SlotSize): the webhook lays them out in the
// quiver.io/block-disks annotation, and the hook gives QEMU each disk as a
// slice of the device.
//
// It learns a PVC's volume from Kubernetes (claims.go: the PVC, its PV, or
// its StorageClass while unbound, read with kube.go's client: in-cluster or
// a kubeconfig) and the volume's disks from the quiver API
// (internal/client); when told to, it writes its CA into its own
// MutatingWebhookConfiguration (cabundle.go). It decodes only the fields it needs of KubeVirt's
// objects and answers with a JSON Patch.
//
// Imports from quiver: api, client, kubevirt.
package webhook
