// Package hook is quiver's KubeVirt hook sidecar: a gRPC server on a unix
// socket in /var/run/kubevirt-hooks/ that virt-launcher calls before it
// defines a VM's libvirt domain. OnDefineDomain adds, for each KubeVirt
// volume the VMI's quiver.io/extra-disks annotation names, the volume's
// other disks as <disk type='file'> elements beside the disk.img KubeVirt
// boots: same directory, same driver settings as that primary disk, serial =
// disk name, a target of their own. Anything it cannot do whole (a disk file
// missing, a name or target used twice, a domain it cannot parse) is an
// error, so the VM does not start rather than boot with a disk missing.
//
// When the directory of a volume's disk.img is the compute node's endpoint
// (internal/endpoint: a quiver-endpoint.json beside an nbd.sock and an empty
// placeholder disk.img), every disk of the volume, the primary included, is
// an NBD disk on that socket instead (<disk type='network'>, export = disk
// name, QEMU's reconnect-delay set), with or without the annotation.
// KubeVirt's XML is edited in place, never re-encoded (rewrite.go).
//
// It serves the Info service and Callbacks v1alpha3 and v1alpha2 (hookapi).
//
// It reads the endpoint's manifest and its layout of Block-mode disks
// (endpoint.Manifest, SlotSize).
//
// Imports from quiver: endpoint, kubevirt, kubevirt/hookapi/info, kubevirt/hookapi/v1alpha2,
// kubevirt/hookapi/v1alpha3.
package hook
