package qosbench

import (
	"testing"
	"time"

	"github.com/quiverstorage/quiver/internal/testserver"

	"github.com/quiverstorage/quiver/internal/api"
	"github.com/quiverstorage/quiver/internal/client"
)

// server is one `quiver server` process on a temporary pool, serving the API
// on a free loopback port and NBD on a unix socket only, with the flags of
// args (e.g. --metrics-per-disk); t.Cleanup stops it
// with SIGTERM and fails the test unless it exits cleanly, without a data
// race or a panic in its log.
type server struct {
	*testserver.Process
	api    *client.Client
	apiURL string
	socket string
}

func startServer(t *testing.T, args ...string) *server {
	t.Helper()
	p := testserver.StartT(t, quiverBin, testserver.Options{Args: args})
	return &server{Process: p, api: p.API, apiURL: "http://" + p.APIAddr, socket: p.Socket}
}

// createVolume creates a volume of the given disks, with limits q (nil:
// unlimited) and a capacity that fits the disks.
func (s *server) createVolume(t *testing.T, name string, q *api.QoS, disks ...api.DiskSpec) api.Volume {
	t.Helper()
	var total int64
	for _, d := range disks {
		total += d.Size
	}
	v, err := s.api.CreateVolume(t.Context(), api.VolumeSpec{Name: name, Capacity: total, Disks: disks, QoS: q})
	if err != nil {
		t.Fatalf("create volume %s: %v", name, err)
	}
	return v
}

// setQoS replaces a volume's limits and returns when the server answered.
func (s *server) setQoS(t *testing.T, volume string, q api.QoS) time.Time {
	t.Helper()
	if _, err := s.api.UpdateVolume(t.Context(), volume, api.VolumeUpdate{QoS: &q}); err != nil {
		t.Fatalf("set qos of %s: %v", volume, err)
	}
	return time.Now()
}

// scrape reads /metrics.
func (s *server) scrape(t *testing.T) client.Metrics {
	t.Helper()
	m, err := s.api.Metrics(t.Context())
	if err != nil {
		t.Fatalf("scrape: %v", err)
	}
	return m
}

// uri is the NBD URI of a disk over the unix socket.
func (s *server) uri(volume, disk string) string {
	return "nbd+unix:///" + volume + "/" + disk + "?socket=" + s.socket
}

func disk(name string, size int64) api.DiskSpec { return api.DiskSpec{Name: name, Size: size} }

const (
	kiB = int64(1) << 10
	miB = int64(1) << 20
)
