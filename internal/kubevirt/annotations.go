package kubevirt

import (
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"

	"k8s.io/apimachinery/pkg/util/validation"
)

// Annotation keys, set on a VirtualMachine's template (so KubeVirt copies
// them to the VMI) by the webhook or by hand. docs/kubevirt.md describes
// them.
const (
	// AnnotationExtraDisks names the extra disks per KubeVirt volume, as a
	// JSON object: {"rootdisk":["data","logs"]}. Each disk <d> is the file
	// <d>.img beside the volume's disk.img.
	AnnotationExtraDisks = "quiver.io/extra-disks"
	// AnnotationDiskBus is the bus of every extra disk: virtio (default)
	// or sata.
	AnnotationDiskBus = "quiver.io/extra-disk-bus"
	// AnnotationReconnectDelay is how long, in whole seconds, QEMU holds a
	// disk's requests while it reconnects to the compute node's NBD
	// endpoint (default DefaultReconnectDelay). It must be longer than a
	// failover of the volume's primary (docs/cluster.md, "QEMU guests
	// through a failover").
	AnnotationReconnectDelay = "quiver.io/reconnect-delay"
	// AnnotationBlockDisks lays out, per Block-mode KubeVirt volume, the
	// quiver volume's disks in the one block device the PVC is (the
	// compute node's endpoint serves disk i at i*endpoint.SlotSize), as a
	// JSON object of ordered disks with their sizes:
	// {"rootdisk":[{"name":"disk","size":10737418240},{"name":"data","size":1073741824}]}.
	// The hook gives QEMU each disk as a slice of the device.
	AnnotationBlockDisks = "quiver.io/block-disks"
	// AnnotationEndpointDisks names, per Filesystem-mode KubeVirt volume
	// served by the compute node's endpoint, every disk of the quiver
	// volume in order, PrimaryDisk among them, as a JSON object:
	// {"rootdisk":["disk","data"]}. The PVC's directory then holds the
	// endpoint's socket (endpoint.SocketName) and an empty placeholder
	// disk.img; the hook gives QEMU each disk as the socket's NBD export of
	// that name and never the placeholder. The webhook sets it for a volume
	// kept by a cluster, the only kind the CSI node plugin stages at the
	// endpoint in Filesystem mode.
	AnnotationEndpointDisks = "quiver.io/endpoint-disks"
	// AnnotationHookSidecars is KubeVirt's own key for the list of hook
	// sidecars of a VMI.
	AnnotationHookSidecars = "hooks.kubevirt.io/hookSidecars"
)

// Buses the extra disks may use.
const (
	BusVirtio = "virtio"
	BusSATA   = "sata"
)

// DefaultReconnectDelay is QEMU's reconnect-delay, in seconds, for disks
// served by the compute node's endpoint: twice the 30 s docs/cluster.md
// asks for with the default lease, so a failover with an etcd election
// fits too.
const DefaultReconnectDelay = 60

// MaxReconnectDelay bounds AnnotationReconnectDelay: an hour of held
// requests is already far past any guest's I/O timeout.
const MaxReconnectDelay = 3600

// PrimaryDisk is the disk KubeVirt boots from a Filesystem PVC: disk.img.
const PrimaryDisk = "disk"

// MaxSerial is the longest serial a virtio-blk disk carries whole (the
// VIRTIO_BLK_ID_BYTES of the virtio spec); a disk name is its serial.
const MaxSerial = 20

// ExtraDisks maps a KubeVirt volume name to the names of its extra disks, in
// the order they are added to the domain.
type ExtraDisks map[string][]string

// ParseExtraDisks decodes and checks the AnnotationExtraDisks value: every
// disk name is a DNS label of at most MaxSerial bytes, is not the primary
// disk, and appears once in the whole annotation (it becomes the disk's
// serial, which must be unique in the guest).
func ParseExtraDisks(value string) (ExtraDisks, error) {
	return parseDiskLists(AnnotationExtraDisks, value, false)
}

// EndpointDisks maps a KubeVirt volume name to every disk of its quiver
// volume, PrimaryDisk included, served by the compute node's endpoint
// (AnnotationEndpointDisks).
type EndpointDisks map[string][]string

