package nbd

import (
	"context"
	"fmt"
	"strings"

	"github.com/quiverstorage/quiver/internal/metrics"
	"github.com/quiverstorage/quiver/internal/pool"
)

// ExportInfo describes one export for NBD_OPT_LIST.
type ExportInfo struct {
	Name        string
	Description string
}

// Exports resolves export names to disks. It is the server's only view of
// the storage.
type Exports interface {
	// List returns every export, for NBD_OPT_LIST.
	List(ctx context.Context) ([]ExportInfo, error)
	// Open returns a handle on the named export and its description. The
	// caller closes the handle.
	Open(ctx context.Context, name string) (pool.Disk, string, error)
}

// PoolExports serves every disk of every volume of a pool:
//
//	<volume>/<disk>               read-write
//	<volume>@<snapshot>/<disk>    read-only
//
// Every live disk is opened through Metrics (when set), which counts and
// times its requests and applies the volume's QoS limiter.
type PoolExports struct {
	Pool    *pool.Pool
	Metrics *metrics.Metrics
}

var _ Exports = PoolExports{}

// ExportName returns the export name of a disk, or of a snapshot's disk
// when snapshot is not empty.
func ExportName(volume, snapshot, disk string) string {
	if snapshot != "" {
		return volume + "@" + snapshot + "/" + disk
	}
	return volume + "/" + disk
}

// ParseExportName splits an export name. Each part is validated by the pool
// when the export is opened.
func ParseExportName(name string) (volume, snapshot, disk string, err error) {
	left, disk, ok := strings.Cut(name, "/")
	if !ok || left == "" || disk == "" {
		return "", "", "", fmt.Errorf("export %q: want <volume>/<disk> or <volume>@<snapshot>/<disk>", name)
	}
	volume, snapshot, hasSnap := strings.Cut(left, "@")
	if hasSnap && snapshot == "" {
		return "", "", "", fmt.Errorf("export %q: empty snapshot name", name)
	}
	return volume, snapshot, disk, nil
}

// List implements Exports.
func (e PoolExports) List(ctx context.Context) ([]ExportInfo, error) {
	var out []ExportInfo
	for _, v := range e.Pool.List(nil) {
		for _, d := range v.Disks {
			out = append(out, ExportInfo{Name: ExportName(v.Name, "", d.Name),
				Description: fmt.Sprintf("disk %s of volume %s (%d bytes)", d.Name, v.Name, d.Size)})
		}
		vol, err := e.Pool.Volume(v.Name)
		if err != nil {
			continue // deleted meanwhile
		}
		for _, s := range vol.Snapshots() {
			for _, d := range s.Disks {
				out = append(out, ExportInfo{Name: ExportName(v.Name, s.Name, d.Name),
					Description: fmt.Sprintf("disk %s of snapshot %s of volume %s, read-only (%d bytes)", d.Name, s.Name, v.Name, d.Size)})
			}
		}
	}
	return out, nil
}

// Open implements Exports.
func (e PoolExports) Open(ctx context.Context, name string) (pool.Disk, string, error) {
	volume, snapshot, disk, err := ParseExportName(name)
	if err != nil {
		return nil, "", fmt.Errorf("%w: %v", pool.ErrInvalid, err)
	}
	v, err := e.Pool.Volume(volume)
	if err != nil {
		return nil, "", err
	}
	if snapshot != "" {
		d, err := v.OpenSnapshotDisk(snapshot, disk)
		return d, fmt.Sprintf("disk %s of snapshot %s of volume %s, read-only", disk, snapshot, volume), err
	}
	d, err := v.OpenDisk(disk)
	if err != nil {
		return nil, "", err
	}
	desc := fmt.Sprintf("disk %s of volume %s", disk, volume)
	if e.Metrics != nil {
		return e.Metrics.Wrap(d, volume, disk, v.QoS()), desc, nil
	}
	return d, desc, nil
}
