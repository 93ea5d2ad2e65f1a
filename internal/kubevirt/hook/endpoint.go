package hook

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strconv"

	"libvirt.org/go/libvirtxml"

	"github.com/quiverstorage/quiver/internal/endpoint"
	"github.com/quiverstorage/quiver/internal/kubevirt"
)

// maxSocketPath is the longest unix socket path: sun_path holds 108 bytes,
// the terminating NUL included.
const maxSocketPath = 108 - 1

// maxManifest bounds the manifest read: a few hundred disks at most.
const maxManifest = 1 << 20

// endpointDir is the directory of a quiver volume published by the compute
// node's endpoint (internal/endpoint), as QEMU sees it: nbd.sock serves
// the volume's disks as NBD exports named by disk, disk.img is an empty
// placeholder KubeVirt needs and must never be given to QEMU.
type endpointDir struct {
	volume   string          // the KubeVirt volume
	manifest string          // the manifest's path, for messages
	socket   string          // the NBD socket's path as QEMU sees it
	disks    map[string]bool // the disks the manifest lists
	delay    uint            // QEMU's reconnect-delay, seconds
}

// findEndpoint reads the endpoint manifest in dir, the directory of volume's
// disk.img; it returns nil when dir holds none (the volume's disks are
// files beside disk.img). A manifest that cannot be read or is malformed is
// an error: QEMU would boot the empty placeholder otherwise.
func findEndpoint(root, dir, volume string) (*endpointDir, error) {
	file := path.Join(dir, endpoint.ManifestName)
	f, err := os.Open(filepath.Join(root, filepath.FromSlash(file)))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("volume %s: the endpoint manifest %s: %v: %w", volume, file, unwrapPath(err), kubevirt.ErrInvalid)
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, maxManifest+1))
	if err != nil {
		return nil, fmt.Errorf("volume %s: the endpoint manifest %s: %v: %w", volume, file, unwrapPath(err), kubevirt.ErrInvalid)
	}
	var m endpoint.Manifest
	if len(b) > maxManifest {
		return nil, fmt.Errorf("volume %s: the endpoint manifest %s is larger than %d bytes: %w", volume, file, maxManifest, kubevirt.ErrInvalid)
	}
	if err := json.Unmarshal(b, &m); err != nil {
		return nil, fmt.Errorf("volume %s: the endpoint manifest %s: %v: %w", volume, file, err, kubevirt.ErrInvalid)
	}
	// The socket is a file of the directory: a name read from the
	// manifest never leads QEMU elsewhere.
	if m.Socket == "" || m.Socket == "." || m.Socket == ".." || path.Base(m.Socket) != m.Socket {
		return nil, fmt.Errorf("volume %s: the endpoint manifest %s names socket %q, not a file name: %w", volume, file, m.Socket, kubevirt.ErrInvalid)
	}
	ep := &endpointDir{volume: volume, manifest: file, socket: path.Join(dir, m.Socket), disks: map[string]bool{}}
	for _, d := range m.Disks {
		ep.disks[d.Name] = true
	}
	if !ep.disks[kubevirt.PrimaryDisk] {
		return nil, fmt.Errorf("volume %s: the endpoint manifest %s lists no disk %q, the disk KubeVirt boots (disk.img is only a placeholder): %w",
			volume, file, kubevirt.PrimaryDisk, kubevirt.ErrMissingDisk)
	}
	if len(ep.socket) > maxSocketPath {
		return nil, fmt.Errorf("volume %s: the endpoint socket %s is %d bytes long, and a unix socket path has at most %d (108 with its NUL); give the VMI volume a shorter name: %w",
			volume, ep.socket, len(ep.socket), maxSocketPath, kubevirt.ErrInvalid)
	}
	return ep, nil
}

// check says whether the endpoint serves disk.
func (ep *endpointDir) check(disk string) error {
	if !ep.disks[disk] {
		return fmt.Errorf("volume %s has no disk %s: the endpoint manifest %s does not list it: %w",
			ep.volume, disk, ep.manifest, kubevirt.ErrMissingDisk)
	}
	return nil
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
