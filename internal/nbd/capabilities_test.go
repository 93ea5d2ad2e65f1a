package nbd

import (
	"context"
	"testing"

	"github.com/quiverstorage/quiver/internal/metrics"
	"github.com/quiverstorage/quiver/internal/pool"
)

// TestPoolExportCapabilities: a live disk of the pool, counted by metrics
// or not, offers the server what its hot path uses (trying requests
// without waiting, in batches, and sendfile), the counted one also its
// sparse reads; a snapshot's disk offers none, counted only its sparse
// reads (each counted as one read, metrics.Disk.ReadData).
func TestPoolExportCapabilities(t *testing.T) {
	e := newEnv(t, Config{}, nil)
	type offer struct{ nonblocking, batcher, sender, dataReader bool }
	for _, tc := range []struct {
		name    string
		metrics bool
		export  string
		want    offer
	}{
		{"live", false, exportRoot, offer{true, true, true, false}},
		{"live counted", true, exportRoot, offer{true, true, true, true}},
		{"snapshot", false, exportSnap, offer{}},
		{"snapshot counted", true, exportSnap, offer{dataReader: true}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			x := PoolExports{Pool: e.pool}
			if tc.metrics {
				x.Metrics = metrics.New(e.pool)
			}
			ex, err := x.Open(context.Background(), tc.export, "test")
			if err != nil {
				t.Fatal(err)
			}
			defer ex.Disk.Close()
			c := pool.CapabilitiesOf(ex.Disk)
			if got := (offer{c.Nonblocking != nil, c.Batcher != nil, c.Sender != nil, c.DataReader != nil}); got != tc.want {
				t.Fatalf("%T offers %+v, want %+v", ex.Disk, got, tc.want)
			}
		})
	}
}
