package hook

import (
	"fmt"
	"path"
	"strconv"

	"libvirt.org/go/libvirtxml"

	"github.com/quiverstorage/quiver/internal/endpoint"
	"github.com/quiverstorage/quiver/internal/kubevirt"
)

// maxSocketPath is the longest unix socket path: sun_path holds 108 bytes,
// the terminating NUL included.
const maxSocketPath = 108 - 1

// endpointDir is the directory of a quiver volume published by the compute
// node's endpoint (internal/endpoint), as QEMU sees it: endpoint.SocketName
// serves the volume's disks as NBD exports named by disk, disk.img is an
// empty placeholder KubeVirt needs and must never be given to QEMU.
type endpointDir struct {
	socket string // the NBD socket's path as QEMU sees it
	delay  uint   // QEMU's reconnect-delay, seconds
}

// newEndpointDir is volume's endpoint directory dir, the directory of its
// disk.img in the domain.
func newEndpointDir(volume, dir string, delay uint) (*endpointDir, error) {
	ep := &endpointDir{socket: path.Join(dir, endpoint.SocketName), delay: delay}
	if len(ep.socket) > maxSocketPath {
		return nil, fmt.Errorf("volume %s: the endpoint socket %s is %d bytes long, and a unix socket path has at most %d (108 with its NUL); give the VMI volume a shorter name: %w",
			volume, ep.socket, len(ep.socket), maxSocketPath, kubevirt.ErrInvalid)
	}
	return ep, nil
}

// source is the <source> of disk on the endpoint's socket.
func (ep *endpointDir) source(disk string) *libvirtxml.DomainDiskSource {
	return &libvirtxml.DomainDiskSource{Network: &libvirtxml.DomainDiskSourceNetwork{
		Protocol:  "nbd",
		Name:      disk,
		Hosts:     []libvirtxml.DomainDiskSourceHost{{Transport: "unix", Socket: ep.socket}},
		Reconnect: &libvirtxml.DomainDiskSourceNetworkReconnect{Delay: strconv.FormatUint(uint64(ep.delay), 10)},
	}}
}

// networkDriver turns a file disk's driver into one for QEMU's nbd driver:
// raw (the endpoint serves the disks' bytes), and no io mode (native and
// io_uring are modes of QEMU's file driver, which an NBD disk does not
// use). cache (libvirt gives QEMU's nbd node cache.direct for "none"),
// discard, error policies and iothread stay.
func networkDriver(d *libvirtxml.DomainDiskDriver) {
	if d == nil {
		return
	}
	d.Type = "raw"
	d.IO = ""
}
