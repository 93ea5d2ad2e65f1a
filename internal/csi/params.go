package csi

import (
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"

	"github.com/quiverstorage/quiver/internal/api"
	"github.com/quiverstorage/quiver/internal/quantity"
	"k8s.io/apimachinery/pkg/util/validation"
)

// StorageClass parameters (CreateVolumeRequest.parameters). docs/csi.md
// describes each.
const (
	ParamDisks        = "disks"
	ParamReplication  = "replication"
	ParamEncrypted    = "encrypted"
	ParamQoSRWIOPS    = "qos_rw_iops"
	ParamQoSRWMBytes  = "qos_rw_mbytes"
	ParamQoSReadIOPS  = "qos_read_iops"
	ParamQoSWriteIOPS = "qos_write_iops"
	ParamQoSReadMB    = "qos_read_mbytes"
	ParamQoSWriteMB   = "qos_write_mbytes"

	// reservedPrefix starts the keys the Kubernetes sidecars add
	// (external-provisioner's --extra-create-metadata: the PVC's name and
	// namespace, the PV's name).
	reservedPrefix = "csi.storage.k8s.io/"
	paramPVCName   = reservedPrefix + "pvc/name"
	paramPVCNS     = reservedPrefix + "pvc/namespace"
)

// Labels the PVC's identity is copied into, when the provisioner passes it.
const (
	LabelPVCName      = "quiver.io/pvc-name"
	LabelPVCNamespace = "quiver.io/pvc-namespace"
)

// DefaultDisk is the disk a volume holds when the StorageClass names none:
// it fills the volume, and Filesystem mode shows it as disk.img, the file
// KubeVirt boots from a filesystem PVC.
const DefaultDisk = "disk"

// MaxReplication bounds the replication parameter.
const MaxReplication = 9

// qosParams maps each QoS parameter to the field of api.QoS it sets.
var qosParams = map[string]func(*api.QoS) *int64{
	ParamQoSRWIOPS:    func(q *api.QoS) *int64 { return &q.RWIOPS },
	ParamQoSRWMBytes:  func(q *api.QoS) *int64 { return &q.RWMBytes },
	ParamQoSReadIOPS:  func(q *api.QoS) *int64 { return &q.ReadIOPS },
	ParamQoSWriteIOPS: func(q *api.QoS) *int64 { return &q.WriteIOPS },
	ParamQoSReadMB:    func(q *api.QoS) *int64 { return &q.ReadMBytes },
	ParamQoSWriteMB:   func(q *api.QoS) *int64 { return &q.WriteMBytes },
}

// volumeParams is a parsed parameter map.
type volumeParams struct {
	// Disks is the layout asked for; nil means one DefaultDisk that fills
	// the volume.
	Disks []api.DiskSpec
	// QoS is nil when no QoS parameter is set.
	QoS *api.QoS
	// Replication is 0 when not set.
	Replication int
	// Labels are the labels the parameters add (replication, PVC identity).
	Labels map[string]string
	// Encrypted is nil when not set, else whether the volume is encrypted
	// (docs/encryption.md).
	Encrypted *bool
}

// parseParams parses CreateVolume parameters. An unknown key is
// InvalidArgument naming it; so is a value that breaks its rule.
func parseParams(params map[string]string) (volumeParams, error) {
	var p volumeParams
	p.Labels = map[string]string{}
	for _, key := range slices.Sorted(maps.Keys(params)) {
		value := params[key]
		switch {
		case key == ParamDisks:
			disks, err := parseDiskList(value)
			if err != nil {
				return p, fmt.Errorf("parameter %s=%q: %w", key, value, err)
			}
			p.Disks = disks
		case key == ParamReplication:
			n, err := strconv.Atoi(value)
			if err != nil || n < 1 || n > MaxReplication {
				return p, fmt.Errorf("parameter %s=%q: want a whole number from 1 to %d: %w", key, value, MaxReplication, ErrInvalid)
			}
			p.Replication = n
			p.Labels[LabelReplication] = strconv.Itoa(n)
		case key == ParamEncrypted:
			b, err := strconv.ParseBool(value)
			if err != nil {
				return p, fmt.Errorf("parameter %s=%q: want \"true\" or \"false\": %w", key, value, ErrInvalid)
			}
			p.Encrypted = &b
		case qosParams[key] != nil:
			n, err := strconv.ParseInt(value, 10, 64)
			if err != nil || n < 0 {
				return p, fmt.Errorf("parameter %s=%q: want a whole number, 0 or more (0: unlimited): %w", key, value, ErrInvalid)
			}
			if p.QoS == nil {
				p.QoS = &api.QoS{}
			}
			*qosParams[key](p.QoS) = n
		case key == paramPVCName:
			setLabelIfValid(p.Labels, LabelPVCName, value)
		case key == paramPVCNS:
			setLabelIfValid(p.Labels, LabelPVCNamespace, value)
		case strings.HasPrefix(key, reservedPrefix):
			// Other metadata of the Kubernetes sidecars: not ours to use.
		default:
			return p, fmt.Errorf("unknown parameter %q (known: %s): %w", key, strings.Join(knownParams(), ", "), ErrInvalid)
		}
	}
	return p, nil
}

func knownParams() []string {
	known := []string{ParamDisks, ParamEncrypted, ParamReplication}
	known = append(known, slices.Sorted(maps.Keys(qosParams))...)
	return known
}

// parseDiskList parses "root=40Gi,data=100Gi": disk names are DNS labels,
// sizes Kubernetes quantities, whole multiples of 512 bytes.
func parseDiskList(s string) ([]api.DiskSpec, error) {
	var disks []api.DiskSpec
	seen := map[string]bool{}
	for item := range strings.SplitSeq(s, ",") {
		item = strings.TrimSpace(item)
		name, size, ok := strings.Cut(item, "=")
		if !ok || name == "" || size == "" {
			return nil, fmt.Errorf("disk %q: want NAME=SIZE, e.g. root=40Gi: %w", item, ErrInvalid)
		}
		if !isDNSLabel(name) {
			return nil, fmt.Errorf("disk name %q: must be a DNS label (lower-case letters, digits and '-', at most 63): %w", name, ErrInvalid)
		}
		if seen[name] {
			return nil, fmt.Errorf("disk name %q: given twice: %w", name, ErrInvalid)
		}
		seen[name] = true
		n, err := quantity.Parse(size)
		if err != nil {
			return nil, fmt.Errorf("disk %s: %v: %w", name, err, ErrInvalid)
		}
		if n <= 0 || n%sectorSize != 0 {
			return nil, fmt.Errorf("disk %s: size %s must be greater than zero and a multiple of 512 bytes: %w", name, size, ErrInvalid)
		}
		disks = append(disks, api.DiskSpec{Name: name, Size: n})
	}
	return disks, nil
}

func setLabelIfValid(labels map[string]string, key, value string) {
	if value != "" && len(validation.IsValidLabelValue(value)) == 0 {
		labels[key] = value
	}
}

// sumSizes adds disk sizes.
func sumSizes(disks []api.DiskSpec) int64 {
	var total int64
	for _, d := range disks {
		total += d.Size
	}
	return total
}

// sumDiskSizes adds the sizes of a volume's or snapshot's disks.
func sumDiskSizes(disks []api.Disk) int64 {
	var total int64
	for _, d := range disks {
		total += d.Size
	}
	return total
}

// CheckParameters checks StorageClass parameters as CreateVolume would:
// an unknown key or a bad value is an error naming it.
func CheckParameters(params map[string]string) error {
	_, err := parseParams(params)
	return err
}
