// Package hook is quiver's KubeVirt hook sidecar: a gRPC server on a unix
// socket in /var/run/kubevirt-hooks/ that virt-launcher calls before it
// defines a VM's libvirt domain. OnDefineDomain gives QEMU every disk of
// each quiver volume of the VMI, as the webhook's annotations describe them
// (internal/kubevirt, annotations.go):
//
//   - quiver.io/extra-disks: the volume's other disks as <disk type='file'>
//     elements beside the disk.img KubeVirt boots: same directory, same
//     driver settings as that primary disk, serial = disk name, a target of
//     their own;
//   - quiver.io/endpoint-disks: the volume's directory is the compute node's
//     endpoint (internal/endpoint: an nbd.sock beside an empty placeholder
//     disk.img): every disk, the primary included, is an NBD disk on that
//     socket (<disk type='network'>, export = disk name, QEMU's
//     reconnect-delay set);
//   - quiver.io/block-disks: the Block-mode PVC's one device holds every disk,
//     each given as a slice of it.
//
// The sidecar reads no file of the PVC: KubeVirt could show it the PVC only
// by naming the claim a second time in the launcher pod, which the kubelet
// never mounts (the pod waits for ever). Anything it cannot do whole (a name
// or target used twice, an annotation or a domain it cannot parse) is an
// error, so the VM does not start rather than boot with a disk missing; a
// disk file that is missing makes QEMU refuse to start. KubeVirt's XML is
// edited in place, never re-encoded (rewrite.go).
//
// It serves the Info service and Callbacks v1alpha3 and v1alpha2 (hookapi).
//
// It takes the endpoint's socket name and its layout of Block-mode disks
// from internal/endpoint (SocketName, SlotSize).
//
// Imports from quiver: endpoint, kubevirt, kubevirt/hookapi/info, kubevirt/hookapi/v1alpha2,
// kubevirt/hookapi/v1alpha3.
package hook
