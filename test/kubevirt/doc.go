// Package kubevirt is the end-to-end test of quiver's KubeVirt hook with
// real libvirt: a quiver volume with three disks (disk, data, logs) lives
// in a real quiver server's pool; a domain of the shape KubeVirt generates
// for a Filesystem PVC (its primary disk the volume's disks/disk.img, as a
// PVC mount shows it) goes through the hook over gRPC, as virt-launcher
// sends it; libvirtd (QEMU driver, TCG) defines and starts the returned
// domain. The guest (internal/testguest: Debian's kernel, a busybox
// initramfs) lists its virtio disks with their serials and writes a marker
// naming the serial to the first sector of each, then powers off. Read back
// through quiver's NBD export of each disk, every marker must be on the
// disk its serial names. TestLibvirtEndpointEveryDisk does the same with
// the volume served by a compute node's endpoint (internal/endpoint): the
// hook gives QEMU every disk on the endpoint's NBD socket.
// TestLibvirtEndpointBlock does it for a Block-mode PVC: the PVC's device
// is the endpoint's @disks export (nbdfuse and a loop device, made by the
// endpoint's device agent) and the hook gives QEMU each disk as a
// shareable <slices> of it.
//
// TestLiveMigrationEveryDisk live-migrates the hook's domain between two
// libvirtd (network and mount namespaces of their own) sharing the
// volume's disks directory; TestLiveMigrationEndpoints migrates it there
// and back endpointMigrations times between two compute nodes, each with
// its own endpoint and attachment bound at the same PVC path, and checks
// the attachments' handover (the source fenced once the destination
// writes, then detached).
//
// Run it with
//
//	go test -v ./test/kubevirt/
//
// It needs root, libvirtd, virtlogd and virsh (Debian:
// libvirt-daemon-system, libvirt-clients), qemu-system-x86_64, qemu-img,
// busybox-static and what internal/testguest needs to fetch the kernel;
// the Block-mode test nbdfuse (libnbd-bin), losetup and /dev/fuse; the
// migration tests ip, unshare and nsenter.
// Without them it skips, except when CI is set: there it fails. The test
// starts virtlogd and libvirtd itself when no libvirtd answers on
// qemu:///system, and stops them (by PID) when it ends.
package kubevirt
