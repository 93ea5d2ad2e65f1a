package interop

import (
	"testing"

	"github.com/quiverstorage/quiver/internal/testserver"

	"github.com/quiverstorage/quiver/internal/api"
	"github.com/quiverstorage/quiver/internal/client"
)

// server is one `quiver server` process on a temporary pool, serving the API
// and NBD on free loopback ports and NBD on a unix socket; t.Cleanup stops it
// with SIGTERM and fails the test unless it exits cleanly, without a data
// race or a panic in its log.
type server struct {
	*testserver.Process
	api *client.Client
}

func startServer(t *testing.T) *server {
	t.Helper()
	p := testserver.StartT(t, quiverBin, testserver.Options{NBDTCP: true, LogLevel: "debug"})
	return &server{Process: p, api: p.API}
}

// createVolume creates a volume with the given disks (name, size pairs in
// order) and a capacity that fits them.
func (s *server) createVolume(t *testing.T, name string, disks ...api.DiskSpec) api.Volume {
	t.Helper()
	var total int64
	for _, d := range disks {
		total += d.Size
	}
	v, err := s.api.CreateVolume(t.Context(), api.VolumeSpec{Name: name, Capacity: total, Disks: disks})
	if err != nil {
		t.Fatalf("create volume %s: %v", name, err)
	}
	return v
}

// snapshot takes a snapshot of a volume through the API.
func (s *server) snapshot(t *testing.T, volume, name string) api.Snapshot {
	t.Helper()
	snap, err := s.api.CreateSnapshot(t.Context(), volume, name)
	if err != nil {
		t.Fatalf("snapshot %s@%s: %v", volume, name, err)
	}
	return snap
}

// diskPath returns the image file of a disk as the API reports it.
func diskPath(t *testing.T, disks []api.Disk, name string) string {
	t.Helper()
	for _, d := range disks {
		if d.Name == name {
			return d.Path
		}
	}
	t.Fatalf("no disk %q in %+v", name, disks)
	return ""
}

func disk(name string, size int64) api.DiskSpec { return api.DiskSpec{Name: name, Size: size} }

const (
	kiB = int64(1) << 10
	miB = int64(1) << 20
	giB = int64(1) << 30
)