// ParseEndpointDisks decodes and checks an AnnotationEndpointDisks value:
// each volume lists PrimaryDisk once and at most maxBlockDisks disks, every
// other name passes CheckDiskName, and no name appears twice in the whole
// annotation (the primary's aside: each volume's is the disk KubeVirt made).
func ParseEndpointDisks(value string) (EndpointDisks, error) {
	lists, err := parseDiskLists(AnnotationEndpointDisks, value, true)
	if err != nil {
		return nil, err
	}
	for _, vol := range slices.Sorted(maps.Keys(lists)) {
		if n := len(lists[vol]); n > maxBlockDisks {
			return nil, fmt.Errorf("annotation %s, volume %s: %d disks, want at most %d: %w", AnnotationEndpointDisks, vol, n, maxBlockDisks, ErrInvalid)
		}
		if !slices.Contains(lists[vol], PrimaryDisk) {
			return nil, fmt.Errorf("annotation %s, volume %s: lists no disk %q, the disk KubeVirt boots (disk.img is only the endpoint's placeholder): %w",
				AnnotationEndpointDisks, vol, PrimaryDisk, ErrMissingDisk)
		}
	}
	return EndpointDisks(lists), nil
}

// Format encodes e as an AnnotationEndpointDisks value (keys sorted).
func (e EndpointDisks) Format() string { return ExtraDisks(e).Format() }

// parseDiskLists decodes an annotation of volume name to disk names and
// checks the names: DNS labels (volumes) and CheckDiskName (disks), each
// disk once in the whole annotation. withPrimary admits PrimaryDisk once
// per volume.
func parseDiskLists(key, value string, withPrimary bool) (ExtraDisks, error) {
	var lists ExtraDisks
	dec := json.NewDecoder(strings.NewReader(value))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&lists); err != nil {
		return nil, fmt.Errorf("annotation %s: want a JSON object of volume name to disk names, e.g. {\"rootdisk\":[\"data\"]}: %v: %w",
			key, err, ErrInvalid)
	}
	seen := map[string]string{}
	for _, vol := range slices.Sorted(maps.Keys(lists)) {
		if len(validation.IsDNS1123Label(vol)) != 0 {
			return nil, fmt.Errorf("annotation %s: volume name %q: must be a DNS label: %w", key, vol, ErrInvalid)
		}
		primaries := 0
		for _, d := range lists[vol] {
			if withPrimary && d == PrimaryDisk {
				if primaries++; primaries > 1 {
					return nil, fmt.Errorf("annotation %s, volume %s: disk %q listed twice: %w", key, vol, d, ErrDuplicate)
				}
				continue
			}
			if err := CheckDiskName(d); err != nil {
				return nil, fmt.Errorf("annotation %s, volume %s: %w", key, vol, err)
			}
			if other, dup := seen[d]; dup {
				return nil, fmt.Errorf("annotation %s: disk %q named for volume %s and for volume %s (a disk's name is its serial, unique in the guest): %w",
					key, d, other, vol, ErrDuplicate)
			}
			seen[d] = vol
		}
	}
	return lists, nil
}

// CheckDiskName checks one extra disk's name.
func CheckDiskName(d string) error {
	switch {
	case len(validation.IsDNS1123Label(d)) != 0:
		return fmt.Errorf("disk name %q: must be a DNS label (lower-case letters, digits and '-'): %w", d, ErrInvalid)
	case len(d) > MaxSerial:
		return fmt.Errorf("disk name %q: longer than %d bytes, the longest serial a virtio disk carries whole: %w", d, MaxSerial, ErrInvalid)
	case d == PrimaryDisk:
		return fmt.Errorf("disk name %q: is the disk KubeVirt itself boots (disk.img), not an extra disk: %w", d, ErrDuplicate)
	}
	return nil
}

// Format encodes e as an AnnotationExtraDisks value (keys sorted).
func (e ExtraDisks) Format() string {
	b, err := json.Marshal(map[string][]string(e))
	if err != nil {
		panic(err) // a map of strings always encodes
	}
	return string(b)
}

