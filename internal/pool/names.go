package pool

import (
	"fmt"
	"math"
	"sort"
	"strings"

	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/quiverstorage/quiver/internal/quantity"
)

// Limits on what one volume may hold.
const (
	// SectorSize is the unit of disk sizes: QEMU and NBD clients address
	// disks in 512-byte sectors.
	SectorSize = 512
	// MaxSize bounds a capacity or disk size (8 PiB): sums of MaxDisks sizes
	// cannot overflow an int64.
	MaxSize = int64(1) << 53
	// MaxDisks bounds the disks of one volume.
	MaxDisks = 256
	// MaxLabels bounds the labels of one volume.
	MaxLabels = 64
	// MaxAttachments bounds the explicit attachments of one volume.
	MaxAttachments = 256
	// MaxImplicitAttachments bounds all attachments of one volume, the
	// implicit ones of tokenless connections included.
	MaxImplicitAttachments = 1024
	// MaxReplicas bounds the copies of one volume (the CSI parameter
	// replication has the same bound).
	MaxReplicas = 9
)

// ValidateNodeName checks the node of an attachment: a DNS subdomain, as
// Kubernetes names nodes.
func ValidateNodeName(node string) error {
	if node == "" {
		return invalid("node", "", "is required")
	}
	if errs := validation.IsDNS1123Subdomain(node); len(errs) > 0 {
		return invalid("node", node, "must be a DNS subdomain (lower-case letters, digits, '-' and '.', at most 253 characters)")
	}
	return nil
}

// ValidateName checks a volume, disk or snapshot name: a DNS label (RFC
// 1123), so it is safe as a path component and as a Kubernetes name.
func ValidateName(field, name string) error {
	if name == "" {
		return invalid(field, "", "is required")
	}
	if errs := validation.IsDNS1123Label(name); len(errs) > 0 {
		return invalid(field, name, "must be a DNS label (lower-case letters, digits and '-', starting and ending with a letter or digit, at most 63 characters)")
	}
	return nil
}

// ValidateSize checks a disk size or capacity in bytes.
func ValidateSize(field string, size int64) error {
	switch {
	case size <= 0:
		return invalid(field, formatSize(size), "must be greater than zero")
	case size > MaxSize:
		return invalid(field, formatSize(size), "must be at most "+formatSize(MaxSize))
	case size%SectorSize != 0:
		return invalid(field, formatSize(size), "must be a multiple of 512 bytes")
	}
	return nil
}

// formatSize renders a size for people in error messages: "40Gi", or
// "1.5Gi (1610612737 bytes)" when the binary unit alone is not exact, so
// that two sizes that differ by a few bytes never read the same.
func formatSize(n int64) string {
	if n < 0 && n != math.MinInt64 { // whose negation overflows
		return "-" + formatSize(-n)
	}
	s := quantity.Format(n)
	if back, err := quantity.Parse(s); err != nil || back != n {
		return fmt.Sprintf("%s (%d bytes)", s, n)
	}
	return s
}

// ValidateLabels checks label keys and values with Kubernetes' rules.
func ValidateLabels(field string, labels map[string]string) error {
	if len(labels) > MaxLabels {
		return invalid(field, "", fmt.Sprintf("at most %d labels", MaxLabels))
	}
	keys := make([]string, 0, len(labels))
	for k := range labels {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		if errs := validation.IsQualifiedName(k); len(errs) > 0 {
			return invalid(field+" key", k, strings.Join(errs, "; "))
		}
		if errs := validation.IsValidLabelValue(labels[k]); len(errs) > 0 {
			return invalid(field+"["+k+"]", labels[k], strings.Join(errs, "; "))
		}
	}
	return nil
}

// ValidateDisks checks a disk list against a capacity: valid unique names,
// valid sizes, at most MaxDisks, and a total that fits.
func ValidateDisks(disks []DiskSpec, capacity int64) error {
	if len(disks) > MaxDisks {
		return invalid("disks", "", fmt.Sprintf("at most %d disks per volume", MaxDisks))
	}
	seen := make(map[string]bool, len(disks))
	var total int64
	for i, d := range disks {
		f := fmt.Sprintf("disks[%d]", i)
		if err := ValidateName(f+".name", d.Name); err != nil {
			return err
		}
		if seen[d.Name] {
			return invalid(f+".name", d.Name, "duplicate disk name")
		}
		seen[d.Name] = true
		if err := ValidateSize(f+".size", d.Size); err != nil {
			return err
		}
		total += d.Size
	}
	if total > capacity {
		return fmt.Errorf("disks total %s, capacity is %s: %w", formatSize(total), formatSize(capacity), ErrCapacity)
	}
	return nil
}

// ValidateSpec checks a whole volume spec.
func ValidateSpec(s VolumeSpec) error {
	if err := ValidateName("name", s.Name); err != nil {
		return err
	}
	if err := ValidateSize("capacity", s.Capacity); err != nil {
		return err
	}
	if err := ValidateLabels("labels", s.Labels); err != nil {
		return err
	}
	if err := s.QoS.Validate(); err != nil {
		return invalid("qos", "", err.Error())
	}
	if s.Fill != "" {
		if err := ValidateFillSource(s.Fill); err != nil {
			return err
		}
	}
	if s.KeyFrom != nil && !s.Encrypt {
		return invalid("keyFrom", s.KeyFrom.KeyID, "a data key is given to an encrypted volume only")
	}
	if s.KeyFrom != nil {
		if err := validateWrapped("keyFrom", s.KeyFrom); err != nil {
			return err
		}
		if len(s.KeyUID) > 64 {
			return invalid("keyUID", s.KeyUID, "must be at most 64 bytes")
		}
	}
	if s.Encrypt {
		if s.Fill != "" && s.KeyFrom == nil { // only a source of its own ciphertext (an encrypted backup)
			return invalid("fill", s.Fill, "a new encrypted volume cannot fill from a source in the clear")
		}
		for i, d := range s.Disks {
			if err := checkEncryptedSize(fmt.Sprintf("disks[%d].size", i), d.Size); err != nil {
				return err
			}
		}
	}
	if s.Replicas < 0 || s.Replicas > MaxReplicas {
		return invalid("replicas", "", fmt.Sprintf("replicas %d: must be from 1 to %d (0 means 1)", s.Replicas, MaxReplicas))
	}
	if err := ValidateVolumeTenant(s.Name, s.Tenant); err != nil {
		return err
	}
	return ValidateDisks(s.Disks, s.Capacity)
}
