// Package webhook is quiver's optional KubeVirt mutating admission webhook.
// For a VirtualMachineInstance (or a VirtualMachine's template) with quiver
// PVCs it describes each volume's disks in an annotation the hook sidecar
// acts on, and adds that sidecar (one, asking KubeVirt for no PVC) to
// hooks.kubevirt.io/hookSidecars, so an ordinary VM with one PVC boots with
// every disk of its volume:
//
//   - a Filesystem PVC of a single node's volume: the other disks, files
//     beside disk.img, in quiver.io/extra-disks;
//   - a Filesystem PVC of a cluster's volume, which the CSI node plugin
//     stages at the compute node's endpoint: every disk, disk included, in
//     quiver.io/endpoint-disks (served on the PVC's nbd.sock);
//   - a Block PVC, one device holding every disk (disk i at
//     i*endpoint.SlotSize): the layout in quiver.io/block-disks.
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
