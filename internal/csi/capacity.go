package csi

import (
	"fmt"

	"github.com/container-storage-interface/spec/lib/go/csi"

	"github.com/quiverstorage/quiver/internal/quantity"
)

const (
	// sectorSize is the unit of quiver sizes.
	sectorSize = 512
	// DefaultCapacity is a new volume's capacity when the CO asks for none
	// and the disks need less.
	DefaultCapacity = int64(1) << 30
	// maxCapacity is the largest capacity quiver accepts (8 PiB).
	maxCapacity = int64(1) << 53
)

// capacityFor picks a volume's capacity from the CO's range and what the
// disks need: the required bytes rounded up to 512, at least need, and not
// above the limit. With no range it is DefaultCapacity or need, whichever is
// larger.
func capacityFor(r *csi.CapacityRange, need int64) (int64, error) {
	required, limit := r.GetRequiredBytes(), r.GetLimitBytes()
	if required < 0 || limit < 0 {
		return 0, fmt.Errorf("capacity_range: required_bytes %d and limit_bytes %d must not be negative: %w", required, limit, ErrInvalid)
	}
	if limit > 0 && required > limit {
		return 0, fmt.Errorf("capacity_range: required_bytes %d is above limit_bytes %d: %w", required, limit, ErrInvalid)
	}
	if required > maxCapacity {
		return 0, fmt.Errorf("capacity_range: required_bytes %d is above quiver's largest volume, 8Pi: %w", required, ErrOutOfRange)
	}
	c := roundUp(required)
	if c == 0 {
		c = DefaultCapacity
		if limit > 0 && c > limit {
			c = limit / sectorSize * sectorSize
		}
	}
	c = max(c, need)
	switch {
	case c == 0:
		return 0, fmt.Errorf("capacity_range: limit_bytes %d is below the smallest volume, %d bytes: %w", limit, sectorSize, ErrOutOfRange)
	case limit > 0 && c > limit:
		return 0, fmt.Errorf("capacity_range: the volume needs %s (%d bytes, the sum of its disks rounded to 512), above limit_bytes %d: %w",
			quantity.Format(c), c, limit, ErrOutOfRange)
	case c > maxCapacity:
		return 0, fmt.Errorf("capacity_range: %d bytes is above quiver's largest volume, 8Pi: %w", c, ErrOutOfRange)
	}
	return c, nil
}

// roundUp rounds n up to a multiple of 512.
func roundUp(n int64) int64 {
	if n%sectorSize == 0 {
		return n
	}
	return (n/sectorSize + 1) * sectorSize
}
