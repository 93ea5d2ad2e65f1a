package metrics

import (
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

// VolumeIO is what a volume's data path has done since its series
// appeared on this node: the counters of quiver_volume_requests_total and
// quiver_volume_bytes_total for reads and writes, all its disks together.
// Two readings a second apart give its IOPS and bytes per second.
type VolumeIO struct {
	ReadOps, ReadBytes, WriteOps, WriteBytes int64
}

// ioSeries are the volume's resolved read and write counters, kept by
// resolve so that VolumeIO reads them without making series.
type ioSeries struct {
	readOps, readBytes, writeOps, writeBytes prometheus.Counter
}

// VolumeIO returns volume's counters; all zero when no request went
// through its exports on this node (or since it was deleted).
func (m *Metrics) VolumeIO(volume string) VolumeIO {
	v, ok := m.io.Load(volume)
	if !ok {
		return VolumeIO{}
	}
	s := v.(*ioSeries)
	return VolumeIO{ReadOps: value(s.readOps), ReadBytes: value(s.readBytes),
		WriteOps: value(s.writeOps), WriteBytes: value(s.writeBytes)}
}

// value reads a counter's current value.
func value(c prometheus.Counter) int64 {
	var d dto.Metric
	if err := c.Write(&d); err != nil || d.Counter == nil {
		return 0
	}
	return int64(d.Counter.GetValue())
}