// ParseBus checks an AnnotationDiskBus value; "" is virtio.
func ParseBus(value string) (string, error) {
	switch value {
	case "", BusVirtio:
		return BusVirtio, nil
	case BusSATA:
		return BusSATA, nil
	}
	return "", fmt.Errorf("annotation %s=%q: want %s or %s: %w", AnnotationDiskBus, value, BusVirtio, BusSATA, ErrInvalid)
}

// ParseReconnectDelay checks an AnnotationReconnectDelay value; "" is
// DefaultReconnectDelay.
func ParseReconnectDelay(value string) (uint, error) {
	if value == "" {
		return DefaultReconnectDelay, nil
	}
	n, err := strconv.ParseUint(value, 10, 32)
	if err != nil || n < 1 || n > MaxReconnectDelay {
		return 0, fmt.Errorf("annotation %s=%q: want whole seconds from 1 to %d (default %d): %w",
			AnnotationReconnectDelay, value, MaxReconnectDelay, DefaultReconnectDelay, ErrInvalid)
	}
	return uint(n), nil
}

// BlockDisk is one disk of a Block-mode volume's layout, in slot order.
type BlockDisk struct {
	Name string `json:"name"`
	Size int64  `json:"size"`
}

// BlockDisks maps a KubeVirt volume name to its quiver volume's disks, disk
// i in slot i of the PVC's device (AnnotationBlockDisks).
type BlockDisks map[string][]BlockDisk

// maxBlockDisks bounds the disks of one Block-mode volume.
const maxBlockDisks = 256

// ParseBlockDisks decodes and checks an AnnotationBlockDisks value: every
// disk name is a DNS label of at most MaxSerial bytes (it becomes the
// disk's serial), appears once in the whole annotation, and has a positive
// size.
func ParseBlockDisks(value string) (BlockDisks, error) {
	var out BlockDisks
	dec := json.NewDecoder(strings.NewReader(value))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&out); err != nil {
		return nil, fmt.Errorf("annotation %s: want a JSON object of volume name to disks, e.g. {\"rootdisk\":[{\"name\":\"disk\",\"size\":1073741824}]}: %v: %w",
			AnnotationBlockDisks, err, ErrInvalid)
	}
	seen := map[string]string{}
	for _, vol := range slices.Sorted(maps.Keys(out)) {
		if len(validation.IsDNS1123Label(vol)) != 0 {
			return nil, fmt.Errorf("annotation %s: volume name %q: must be a DNS label: %w", AnnotationBlockDisks, vol, ErrInvalid)
		}
		if len(out[vol]) == 0 || len(out[vol]) > maxBlockDisks {
			return nil, fmt.Errorf("annotation %s, volume %s: %d disks, want 1 to %d: %w", AnnotationBlockDisks, vol, len(out[vol]), maxBlockDisks, ErrInvalid)
		}
		for _, d := range out[vol] {
			if len(validation.IsDNS1123Label(d.Name)) != 0 || len(d.Name) > MaxSerial {
				return nil, fmt.Errorf("annotation %s, volume %s: disk name %q: must be a DNS label of at most %d bytes: %w",
					AnnotationBlockDisks, vol, d.Name, MaxSerial, ErrInvalid)
			}
			if d.Size <= 0 {
				return nil, fmt.Errorf("annotation %s, volume %s: disk %s: size %d: %w", AnnotationBlockDisks, vol, d.Name, d.Size, ErrInvalid)
			}
			if other, dup := seen[d.Name]; dup {
				return nil, fmt.Errorf("annotation %s: disk %q named for volume %s and for volume %s (a disk's name is its serial, unique in the guest): %w",
					AnnotationBlockDisks, d.Name, other, vol, ErrDuplicate)
			}
			seen[d.Name] = vol
		}
	}
	return out, nil
}

// Format encodes b as an AnnotationBlockDisks value.
func (b BlockDisks) Format() string {
	out, err := json.Marshal(map[string][]BlockDisk(b))
	if err != nil {
		panic(err) // strings and numbers always encode
	}
	return string(out)
}

// Boot is the index of the disk KubeVirt's domain disk of the volume
// becomes: the disk named PrimaryDisk, else the first.
func Boot(disks []BlockDisk) int {
	return max(slices.IndexFunc(disks, func(d BlockDisk) bool { return d.Name == PrimaryDisk }), 0)
}
